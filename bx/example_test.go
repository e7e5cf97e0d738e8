package bx_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"testing"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// exampleToken is the shared secret peers authenticate each other with (at
// least 16 bytes; a real deployment reads it from a secret store).
var exampleToken = []byte("example-token-0123456789")

// A server endpoint with an RPC handler, a client that dials it and calls.
// Run it with `scripts/vm -- go run ./examples/bxrpc` (the same code as a
// program).
func ExamplePeer_Call() {
	ctx := context.Background()
	srv, err := bx.New(bx.Config{Device: "rxe1", Token: exampleToken})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	srv.Handle(1, func(ctx context.Context, p *bx.Peer, req *bx.Msg) ([]byte, error) {
		// req.Data() is the receive buffer the request landed in; the
		// response is copied out after the handler returns.
		return bytes.ToUpper(req.Data()), nil
	})
	addr, err := srv.Listen("10.99.0.2:0")
	if err != nil {
		log.Fatal(err)
	}

	cli, err := bx.New(bx.Config{Device: "rxe0", Token: exampleToken})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	p, err := cli.Dial(ctx, addr.String())
	if err != nil {
		log.Fatal(err)
	}
	m, err := p.Call(ctx, 1, []byte("hello"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(m.Data()))
	m.Release() // the buffer goes back to the receive queue, a credit to the server
}

// Streams carry ordered messages each way; a zero-copy send writes into a
// registered buffer (Alloc) and hands it over.
func ExampleStream_SendBuffer() {
	ctx := context.Background()
	var p *bx.Peer // from Endpoint.Dial or Endpoint.Accept
	b, err := p.Endpoint().Alloc(64 << 10)
	if err != nil {
		log.Fatal(err)
	}
	copy(b.Payload(), "a large message, written in place")
	if err := p.Stream(5).SendBuffer(ctx, b); err != nil { // bx owns b now
		log.Fatal(err)
	}
	m, err := p.Stream(5).Recv(ctx) // the peer's next message on stream 5
	if err != nil {
		log.Fatal(err)
	}
	defer m.Release()
	fmt.Println(len(m.Data()))
}

// net/http over bx: the server serves the endpoint's Listener, the client
// dials Conns through its endpoint.
func ExampleEndpoint_DialConn() {
	srv, err := bx.New(bx.Config{Device: "rxe1", Token: exampleToken})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	addr, err := srv.Listen("10.99.0.2:0")
	if err != nil {
		log.Fatal(err)
	}
	go http.Serve(srv.Listener(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello over RDMA")
	}))

	cli, err := bx.New(bx.Config{Device: "rxe0", Token: exampleToken})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return cli.DialConn(ctx, addr.String())
	}}}
	resp, err := hc.Get("http://bx/")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	fmt.Println(resp.Status)
}

// TestExamples runs this package's examples on the guest's devices and
// checks what they print (they have no Output comment: see rxetest.Example).
func TestExamples(t *testing.T) {
	rxetest.RunExamples(t, []rxetest.ExampleCase{
		{Name: "ExamplePeer_Call", F: ExamplePeer_Call, Want: "HELLO"},
		{Name: "ExampleEndpoint_DialConn", F: ExampleEndpoint_DialConn, Want: "200 OK"},
	})
}
