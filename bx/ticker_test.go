package bx_test

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
)

// TestTickerNoLostUpdate checks that the credit/ack ticker never goes to
// sleep while an acknowledgement is owed. One-way bursts go from the
// client to the server, which holds every message (no release: a release
// would wake the ticker and hide a lost wake-up) until the client has
// every message of the burst acknowledged; only the ticker can send those
// acknowledgements. The ticker looks every 50 us instead of 2 ms, and a
// hook delays each message's handling by 300 us before anything of it is
// recorded, so the ticker's looks fall between a message's arrival and
// the changes it makes. A ticker poked before those changes (bx did so)
// took the poke, looked too early, and slept with the acknowledgement
// owed: the burst then never settles, and the watchdog ends the test.
func TestTickerNoLostUpdate(t *testing.T) {
	defer bx.SetTickForTest(bx.SetTickForTest(50 * time.Microsecond))
	// Each arrival takes 300 us before it records anything: a ticker
	// poked at the arrival looks (50 us later) before the message counts.
	bx.OnReceivedForTest(func() { time.Sleep(300 * time.Microsecond) })
	defer bx.OnReceivedForTest(nil)
	_, _, p, sp := pair(t, func(c *bx.Config) { c.Credits = 16 })
	bursts := 200
	if s := os.Getenv("GOVERBS_BX_BURSTS"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			bursts = n
		}
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d (bursts of 1-6 messages, gaps of 0-150 us)", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	ctx, wd := hang.For(t, "bursts, each acknowledged", 30*time.Second) // a hang bound (no progress)
	defer wd.Stop()
	in := sp.Stream(3)
	out := p.Stream(3)
	msg := make([]byte, 256)
	var held []*bx.Msg
	for b := range bursts {
		k := 1 + rng.IntN(6)
		for i := range k {
			msg[0], msg[1] = byte(b), byte(i)
			if err := out.Send(ctx, msg); err != nil {
				t.Fatalf("burst %d message %d: %v", b, i, hang.Cause(ctx, err))
			}
			if gap := time.Duration(rng.IntN(150)) * time.Microsecond; gap > 0 && i < k-1 {
				time.Sleep(gap)
			}
		}
		// The server takes the burst off the stream and holds it.
		for i := range k {
			m, err := in.Recv(ctx)
			if err != nil {
				t.Fatalf("burst %d: receive %d: %v", b, i, hang.Cause(ctx, err))
			}
			if d := m.Data(); len(d) != len(msg) || d[0] != byte(b) || d[1] != byte(i) {
				t.Fatalf("burst %d: message %d is %x..., want %02x%02x", b, i, d[:2], byte(b), byte(i))
			}
			held = append(held, m)
		}
		// Only the server's ticker acknowledges it now. (Note counts as
		// progress: it is said once, not in the loop.)
		wd.Note("burst %d of %d messages: waiting for the acknowledgements, the server holding the messages", b, k)
		for n := p.UnackedForTest(); n != 0; n = p.UnackedForTest() {
			select {
			case <-ctx.Done():
				t.Fatalf("burst %d: the server's ticker slept with %d acknowledgements owed: %v", b, n, hang.Err(ctx))
			case <-time.After(100 * time.Microsecond):
			}
		}
		wd.Progress()
		for _, m := range held {
			m.Release()
		}
		held = held[:0]
	}
}

// TestTickerStaysWhileCallsFlow checks that the credit/ack ticker keeps
// ticking while messages keep arriving instead of sleeping at every look
// that found nothing owed. In a ping-pong each message's acknowledgement
// and credit ride on the next one, so such a look finds nothing to send;
// the ticker slept, and the next arrival's poke woke it again, a second
// wake-up per tick (a thread woken, when the process was otherwise
// asleep). Calls go back to back for at least 10 ticks of 50 ms (a call
// takes 0.1-3 ms in our guest, under -race too): the ticker may sleep
// once at the start and, on a machine that stalls a call for a whole
// tick, now and then, not at every tick (before: 7 wake-ups in 8 ticks
// of 2, 5 or 20 ms).
func TestTickerStaysWhileCallsFlow(t *testing.T) {
	const tick = 50 * time.Millisecond
	defer bx.SetTickForTest(bx.SetTickForTest(tick))
	// Event-driven: a receive buffer goes back at its release, so each
	// credit rides on the next request (a polling endpoint defers the
	// re-post, and its ticker has a credit to tell at most looks).
	srv, cli, p, _ := pair(t, func(c *bx.Config) { c.Spin = -1 })
	srv.HandleInline(1, func(_ context.Context, _ *bx.Peer, m *bx.Msg) ([]byte, error) { return m.Data(), nil })
	ctx, wd := hang.For(t, "calls back to back", 30*time.Second)
	defer wd.Stop()
	echoCalls(t, ctx, wd, p, 1, "tick")
	t0, w0 := cli.TicksForTest(), cli.TickerWakesForTest()
	calls := 0
	for start := time.Now(); time.Since(start) < 10*tick || cli.TicksForTest()-t0 < 8; calls++ {
		echoCalls(t, ctx, wd, p, 1, "tick")
	}
	ticks, wakes := cli.TicksForTest()-t0, cli.TickerWakesForTest()-w0
	t.Logf("%d calls: the client's ticker ticked %d times and was woken from its sleep %d times", calls, ticks, wakes)
	if wakes > ticks/2+2 {
		t.Errorf("the client's ticker was woken %d times in %d ticks while calls flowed: it slept at every look", wakes, ticks)
	}
}
