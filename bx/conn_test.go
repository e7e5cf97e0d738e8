package bx_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
)

// dialConn dials a Conn from cli to srv and accepts it on srv's Listener
// ln.
func dialConn(t *testing.T, ctx context.Context, cli, srv *bx.Endpoint, ln net.Listener) (c, sc net.Conn) {
	t.Helper()
	c, err := cli.DialConn(ctx, srv.ListenAddrs()[0].String())
	if err != nil {
		t.Fatal(err)
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() }) // Accept has no context
	sc, err = ln.Accept()
	stop()
	if err != nil {
		c.Close()
		t.Fatal(hang.Cause(ctx, err))
	}
	boundConn(ctx, c)
	boundConn(ctx, sc)
	return c, sc
}

// boundConn makes ctx's end (a hang.For watchdog firing) end c's blocked
// reads and writes: a hang fails the test with a timeout instead of
// holding it until go test's -timeout (a net.Conn takes no context).
func boundConn(ctx context.Context, c net.Conn) {
	context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
}

// fillCredits writes 100-byte messages on c until a write blocks for
// credits (its 2 s write deadline passes: the peer reads nothing) and
// returns the bytes written.
func fillCredits(t *testing.T, wd *hang.Watchdog, c net.Conn) int {
	t.Helper()
	msg := make([]byte, 100)
	sent := 0
	for {
		c.SetWriteDeadline(time.Now().Add(2 * time.Second))
		n, err := c.Write(msg)
		sent += n
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("write after %d bytes: %v", sent, err)
			}
			return sent
		}
		wd.Progress()
	}
}

// TestConnCloseReleasesQueued: Conn.Close gives back the receive buffers
// of every message queued, not only the one being read.
func TestConnCloseReleasesQueued(t *testing.T) {
	srv, cli, _, _ := pair(t, nil)
	ln := srv.Listener()
	defer ln.Close()
	ctx, wd := hang.For(t, "", 30*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	c, sc := dialConn(t, ctx, cli, srv, ln)
	defer c.Close()
	// DialConn dialed a peer connection of its own.
	sp, err := srv.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eager, _, _ := inUse(srv)
	for i := range 6 {
		if _, err := c.Write(fmt.Appendf(nil, "part %d;", i)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "6 messages held", func() bool { return sp.HeldForTest() == 6 })
	b := make([]byte, 3)
	if _, err := io.ReadFull(sc, b); err != nil || string(b) != "par" {
		t.Fatalf("read %q, %v", b, err)
	}
	if err := sc.Close(); err != nil {
		t.Fatal(err)
	}
	// Eventually, not at once: a control message (a credit update) being
	// received counts as held between its arrival and its re-post
	// (most likely what run AC saw: 1 held, once). The queued ones the old
	// code kept stay held.
	eventually(t, "no receive buffer held after Conn.Close (old code kept 5, the queued ones)", func() bool { return sp.HeldForTest() == 0 })
	// (The close message the server sends holds one until acknowledged.)
	eventually(t, "server eager buffers back", func() bool { e, _, _ := inUse(srv); return e <= eager })
	if _, err := sc.Read(b); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close: %v, want net.ErrClosed", err)
	}
	if _, err := c.Read(b); err != io.EOF {
		t.Errorf("dialer's Read after the peer closed: %v, want io.EOF", err)
	}
}

// TestConnAcceptQueueFull: a Conn the acceptor cannot queue is refused
// with an error naming why, not dropped; so is one to an endpoint without
// a Listener. Closing the Listener closes the Conns it did not accept.
func TestConnAcceptQueueFull(t *testing.T) {
	srv, cli, _, _ := pair(t, nil)
	ctx, wd := hang.For(t, "", 30*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	addr := srv.ListenAddrs()[0].String()
	_, err := cli.DialConn(ctx, addr)
	if !errors.Is(err, bx.ErrConnRefused) || !strings.Contains(err.Error(), "no Listener") {
		t.Fatalf("DialConn without a Listener: %v, want ErrConnRefused naming the missing Listener", err)
	}
	ln := srv.Listener()
	var conns []net.Conn
	for i := range 64 {
		c, err := cli.DialConn(ctx, addr)
		if err != nil {
			t.Fatalf("conn %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	_, err = cli.DialConn(ctx, addr)
	if !errors.Is(err, bx.ErrConnRefused) || !strings.Contains(err.Error(), "accept queue full") {
		t.Fatalf("65th DialConn: %v, want ErrConnRefused naming the full accept queue", err)
	}
	t.Logf("refused: %v", err)
	// Accepting one makes room for one.
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	c, err := cli.DialConn(ctx, addr)
	if err != nil {
		t.Fatalf("DialConn after an Accept: %v", err)
	}
	conns = append(conns, c)
	// The Conns never accepted are closed with the Listener.
	ln.Close()
	b := make([]byte, 1)
	for i, c := range conns[1:] {
		c.SetReadDeadline(time.Now().Add(hang.Scale(10 * time.Second)))
		if _, err := c.Read(b); err != io.EOF {
			t.Fatalf("conn %d after the Listener closed: %v, want io.EOF", i+1, err)
		}
		c.Close()
	}
	conns[0].Close()
}

// TestConnCloseDoesNotWait: Conn.Close returns while the peer holds every
// credit (it is not reading), as a TCP Close does; the close message goes
// out once a credit comes back, and the peer then reads what was written
// and io.EOF. Before, Close waited for a credit up to HandshakeTimeout
// (here 30 minutes, past the hang bound however slow the machine;
// nettest's PresentTimeout showed the default 10 s).
func TestConnCloseDoesNotWait(t *testing.T) {
	srv, cli, _, _ := pair(t, func(c *bx.Config) { c.HandshakeTimeout = 30 * time.Minute })
	ln := srv.Listener()
	defer ln.Close()
	ctx, wd := hang.For(t, "", 30*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	c, sc := dialConn(t, ctx, cli, srv, ln)
	defer sc.Close()
	sent := fillCredits(t, wd, c) // the peer reads nothing
	done := make(chan error, 1)
	go func() { done <- c.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-ctx.Done():
		t.Fatalf("Close did not return with the peer's credits exhausted: %v", hang.Cause(ctx, ctx.Err()))
	}
	// The peer reads everything, then io.EOF: the close went out behind it.
	type result struct {
		n   int
		err error
	}
	read := make(chan result, 1)
	go func() { b, err := io.ReadAll(sc); read <- result{len(b), err} }()
	select {
	case r := <-read:
		if r.err != nil || r.n != sent {
			t.Fatalf("peer read %d of %d bytes, then %v", r.n, sent, r.err)
		}
	case <-ctx.Done():
		sc.Close()
		t.Fatalf("the peer's read did not end (no close message behind the data): %v", hang.Cause(ctx, ctx.Err()))
	}
}

// TestConnSiblingResumes: Conns to one peer share its credits (DialConn),
// so a Write on one waits while its sibling's unread data holds every
// credit; once the sibling's reader closes (its buffers go back) the
// Write completes and its data arrives whole. TestOpenCloseProperty drew
// this state at random once and hung at its write, the model's fault (it
// left too much unread), not bx's; here the way out of it is checked.
func TestConnSiblingResumes(t *testing.T) {
	srv, cli, _, _ := pair(t, nil)
	ln := srv.Listener()
	defer ln.Close()
	ctx, wd := hang.For(t, "", 30*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	c1, sc1 := dialConn(t, ctx, cli, srv, ln)
	defer c1.Close()
	c2, sc2 := dialConn(t, ctx, cli, srv, ln)
	defer c2.Close()
	defer sc2.Close()
	fillCredits(t, wd, c1) // sc1 reads nothing
	data := make([]byte, 3*8192+17)
	for i := range data {
		data[i] = byte(i * 7)
	}
	wrote := make(chan error, 1)
	go func() { _, err := c2.Write(data); wrote <- err }()
	select {
	case err := <-wrote:
		t.Fatalf("c2's write returned (%v) while c1's unread data held every credit: DialConn's doc is wrong", err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := sc1.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("c2 write after sc1 closed: %v", hang.Cause(ctx, err))
		}
	case <-ctx.Done():
		t.Fatalf("c2's write did not resume after sc1 released its buffers: %v", hang.Cause(ctx, ctx.Err()))
	}
	got := make([]byte, len(data))
	if _, err := io.ReadFull(sc2, got); err != nil {
		t.Fatalf("sc2 read: %v", hang.Cause(ctx, err))
	}
	if !bytes.Equal(got, data) {
		t.Fatal("sc2 read other bytes than c2 wrote")
	}
}
