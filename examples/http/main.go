// Http shows net/http over ByteExpress (package bx): the server runs an
// ordinary http.Server on the endpoint's net.Listener (Endpoint.Listener),
// the client an ordinary http.Client whose Transport dials bx Conns
// (Endpoint.DialConn) instead of TCP connections. HTTP/1.1 travels as bx
// messages over RC queue pairs; large bodies go by RDMA WRITE (bx's
// rendezvous). The client GETs a greeting and POSTs a body the server
// echoes, and checks both.
//
// In the rxe guest (docs/vm.md), both roles in one process (the server on
// rxe1 at 10.99.0.2, the client on rxe0):
//
//	scripts/vm -- go run ./examples/http
//
// As two processes (the server runs until interrupted):
//
//	scripts/vm -- sh -c 'go build -o /tmp/http ./examples/http &&
//		{ /tmp/http -role server & sleep 2; /tmp/http -role client; kill $!; wait; }'
//
// Between two machines: `http -role server -d DEV -addr IP:7000` on one,
// `http -role client -d DEV -addr IP:7000` on the other.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/examples/internal/exrun"
)

// token authenticates the peers: both ends must hold the same one, at least
// 16 bytes. A real deployment reads it from a secret, not from its source.
var token = []byte("goverbs-examples-token")

// bodySize is the POST body's size: larger than bx's eager messages (8 KiB
// by default), so the body crosses by rendezvous.
const bodySize = 100_000

// example is this program; exrun gives it its flags (-role, -d, -addr)
// and runs both roles in one process.
var example = exrun.BX("http", server, client)

func main() { example.Main() }

// server serves until ctx ends.
func server(ctx context.Context, dev, addr string, out io.Writer, ready chan<- string) (err error) {
	e, err := bx.New(bx.Config{Device: dev, Token: token})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, e.Close()) }()
	a, err := e.Listen(addr)
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		if _, err := fmt.Fprintf(w, "hello from %s over bx\n", dev); err != nil {
			fmt.Fprintf(out, "server: hello: %v\n", err)
		}
	})
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		// Read the whole body first: once an HTTP/1 response starts going
		// out, the server closes the request body.
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if _, err := w.Write(b); err != nil {
			fmt.Fprintf(out, "server: echo: %v\n", err)
		}
	})
	hs := &http.Server{Handler: mux}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(e.Listener()) }()
	fmt.Fprintf(out, "server: listening on %s (%s)\n", a, dev)
	if ready != nil {
		ready <- a.String()
	}

	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	}
	// Finish the requests in flight, but not forever.
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	fmt.Fprintln(out, "server: stopped")
	return nil
}

func client(ctx context.Context, dev, addr string, out io.Writer) (err error) {
	e, err := bx.New(bx.Config{Device: dev, Token: token})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, e.Close()) }()
	// Every connection the transport opens is a bx Conn to addr, whatever
	// the URL's host says.
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return e.DialConn(ctx, addr)
	}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	base := "http://" + addr

	body, err := do(ctx, hc, http.MethodGet, base+"/hello", nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "client: GET /hello: %q\n", body)
	if want := "hello from "; !strings.HasPrefix(string(body), want) {
		return fmt.Errorf("GET /hello: %q, want it to start with %q", body, want)
	}

	sent := make([]byte, bodySize)
	for i := range sent {
		sent[i] = byte(i*131 + i>>8) // a pattern: a cut or shifted echo differs
	}
	body, err = do(ctx, hc, http.MethodPost, base+"/echo", sent)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "client: POST /echo: sent %d bytes (sha256 %x), got %d bytes (sha256 %x)\n",
		len(sent), sha256.Sum256(sent), len(body), sha256.Sum256(body))
	if !bytes.Equal(body, sent) {
		return errors.New("POST /echo: the echo differs from the body sent")
	}
	return nil
}

// do makes one request and returns the response body; a status other than
// 200 is an error.
func do(ctx context.Context, hc *http.Client, method, url string, body []byte) ([]byte, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s: %s: %q", method, url, resp.Status, b)
	}
	return b, nil
}
