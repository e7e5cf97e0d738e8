package cq_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/leakcheck"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/uverbs"
)

// TestGoroutineLeaks: the goroutines behind CQ events (a shared
// channel's reader) end when what they serve closes: the CQ and its
// channel closed, the context closed with CQs open and a Wait blocked on
// each kind of CQ, a CreateWith that failed.
func TestGoroutineLeaks(t *testing.T) {
	dev := rxetest.One(t)
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	base := leakcheck.Take()
	for round := range 3 {
		c, err := uverbs.Open(dev)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := c.CreateCompChannel()
		if err != nil {
			t.Fatal(err)
		}
		shared, err := cq.CreateWith(c, 16, cq.Options{Channel: ch})
		if err != nil {
			t.Fatal(err)
		}
		own, err := cq.CreateWith(c, 16, cq.Options{Events: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cq.CreateWith(c, 1<<30, cq.Options{Events: true}); err == nil {
			t.Fatal("a CQ of 2^30 entries")
		}
		if _, err := cq.CreateWith(c, 16, cq.Options{Vector: 1 << 20, Events: true}); err == nil {
			t.Fatal("a CQ on vector 2^20")
		}
		if round == 0 {
			// Closed by hand, CQs first.
			if err := shared.Close(); err != nil {
				t.Fatal(err)
			}
			if err := own.Close(); err != nil {
				t.Fatal(err)
			}
			if err := ch.Close(); err != nil {
				t.Fatal(err)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			wd.Progress()
			continue
		}
		// The context closes under a Wait on each CQ.
		errc := make(chan error, 2)
		for _, q := range []*cq.CQ{shared, own} {
			go func() { errc <- q.Wait(context.Background()) }()
		}
		// Both parked (the channel's select, the netpoller) before the
		// context closes: a Wait still polling the ring would read it as
		// Close unmaps it, which the CQ's contract forbids.
		for parkedWaits() < 2 {
			if ctx.Err() != nil {
				t.Fatalf("the Waits never parked: %v", hang.Err(ctx))
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			select {
			case err := <-errc:
				if !errors.Is(err, cq.ErrClosed) {
					t.Errorf("Wait when the context closed: %v, want ErrClosed", err)
				}
			case <-ctx.Done():
				t.Fatalf("a Wait did not end with Context.Close: %v", hang.Err(ctx))
			}
		}
		wd.Progress()
	}
	base.Check(t, "contexts and CQs closed")
}

// parkedWaits counts the goroutines parked in a CQ's Wait.
func parkedWaits() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		head, _, _ := strings.Cut(g, "\n")
		if strings.Contains(g, "cq.(*CQ).wait") && (strings.Contains(head, "[select") || strings.Contains(head, "[IO wait")) {
			n++
		}
	}
	return n
}
