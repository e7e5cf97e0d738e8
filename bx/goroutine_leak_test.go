package bx_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/leakcheck"
	"github.com/goverbs/goverbs/internal/rxetest"
)

func echoEndpoint(t *testing.T, dev string, mod func(*bx.Config)) *bx.Endpoint {
	t.Helper()
	e := newEndpoint(t, dev, mod) // closed by the tests themselves first
	e.Handle(1, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		return req.Data(), nil
	})
	return e
}

// TestGoroutineLeaks: endpoints made, connected, used and closed several
// times leave no goroutine (progress, ticker, workers, control, accept)
// behind once Close returned: the dialer closed first, the acceptor
// closed first (the dialer's peer died under it), a New or Listen that
// failed.
func TestGoroutineLeaks(t *testing.T) {
	da, db := rxetest.Pair(t)
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	base := leakcheck.Take()
	for round := range 4 {
		srv, cli := echoEndpoint(t, db, nil), echoEndpoint(t, da, nil)
		addr, err := srv.Listen(listenAddr(t, db))
		if err != nil {
			t.Fatal(err)
		}
		p, err := cli.Dial(ctx, addr.String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Accept(ctx); err != nil {
			t.Fatal(err)
		}
		for range 4 {
			m, err := p.Call(ctx, 1, []byte("ping"))
			if err != nil {
				t.Fatal(err)
			}
			m.Release()
		}
		wd.Progress()
		first, second := cli, srv
		if round%2 == 1 {
			first, second = srv, cli // the dialer's peer dies under it
			if _, err := p.Call(ctx, 1, []byte("ping")); err != nil {
				t.Fatal(err)
			}
		}
		closeEndpoint(t, first)
		if round%2 == 1 {
			select {
			case <-p.Done():
			case <-ctx.Done():
				t.Fatalf("the dialer's peer outlived the acceptor: %v", hang.Err(ctx))
			}
			if _, err := p.Call(ctx, 1, []byte("ping")); err == nil {
				t.Error("a call to a closed endpoint succeeded")
			}
		}
		closeEndpoint(t, second)
		wd.Progress()
	}
	base.Check(t, "connected endpoints closed")

	for range 3 {
		if e, err := bx.New(bx.Config{Device: "nodev9", Token: token}); err == nil {
			e.Close()
			t.Error("an endpoint on nodev9")
		}
		if e, err := bx.New(bx.Config{Device: db, Token: []byte("short")}); err == nil {
			e.Close()
			t.Error("an endpoint with a 5-byte token")
		}
		e := echoEndpoint(t, db, nil)
		addr, err := e.Listen(listenAddr(t, db))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Listen(addr.String()); err == nil {
			t.Error("a second Listen on the same address")
		}
		closeEndpoint(t, e)
		wd.Progress()
	}
	base.Check(t, "failed New and Listen")
}

// TestGoroutineLeaksHandshake: a control connection in its handshake when
// the endpoint closes (an accepted connection whose dialer sends
// nothing; a Dial to a listener that never answers) ends with Close, and
// a Dial's with its context. They outlived Close until
// Config.HandshakeTimeout: the handshake's reads were bounded by it
// alone, and Close knew nothing of the connection.
func TestGoroutineLeaksHandshake(t *testing.T) {
	da, db := rxetest.Pair(t)
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	// Far longer than leakcheck.Bound: a goroutine that waits for it is
	// caught, not let go by the timeout.
	long := func(c *bx.Config) { c.HandshakeTimeout = 10 * time.Minute }
	base := leakcheck.Take()

	t.Run("accepted", func(t *testing.T) {
		for range 2 {
			srv := echoEndpoint(t, db, long)
			addr, err := srv.Listen(listenAddr(t, db))
			if err != nil {
				t.Fatal(err)
			}
			c, err := net.Dial("tcp", addr.String())
			if err != nil {
				t.Fatal(err)
			}
			// The acceptor's hello: its handshake goroutine now waits
			// for our auth.
			if _, err := c.Read(make([]byte, 1)); err != nil {
				t.Fatal(err)
			}
			closeEndpoint(t, srv)
			base.Check(t, "Close with an accepted connection in its handshake")
			c.Close()
			wd.Progress()
		}
	})

	t.Run("dialing", func(t *testing.T) {
		ln, err := net.Listen("tcp", listenAddr(t, db))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		for range 2 {
			cli := echoEndpoint(t, da, long)
			dialed := make(chan error, 1)
			go func() {
				_, err := cli.Dial(context.Background(), ln.Addr().String())
				dialed <- err
			}()
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond) // into its wait for our hello (not required)
			closeEndpoint(t, cli)
			select {
			case err := <-dialed:
				if !errors.Is(err, bx.ErrClosed) {
					t.Errorf("a Dial to a silent listener, its endpoint closed: %v, want ErrClosed", err)
				}
			case <-time.After(hang.Scale(leakcheck.Bound)):
				t.Errorf("a Dial in its handshake did not end with Endpoint.Close")
			case <-ctx.Done():
				t.Fatal(hang.Err(ctx))
			}
			base.Check(t, "Close with a Dial in its handshake")
			c.Close()
			wd.Progress()
		}
	})

	t.Run("dial-cancelled", func(t *testing.T) {
		ln, err := net.Listen("tcp", listenAddr(t, db))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		cli := echoEndpoint(t, da, long)
		defer closeEndpoint(t, cli)
		for range 2 {
			dctx, cancel := context.WithCancel(context.Background())
			dialed := make(chan error, 1)
			go func() {
				_, err := cli.Dial(dctx, ln.Addr().String())
				dialed <- err
			}()
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			cancel()
			select {
			case err := <-dialed:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("a Dial to a silent listener, its context cancelled: %v, want context.Canceled", err)
				}
			case <-time.After(hang.Scale(leakcheck.Bound)):
				t.Errorf("a Dial in its handshake did not end with its context")
			case <-ctx.Done():
				t.Fatal(hang.Err(ctx))
			}
			c.Close()
			wd.Progress()
		}
	})
	base.Check(t, "handshakes ended by Close and by their context")
}
