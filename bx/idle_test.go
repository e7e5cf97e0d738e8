package bx_test

import (
	"context"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
)

// TestIdleTicker checks that a connected endpoint does no periodic work
// once traffic stops: its credit/ack ticker runs while updates may be
// due and then sleeps until the next message or release, instead of
// waking every 2 ms (1000 wake-ups a second for a pair, about 40% of a
// core in the TCG guest). It also checks that the ticker did its job
// before it slept: every acknowledgement went out, so the client holds no
// unacknowledged message.
func TestIdleTicker(t *testing.T) {
	srv, cli, p, sp := pair(t, nil)
	srv.Handle(1, func(_ context.Context, _ *bx.Peer, m *bx.Msg) ([]byte, error) { return m.Data(), nil })
	ctx, wd := hang.For(t, "calls, then an idle ticker", 30*time.Second)
	defer wd.Stop()
	for i := range 50 {
		m, err := p.Call(ctx, 1, make([]byte, 64+i*300)) // eager and rendezvous
		if err != nil {
			t.Fatal(hang.Cause(ctx, err))
		}
		m.Release()
		wd.Progress()
	}
	// The ticker stops within a few ticks of the last event; look for a
	// quiet half second until the watchdog gives up (a hang bound: an
	// endpoint that ticks forever never gets one).
	const window = 500 * time.Millisecond
	for {
		s0, c0 := srv.TicksForTest(), cli.TicksForTest()
		select {
		case <-ctx.Done():
			t.Fatalf("the tickers never slept: %v (server %d, client %d ticks so far)",
				hang.Err(ctx), srv.TicksForTest(), cli.TicksForTest())
		case <-time.After(window):
		}
		s1, c1 := srv.TicksForTest(), cli.TicksForTest()
		if s1 == s0 && c1 == c0 {
			t.Logf("quiet after %d server and %d client ticks", s1, c1)
			break
		}
		wd.Note("server ticked %d, client %d in %v", s1-s0, c1-c0, window)
	}
	if s0 := srv.TicksForTest(); s0 == 0 {
		t.Errorf("the server's ticker never ran: its credits and acknowledgements were never sent explicitly")
	}
	for _, c := range []struct {
		who string
		p   *bx.Peer
	}{{"client", p}, {"server", sp}} {
		if n := c.p.UnackedForTest(); n != 0 {
			t.Errorf("%s: %d messages unacknowledged after the tickers slept", c.who, n)
		}
	}
	// A new call wakes them again.
	m, err := p.Call(ctx, 1, make([]byte, 64))
	if err != nil {
		t.Fatal(hang.Cause(ctx, err))
	}
	m.Release()
}
