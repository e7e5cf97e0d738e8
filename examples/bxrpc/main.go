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
	"fmt"
	"io"
	"strings"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/examples/internal/exrun"
)

// token authenticates the peers: both ends must hold the same one, at least
// 16 bytes. A real deployment reads it from a secret, not from its source.
var token = []byte("goverbs-examples-token")

// upperStream is the stream id of the one RPC: requests and responses on
// a stream id go to the handler registered for it.
const upperStream = 1

// requests are what the client calls with.
var requests = []string{"hello", "byteexpress over rdma", "zero-copy receives"}

// example is this program; exrun gives it its flags (-role, -d, -addr)
// and runs both roles in one process.
var example = exrun.BX("bxrpc", server, client)

func main() { example.Main() }

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
