package bx_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestBufferOwnership: a Buffer handed to bx (SendBuffer, CallBuffer) or
// freed is emptied: it can be neither sent nor freed again (before, a
// second SendBuffer posted a buffer the pool may have handed to another
// message), and its Payload is nil. A Buffer of another Endpoint is
// refused and goes back to its own pool (before, it was posted with the
// other endpoint's key).
func TestBufferOwnership(t *testing.T) {
	srv, cli, p, sp := pair(t, nil)
	srv.HandleInline(1, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		return req.Data(), nil
	})
	ctx, wd := hang.For(t, "", time.Minute) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	cli0, _, _ := cli.AllocatorStats()

	b, err := cli.Alloc(16)
	if err != nil {
		t.Fatal(err)
	}
	copy(b.Payload(), "sixteen bytes ok")
	if err := p.Stream(2).SendBuffer(ctx, b); err != nil {
		t.Fatal(err)
	}
	if b.Payload() != nil {
		t.Error("a sent Buffer still has a payload")
	}
	if err := p.Stream(2).SendBuffer(ctx, b); err == nil || !strings.Contains(err.Error(), "already sent") {
		t.Errorf("SendBuffer of a sent Buffer: %v; want an error saying so", err)
	}
	if _, err := p.CallBuffer(ctx, 1, b); err == nil || !strings.Contains(err.Error(), "already sent") {
		t.Errorf("CallBuffer of a sent Buffer: %v; want an error saying so", err)
	}
	b.Free() // nothing: bx owns it
	m, err := sp.Stream(2).Recv(ctx)
	if err != nil {
		t.Fatal(hang.Cause(ctx, err))
	}
	if string(m.Data()) != "sixteen bytes ok" {
		t.Errorf("received %q", m.Data())
	}
	m.Release()

	b, err = cli.Alloc(16)
	if err != nil {
		t.Fatal(err)
	}
	b.Free()
	if b.Payload() != nil {
		t.Error("a freed Buffer still has a payload")
	}
	if _, err := p.CallBuffer(ctx, 1, b); err == nil || !strings.Contains(err.Error(), "freed") {
		t.Errorf("CallBuffer of a freed Buffer: %v; want an error saying so", err)
	}
	b.Free()

	srv0, _, _ := srv.AllocatorStats()
	for _, send := range []func(*bx.Buffer) error{
		func(b *bx.Buffer) error { _, err := p.CallBuffer(ctx, 1, b); return err },
		func(b *bx.Buffer) error { return p.Stream(2).SendBuffer(ctx, b) },
	} {
		ob, err := srv.Alloc(16)
		if err != nil {
			t.Fatal(err)
		}
		if err := send(ob); err == nil || !strings.Contains(err.Error(), "another Endpoint") {
			t.Errorf("a Buffer of the server's sent by the client: %v; want an error naming it", err)
		}
		if ob.Payload() != nil {
			t.Error("a refused Buffer still has a payload")
		}
	}
	if srv1, _, _ := srv.AllocatorStats(); srv1.InUse != srv0.InUse {
		t.Errorf("the server's pool holds %d buffers, %d before: the refused Buffers did not go back", srv1.InUse, srv0.InUse)
	}
	// The calls still work, and the client's buffers come back once
	// acknowledged.
	if m, err := p.Call(ctx, 1, []byte("after")); err != nil || string(m.Data()) != "after" {
		t.Fatalf("call after the refusals: %v", err)
	} else {
		m.Release()
	}
	eventually(t, "client buffers back", func() bool {
		c, _, _ := cli.AllocatorStats()
		return c.InUse == cli0.InUse
	})
}

// TestListenAfterClose: Listen on a closed endpoint fails with ErrClosed
// (before, it opened a listener and an accept goroutine that nothing
// closed any more).
func TestListenAfterClose(t *testing.T) {
	da, _ := rxetest.Pair(t)
	e, err := bx.New(bx.Config{Device: da, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	addr, err := e.Listen(listenAddr(t, da))
	if !errors.Is(err, bx.ErrClosed) {
		t.Fatalf("Listen after Close: %v, %v; want ErrClosed", addr, err)
	}
}
