package bx_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestSplit: a message above EagerSize and at most SplitSize goes in
// parts, each an eager message, with no rendezvous; one above SplitSize by
// rendezvous. Requests and responses, from an inline handler (posted from
// the progress goroutine) and a blocking one (from a worker), at the
// parts' boundaries, every payload intact.
func TestSplit(t *testing.T) {
	srv, cli, p, _ := pair(t, nil)
	eager, split := srv.ConfigForTest().EagerSize, srv.ConfigForTest().SplitSize
	if split <= eager {
		t.Fatalf("default SplitSize %d not above EagerSize %d", split, eager)
	}
	echo := func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		return append([]byte(nil), req.Data()...), nil
	}
	srv.HandleInline(1, echo)
	srv.Handle(2, echo)
	ctx, wd := hang.For(t, "", 30*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	// The first part holds EagerSize-8 bytes (the size goes ahead), the
	// others EagerSize.
	sizes := []int{eager + 1, 2*eager - 8, 2*eager - 7, 40_000, split, split + 1}
	for _, n := range sizes {
		for _, stream := range []uint32{1, 2} {
			splitBefore := cli.Stats().Split.Load() + srv.Stats().Split.Load()
			rvBefore := cli.Stats().Rendezvous.Load() + srv.Stats().Rendezvous.Load()
			for i := range 3 {
				req := pattern(n, i)
				m, err := p.Call(ctx, stream, req)
				if err != nil {
					t.Fatalf("stream %d: call of %d bytes: %v", stream, n, err)
				}
				if !bytes.Equal(m.Data(), req) {
					t.Fatalf("stream %d: call of %d bytes: the echo differs (%d bytes back)", stream, n, len(m.Data()))
				}
				m.Release()
				wd.Progress()
			}
			sp := cli.Stats().Split.Load() + srv.Stats().Split.Load() - splitBefore
			rv := cli.Stats().Rendezvous.Load() + srv.Stats().Rendezvous.Load() - rvBefore
			if n <= split && (sp != 6 || rv != 0) {
				t.Errorf("stream %d, %d bytes (SplitSize %d): %d split, %d rendezvous; want 6 split (3 calls each way), none by rendezvous", stream, n, split, sp, rv)
			}
			if n > split && (sp != 0 || rv != 6) {
				t.Errorf("stream %d, %d bytes (SplitSize %d): %d split, %d rendezvous; want 6 by rendezvous", stream, n, split, sp, rv)
			}
		}
	}
	if n := cli.LiveMsgsForTest() + srv.LiveMsgsForTest(); n != 0 {
		t.Errorf("%d messages live after every one was released", n)
	}
}

// TestSplitConcurrent: goroutines call at once on one lane with small,
// split and rendezvous messages, so that parts are posted while other
// messages are; and a stream carries split and small messages in order.
// The parts of a message must never be interleaved with another message
// (the receiver would fail the peer) and every payload arrives intact,
// once, in order.
func TestSplitConcurrent(t *testing.T) {
	// One lane: every stream's messages share its QP.
	srv, cli, p, sp := pair(t, func(c *bx.Config) { c.Lanes = 1 })
	srv.HandleInline(1, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		return append([]byte(nil), req.Data()...), nil
	})
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	split := srv.ConfigForTest().SplitSize
	sizes := []int{64, 20_000, split, 100, split + 4096, 9000}
	const callers, calls = 6, 20
	var wg sync.WaitGroup
	errc := make(chan error, callers+2)
	for g := range callers {
		wg.Go(func() {
			for i := range calls {
				req := pattern(sizes[(g+i)%len(sizes)], g*1000+i)
				m, err := p.Call(ctx, 1, req)
				if err != nil {
					errc <- fmt.Errorf("caller %d call %d: %w", g, i, hang.Cause(ctx, err))
					return
				}
				ok := bytes.Equal(m.Data(), req)
				m.Release()
				if !ok {
					errc <- fmt.Errorf("caller %d call %d of %d bytes: the echo differs", g, i, len(req))
					return
				}
				wd.Progress()
			}
		})
	}
	// A stream of split and small messages, in order, beside the calls.
	const msgs = 40
	payload := func(i int) []byte {
		b := pattern(sizes[i%len(sizes)], i)
		binary.LittleEndian.PutUint32(b, uint32(i))
		return b
	}
	wg.Go(func() {
		for i := range msgs {
			if err := p.Stream(3).Send(ctx, payload(i)); err != nil {
				errc <- fmt.Errorf("send %d: %w", i, hang.Cause(ctx, err))
				return
			}
		}
	})
	wg.Go(func() {
		for i := range msgs {
			m, err := sp.Stream(3).Recv(ctx)
			if err != nil {
				errc <- fmt.Errorf("receive %d: %w", i, hang.Cause(ctx, err))
				return
			}
			ok := bytes.Equal(m.Data(), payload(i))
			m.Release()
			if !ok {
				errc <- fmt.Errorf("stream message %d: out of order or damaged", i)
				return
			}
			wd.Progress()
		}
	})
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if cli.Stats().Split.Load() == 0 || srv.Stats().Split.Load() == 0 {
		t.Errorf("split messages received: client %d, server %d; want some at each", cli.Stats().Split.Load(), srv.Stats().Split.Load())
	}
	if err := p.Err(); err != nil {
		t.Errorf("peer failed: %v", err)
	}
}

// TestSplitConfig: a SplitSize whose parts would take more than half of
// the credits or of the lane window, or MaxParts, is refused, naming
// SplitSize; the default follows few credits down, to none.
func TestSplitConfig(t *testing.T) {
	dev, _ := rxetest.Pair(t)
	for _, c := range []struct {
		mod func(*bx.Config)
		ok  bool
	}{
		{func(c *bx.Config) { c.SplitSize = 16 * 8144 }, true},
		{func(c *bx.Config) { c.SplitSize = 40 * 8144 }, false}, // 41 parts > 32 (half of 64 credits)
		{func(c *bx.Config) { c.Credits = 8; c.SplitSize = 5 * 8144 }, false},
		{func(c *bx.Config) { c.LaneMsgs = 6; c.SplitSize = 4 * 8144 }, false},
		{func(c *bx.Config) { c.Credits = 4 }, true}, // default: 2 parts
		{func(c *bx.Config) { c.Credits = 3 }, true}, // default: never
		{func(c *bx.Config) { c.SplitSize = -1 }, true},
	} {
		cfg := bx.Config{Device: dev, Token: token}
		c.mod(&cfg)
		e, err := bx.New(cfg)
		if err == nil {
			e.Close()
		}
		if c.ok != (err == nil) {
			t.Errorf("Credits %d LaneMsgs %d SplitSize %d: %v", cfg.Credits, cfg.LaneMsgs, cfg.SplitSize, err)
		}
		if err != nil && !bytes.Contains([]byte(err.Error()), []byte("SplitSize")) {
			t.Errorf("error does not name SplitSize: %v", err)
		}
	}
}

// pattern is n bytes of a pattern of i.
func pattern(n, i int) []byte {
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(j*7 + i + n)
	}
	return b
}

// TestSplitFewCredits: a peer that grants fewer credits than the parts of
// SplitSize need gets smaller split messages and the rest by rendezvous;
// nothing waits for credits it can never have.
func TestSplitFewCredits(t *testing.T) {
	da, db := rxetest.Pair(t)
	// The server grants 8 credits: at most 4 parts a message to it.
	srv := newEndpoint(t, db, func(c *bx.Config) { c.Credits = 8 })
	cli := newEndpoint(t, da, nil)
	addr, err := srv.Listen(listenAddr(t, db))
	if err != nil {
		t.Fatal(err)
	}
	srv.HandleInline(1, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		return []byte("ok"), nil
	})
	ctx, wd := hang.For(t, "", 30*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	p, err := cli.Dial(ctx, addr.String())
	if err != nil {
		t.Fatal(err)
	}
	eager := cli.ConfigForTest().EagerSize
	for _, c := range []struct {
		n     int
		split bool
	}{{3*eager - 8, true}, {4*eager - 8, true}, {4*eager - 7, false}, {cli.ConfigForTest().SplitSize, false}} {
		sp, rv := srv.Stats().Split.Load(), srv.Stats().Rendezvous.Load()
		m, err := p.Call(ctx, 1, pattern(c.n, 1))
		if err != nil {
			t.Fatalf("call of %d bytes: %v", c.n, hang.Cause(ctx, err))
		}
		m.Release()
		wd.Progress()
		gotSplit := srv.Stats().Split.Load() - sp
		gotRndv := srv.Stats().Rendezvous.Load() - rv
		if c.split && (gotSplit != 1 || gotRndv != 0) || !c.split && (gotSplit != 0 || gotRndv != 1) {
			t.Errorf("%d bytes to a peer of 8 credits: %d split, %d by rendezvous; want split %v", c.n, gotSplit, gotRndv, c.split)
		}
	}
}
