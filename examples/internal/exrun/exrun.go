// Package exrun is what the example programs share that is not what they
// show: the command line (-role, -d, -addr), both roles in one process,
// and main's signal handling and exit status. Each example keeps its
// server and client, the part worth reading, in its own main.go.
package exrun

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
)

// Example is one example program.
type Example struct {
	// Name is the program's name, in its flag usage and error messages.
	Name string
	// Addr is -addr's default and AddrUsage its usage text.
	Addr, AddrUsage string
	// Server listens on addr (ADDR in "server: listening on ADDR ..." is
	// the address it got, which the tests and -role both read), sends
	// that address on ready if ready is not nil, and serves until it is
	// done or ctx ends. dev is its RDMA device.
	Server Server
	// Client connects to the server at addr from device dev and does its
	// part.
	Client Client
	// ServerEnds: the server returns by itself once the client is done
	// (its last message says so). Otherwise -role both stops the server
	// when the client returns.
	ServerEnds bool
}

// Server and Client are an example's two roles (see Example).
type (
	Server = func(ctx context.Context, dev, addr string, out io.Writer, ready chan<- string) error
	Client = func(ctx context.Context, dev, addr string, out io.Writer) error
)

// Verbs is an example on raw verbs: the peers exchange their QPs'
// addresses over a TCP connection to the server's -addr, and the server
// ends after the client's last message.
func Verbs(name string, server Server, client Client) *Example {
	return &Example{Name: name, Addr: "10.99.0.2:18515",
		AddrUsage: "the server's TCP `address`: where it listens, where the client connects",
		Server:    server, Client: client, ServerEnds: true}
}

// BX is an example on ByteExpress: -addr is the server's bx address (its
// TCP control plane), and the server serves until it is stopped.
func BX(name string, server Server, client Client) *Example {
	return &Example{Name: name, Addr: "10.99.0.2:7000",
		AddrUsage: "the server's bx `address` (TCP control plane): where it listens, where the client dials",
		Server:    server, Client: client}
}

// Main runs x as the program: SIGINT or SIGTERM cancel its context, an
// error is printed and exits with status 1.
func (x *Example) Main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := x.Run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "%s: %v\n", x.Name, err)
		os.Exit(1)
	}
}

// Run parses args and runs the role they name, writing to stdout.
func (x *Example) Run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet(x.Name, flag.ContinueOnError)
	fs.SetOutput(stdout)
	role := fs.String("role", "both", "server, client, or both (in one process)")
	devs := fs.String("d", "", "RDMA `device` (default rxe1 for the server, rxe0 for the client; with -role both: SERVER,CLIENT)")
	addr := fs.String("addr", x.Addr, x.AddrUsage)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	srvDev, cliDev, err := Devices(*role, *devs)
	if err != nil {
		return err
	}
	out := &syncWriter{w: stdout}
	switch *role {
	case "server":
		return x.Server(ctx, srvDev, *addr, out, nil)
	case "client":
		return x.Client(ctx, cliDev, *addr, out)
	}
	// Both: the server in a goroutine; the client connects to the address
	// it listens on.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- x.Server(ctx, srvDev, *addr, out, ready) }()
	select {
	case a := <-ready:
		err := x.Client(ctx, cliDev, a, out)
		if err != nil || !x.ServerEnds {
			cancel() // stops the server (which would wait for the client's last message forever)
		}
		return errors.Join(err, <-done)
	case err := <-done:
		return err
	}
}

// Devices returns the server's and the client's device for -role and -d.
func Devices(role, d string) (srv, cli string, err error) {
	srv, cli = "rxe1", "rxe0"
	switch role {
	case "server":
		if d != "" {
			srv = d
		}
	case "client":
		if d != "" {
			cli = d
		}
	case "both":
		if d != "" {
			var ok bool
			if srv, cli, ok = strings.Cut(d, ","); !ok {
				return "", "", fmt.Errorf("-role both: -d wants SERVER,CLIENT, have %q", d)
			}
		}
	default:
		return "", "", fmt.Errorf("-role %q: want server, client or both", role)
	}
	return srv, cli, nil
}

// syncWriter serializes the server's and the client's writes to one
// output (with -role both they run at once).
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
