// Bxrpc shows ByteExpress RPC (package bx): the server's endpoint
// registers a handler for a stream id (Handle) and listens; the client's
// endpoint dials it (Dial) and calls (Call). Requests and responses travel
// as messages over RC queue pairs; the TCP connection is only the control
// plane (setup, authenticated by the shared token). A handler's error
// reaches the caller as a *bx.RemoteError.
//
// In the rxe guest (docs/vm.md), both roles in one process (the server on
// rxe1 at 10.99.0.2, the client on rxe0):
//
//	scripts/vm -- go run ./examples/bxrpc
//
// As two processes (the server runs until interrupted):
//
//	scripts/vm -- sh -c 'go build -o /tmp/bxrpc ./examples/bxrpc &&
//		{ /tmp/bxrpc -role server & sleep 2; /tmp/bxrpc -role client; kill $!; wait; }'
//
// Between two machines: `bxrpc -role server -d DEV -addr IP:7000` on one,
// `bxrpc -role client -d DEV -addr IP:7000` on the other.
package main

import (
	"bytes"
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

	"github.com/goverbs/goverbs/bx"
)

// token authenticates the peers: both ends must hold the same one, at least
// 16 bytes. A real deployment reads it from a secret, not from its source.
var token = []byte("goverbs-examples-token")

// upperStream is the stream id of the one RPC: requests and responses on
// a stream id go to the handler registered for it.
const upperStream = 1

// requests are what the client calls with.
var requests = []string{"hello", "byteexpress over rdma", "zero-copy receives"}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "bxrpc:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("bxrpc", flag.ContinueOnError)
	fs.SetOutput(stdout)
	role := fs.String("role", "both", "server, client, or both (in one process)")
	devs := fs.String("d", "", "RDMA `device` (default rxe1 for the server, rxe0 for the client; with -role both: SERVER,CLIENT)")
	addr := fs.String("addr", "10.99.0.2:7000", "the server's bx `address` (TCP control plane): where it listens, where the client dials")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	srvDev, cliDev, err := devices(*role, *devs)
	if err != nil {
		return err
	}
	out := &syncWriter{w: stdout}
	switch *role {
	case "server":
		return server(ctx, srvDev, *addr, out, nil)
	case "client":
		return client(ctx, cliDev, *addr, out)
	}
	// Both: the server in a goroutine until the client is done.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- server(ctx, srvDev, *addr, out, ready) }()
	select {
	case a := <-ready:
		err := client(ctx, cliDev, a, out)
		cancel() // stops the server
		return errors.Join(err, <-done)
	case err := <-done:
		return err
	}
}

// devices returns the server's and the client's device for -role and -d.
func devices(role, d string) (srv, cli string, err error) {
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

// server serves until ctx ends.
func server(ctx context.Context, dev, addr string, out io.Writer, ready chan<- string) (err error) {
	e, err := bx.New(bx.Config{Device: dev, Token: token})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, e.Close()) }()
	// Handlers run on a pool of goroutines. The request's bytes are in
	// the receive buffer they landed in; the response is copied out after
	// the handler returns, so it may alias them.
	e.Handle(upperStream, func(ctx context.Context, p *bx.Peer, req *bx.Msg) ([]byte, error) {
		if len(req.Data()) == 0 {
			return nil, errors.New("empty request")
		}
		return bytes.ToUpper(req.Data()), nil
	})
	a, err := e.Listen(addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "server: listening on %s (%s)\n", a, dev)
	if ready != nil {
		ready <- a.String()
	}
	<-ctx.Done()
	fmt.Fprintln(out, "server: stopping")
	return nil
}

func client(ctx context.Context, dev, addr string, out io.Writer) (err error) {
	e, err := bx.New(bx.Config{Device: dev, Token: token})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, e.Close()) }()
	p, err := e.Dial(ctx, addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "client: %s connected to %s\n", dev, addr)
	for _, req := range requests {
		m, err := p.Call(ctx, upperStream, []byte(req))
		if err != nil {
			return fmt.Errorf("call %q: %w", req, err)
		}
		got := string(m.Data()) // a copy: the message's buffer goes back with Release
		m.Release()
		fmt.Fprintf(out, "client: call %q -> %q\n", req, got)
		if want := strings.ToUpper(req); got != want {
			return fmt.Errorf("call %q answered %q, want %q", req, got, want)
		}
	}
	// The handler's error comes back as a *bx.RemoteError.
	_, err = p.Call(ctx, upperStream, nil)
	var re *bx.RemoteError
	if !errors.As(err, &re) {
		return fmt.Errorf("empty call: error %v, want a *bx.RemoteError", err)
	}
	fmt.Fprintf(out, "client: call \"\" -> remote error %q\n", re.Msg)
	return nil
}

// syncWriter serializes writes: with -role both, the server and the client
// print from two goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
