package bx_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
)

// TestStallRecovery: a lane QP that stops sending and reports no error
// (moved to SQD here; rxe's requester stalls so after a link down, the
// chaos suite's CI failure) is found by the stall watchdog and recovered:
// the call made on the stalled lanes completes, and its request reaches
// the handler once.
func TestStallRecovery(t *testing.T) {
	t.Run("verbs", func(t *testing.T) { stallRecovery(t, nil) })
	t.Run("cm", func(t *testing.T) { needCM(t); stallRecovery(t, cmOn) })
}

func stallRecovery(t *testing.T, mod func(*bx.Config)) {
	srv, cli, p, _ := pair(t, func(c *bx.Config) {
		c.StallTimeout = time.Second
		if mod != nil {
			mod(c)
		}
	})
	var served atomic.Int32
	srv.Handle(7, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		if string(req.Data()) == "during" {
			served.Add(1)
		}
		return req.Data(), nil
	})
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	if err := echo(ctx, p, "before"); err != nil {
		t.Fatal(err)
	}
	if err := p.StallLanesForTest(); err != nil {
		t.Fatal(err)
	}
	if err := echo(ctx, p, "during"); err != nil {
		t.Fatalf("%v (stalls %d, recoveries %d)", err, cli.Snapshot().Counters.Stalls, cli.Snapshot().Counters.Recoveries)
	}
	if err := echo(ctx, p, "after"); err != nil {
		t.Fatal(err)
	}
	c := cli.Snapshot().Counters
	if c.Stalls == 0 || c.Recoveries == 0 {
		t.Errorf("stalls %d, recoveries %d: want both > 0 (the call completed without the watchdog?)", c.Stalls, c.Recoveries)
	}
	if n := served.Load(); n != 1 {
		t.Errorf("the request sent on the stalled lane reached the handler %d times, want 1", n)
	}
	t.Logf("stalls %d, probes %d, recoveries %d", c.Stalls, c.Probes, c.Recoveries)
}

// TestStallWatchOff is the control: with the watchdog off the same stall
// holds the call until its context ends, and nothing recovers.
func TestStallWatchOff(t *testing.T) {
	srv, cli, p, _ := pair(t, func(c *bx.Config) { c.StallTimeout = -1 })
	srv.Handle(7, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) { return req.Data(), nil })
	ctx, wd := hang.For(t, "", 60*time.Second)
	defer wd.Stop()
	if err := echo(ctx, p, "before"); err != nil {
		t.Fatal(err)
	}
	if err := p.StallLanesForTest(); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	err := echo(cctx, p, "during")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call on stalled lanes without the watchdog: %v, want a deadline exceeded", err)
	}
	if c := cli.Snapshot().Counters; c.Stalls != 0 || c.Recoveries != 0 || c.Probes != 0 {
		t.Errorf("watchdog off: stalls %d, probes %d, recoveries %d, want 0", c.Stalls, c.Probes, c.Recoveries)
	}
}

// TestStallProbe: probes (zero-length RDMA WRITEs) on healthy lanes, with
// calls in flight, complete and fail nothing, on both kinds of lanes.
func TestStallProbe(t *testing.T) {
	t.Run("verbs", func(t *testing.T) { stallProbe(t, nil) })
	t.Run("cm", func(t *testing.T) { needCM(t); stallProbe(t, cmOn) })
}

func stallProbe(t *testing.T, mod func(*bx.Config)) {
	srv, cli, p, _ := pair(t, mod)
	srv.Handle(7, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) { return req.Data(), nil })
	ctx, wd := hang.For(t, "", 60*time.Second)
	defer wd.Stop()
	for i := range 20 {
		done := make(chan error, 1)
		go func() { done <- echo(ctx, p, "with a probe") }()
		ns, err := p.ProbeLanesForTest()
		if err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		for !p.ProbedForTest(ns) {
			select {
			case <-ctx.Done():
				t.Fatalf("probe round %d: not complete: %v", i, hang.Err(ctx))
			case <-time.After(time.Millisecond):
			}
		}
		wd.Progress()
	}
	if c := cli.Snapshot().Counters; c.Recoveries != 0 || c.Stalls != 0 {
		t.Errorf("probes on healthy lanes: recoveries %d, stalls %d, want 0", c.Recoveries, c.Stalls)
	}
}

func echo(ctx context.Context, p *bx.Peer, what string) error {
	m, err := p.Call(ctx, 7, []byte(what))
	if err != nil {
		return hang.Cause(ctx, err)
	}
	defer m.Release()
	if string(m.Data()) != what {
		return errors.New("answer " + string(m.Data()) + ", want " + what)
	}
	return nil
}
