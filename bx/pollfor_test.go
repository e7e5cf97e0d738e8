package bx_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
)

// TestCallerPolls checks run-to-completion on the calling side: a Call on
// a polling endpoint polls the CQ itself while it waits and finds its own
// response there (Stats.SelfPolled), with every payload intact, while
// other Calls wait on their channels and get theirs from whoever polled.
// Without polling (two endpoints in one process, so mayPoll says no) a
// Call waits for the CQ's events itself (selfWait) and takes its own
// response when one wakes it: it sleeps, it does not spin.
func TestCallerPolls(t *testing.T) {
	for _, force := range []bool{true, false} {
		name := map[bool]string{true: "polling", false: "event-driven"}[force]
		t.Run(name, func(t *testing.T) {
			defer bx.ForcePollForTest(bx.ForcePollForTest(force))
			// A Spin long enough that no round trip, however slow the
			// machine, outlasts a Call's polling (10 Spins): the test
			// counts who delivered, not how fast.
			srv, cli, p, _ := pair(t, func(c *bx.Config) { c.Spin = time.Second })
			srv.HandleInline(1, func(_ context.Context, _ *bx.Peer, m *bx.Msg) ([]byte, error) { return m.Data(), nil })
			srv.Handle(2, func(_ context.Context, _ *bx.Peer, m *bx.Msg) ([]byte, error) { return m.Data(), nil })
			ctx, wd := hang.For(t, "calls", 30*time.Second)
			defer wd.Stop()
			c0 := cli.Snapshot().Counters
			s0 := c0.SelfPolled
			const calls = 200
			// One caller alone, then four at once (one of them polls at
			// a time, the others are handed their responses).
			run := func(g, n int, stream uint32) error {
				req := make([]byte, 64+g*1000) // eager, and rendezvous from 4 KiB on
				for i := range n {
					binary.LittleEndian.PutUint64(req, uint64(g)<<32|uint64(i))
					m, err := p.Call(ctx, stream, req)
					if err != nil {
						return hang.Cause(ctx, err)
					}
					ok := bytes.Equal(m.Data(), req)
					m.Release()
					if !ok {
						t.Errorf("caller %d call %d: the response is not the request", g, i)
					}
					wd.Progress()
				}
				return nil
			}
			if err := run(0, calls, 1); err != nil {
				t.Fatal(err)
			}
			alone := cli.Snapshot().Counters.SelfPolled - s0
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := run(g+1, calls/4, uint32(1+g%2)); err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			c1 := cli.Snapshot().Counters
			total, wakeups := c1.SelfPolled-s0, c1.Wakeups-c0.Wakeups
			t.Logf("%s: %d of %d lone calls found their response by their own poll, %d in all; %d event wake-ups", name, alone, calls, total, wakeups)
			// Most, not all: the progress goroutine may have delivered a
			// response just before the Call took over.
			if alone < calls/2 {
				t.Errorf("only %d of %d lone calls took their own response", alone, calls)
			}
			if !force && wakeups < calls/2 {
				// An endpoint that may not poll sleeps until an event:
				// about one wake-up per call, not a spin.
				t.Errorf("%d event wake-ups for %d calls on an endpoint that may not poll: it spun", wakeups, calls+calls)
			}
		})
	}
}

// TestCloseWhileCallerPolls closes the client endpoint while a Call polls
// its CQ for a response that will not come: the Call must end with an
// error, and Close must not pull the CQ from under the poll (its ring is
// unmapped: a poll after that would crash the process).
func TestCloseWhileCallerPolls(t *testing.T) {
	defer bx.ForcePollForTest(bx.ForcePollForTest(true))
	srv, cli, p, _ := pair(t, func(c *bx.Config) { c.Spin = time.Second })
	release := make(chan struct{})
	defer close(release)
	entered := make(chan struct{}, 1)
	srv.Handle(1, func(ctx context.Context, _ *bx.Peer, m *bx.Msg) ([]byte, error) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, nil
	})
	ctx, wd := hang.For(t, "a call, then Close", 30*time.Second)
	defer wd.Stop()
	errc := make(chan error, 1)
	go func() {
		_, err := p.Call(ctx, 1, []byte("never answered"))
		errc <- err
	}()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal(hang.Err(ctx))
	}
	time.Sleep(10 * time.Millisecond) // the Call is polling now (for up to 10 s)
	if err := cli.Close(); err != nil {
		t.Errorf("close while a Call polls: %v", err)
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("the Call returned no error after its endpoint closed")
		}
		t.Logf("the Call ended with: %v", err)
	case <-ctx.Done():
		t.Fatalf("the Call did not end after Close: %v", hang.Err(ctx))
	}
}

// TestSpinWindowAdapts: a caller that pauses between calls for longer
// than Config.Spin (but far less than the window's cap, set to 16 Spins
// here: bx's default is 4) must not make the serving endpoint arm its CQ
// and sleep before every request: its spin window grows after the first
// short sleeps. With a fixed window the server armed about once per call
// here. A gap the machine stretched past the window's cap, or a slow
// wake-up, costs an arm or two; the bound allows for them.
func TestSpinWindowAdapts(t *testing.T) {
	growth := bx.SetSpinGrowthForTest(16)
	t.Cleanup(func() { bx.SetSpinGrowthForTest(growth) }) // after the endpoints' Close
	defer bx.ForcePollForTest(bx.ForcePollForTest(true))
	const spin = 200 * time.Microsecond
	srv, _, p, _ := pair(t, func(c *bx.Config) { c.Spin = spin })
	srv.HandleInline(1, func(_ context.Context, _ *bx.Peer, m *bx.Msg) ([]byte, error) { return m.Data(), nil })
	ctx, wd := hang.For(t, "calls", 30*time.Second)
	defer wd.Stop()
	req := make([]byte, 64)
	call := func() {
		m, err := p.Call(ctx, 1, req)
		if err != nil {
			t.Fatal(hang.Cause(ctx, err))
		}
		m.Release()
		wd.Progress()
	}
	for range 20 { // warm up
		call()
	}
	const calls = 150
	a0 := srv.Snapshot().Counters.Arms
	long := 0
	last, prev := time.Now(), time.Now()
	for range calls {
		// Busy, not time.Sleep: a sleep of 3 Spins can oversleep by
		// milliseconds on a loaded machine.
		for time.Since(last) < 3*spin {
		}
		// The server's idle gap is at most the time between two
		// requests, round trip included: on a slow machine it may have
		// outlasted the window's cap.
		start := time.Now()
		if start.Sub(prev) > 12*spin {
			long++
		}
		prev = start
		call()
		last = time.Now()
	}
	arms := srv.Snapshot().Counters.Arms - a0
	t.Logf("%d calls 3 Spins apart: the server armed %d times (%d requests more than 12 Spins after the previous one)", calls, arms, long)
	if bound := uint64(calls/5 + 2*long); arms > bound {
		t.Errorf("the server armed its CQ %d times in %d calls (bound %d): its spin window did not grow", arms, calls, bound)
	}
}

// TestCallHandsBack: on an endpoint without handlers, a Call that polled
// for its response leaves the CQ to the next Call without waking the
// progress goroutine (each wake-up is a thread wake-up and, on a machine
// with as many pollers as cores, a third runnable thread); an endpoint
// with handlers wakes it (requests arrive between Calls). After the last
// Call the progress goroutine still comes back on its own: messages that
// no Recv waits for are received.
func TestCallHandsBack(t *testing.T) {
	// A Call polls for 10 Spins without a completion at most, then waits
	// for its response on its channel and wakes the progress goroutine
	// as it leaves: with the default Spin a loaded -race run gave up on
	// half the Calls (101 of 200 handed back). 200 ms makes every gap
	// between completions shorter than that unless something hangs.
	srv, cli, p, sp, ctx, wd := pollingEchoPair(t, 200*time.Millisecond)
	const calls = 200
	before := cli.Snapshot().Counters
	echoCalls(t, ctx, wd, p, calls, "hand back")
	after := cli.Snapshot().Counters
	hb, res := after.HandBacks-before.HandBacks, after.Resumes-before.Resumes
	t.Logf("%d calls: %d hand-backs, %d resumes of the progress goroutine", calls, hb, res)
	if hb != calls || res != 0 {
		t.Errorf("%d of %d calls handed the CQ back without a wake-up and %d woke the progress goroutine, want all and none", hb, calls, res)
	}
	if s := srv.Snapshot().Counters; s.HandBacks != 0 {
		t.Errorf("the server (it has a handler) handed back %d times, want 0", s.HandBacks)
	}
	receivedAfterCalls(t, ctx, cli, sp)
}

// TestConcurrentCallsNotStranded: a Call that hands the CQ back must not
// leave another waiting Call without a poller. With two Calls at once,
// one polls and the other waits on its channel; if the poller left
// without waking the progress goroutine, the other's response would sit
// in the CQ until the progress goroutine's own look 4 Spins later (8 s
// here): a stall, which the bound below catches.
func TestConcurrentCallsNotStranded(t *testing.T) {
	_, _, p, _, ctx, wd := pollingEchoPair(t, 2*time.Second)
	bound := hang.Scale(4 * time.Second) // half the stall: a stranded Call, not a slow one
	for round := range 20 {
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		for g := range 2 {
			wg.Go(func() {
				r, err := p.Call(ctx, 1, []byte{byte(round), byte(g)})
				if err != nil {
					errs <- err
					return
				}
				r.Release()
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", round, hang.Cause(ctx, err))
		}
		if d := time.Since(start); d > bound {
			t.Fatalf("round %d: two concurrent calls took %v (a Call waited for the progress goroutine's own look, 8 s after the poller left)", round, d)
		}
		wd.Progress()
	}
}

// TestSelfWaitHandsBack: on an endpoint that waits for events (Spin
// negative), a Call that took its own response leaves the CQ to the next
// Call as a polling one does, and the progress goroutine neither spins
// beside a waiting Call nor is woken per call. Before, its timed wait
// for the Call was 4 Spins, negative, so it ran out at once and the
// progress goroutine looped through it for as long as every Call waited
// (a core's worth of CPU; with GOMAXPROCS=1, 21 ms a call instead of 0.4,
// as the loop kept the netpoller from the Call's event until sysmon
// looked). After the last Call the progress goroutine still comes back
// on its own: messages that no Recv waits for are received.
func TestSelfWaitHandsBack(t *testing.T) {
	srv, cli, p, sp := pair(t, func(c *bx.Config) { c.Spin = -1 })
	srv.HandleInline(1, func(_ context.Context, _ *bx.Peer, m *bx.Msg) ([]byte, error) { return m.Data(), nil })
	ctx, wd := hang.For(t, "event-driven calls", 30*time.Second)
	defer wd.Stop()
	const calls = 200
	before := cli.Snapshot().Counters
	parks := cli.ParksForTest()
	start := time.Now()
	echoCalls(t, ctx, wd, p, calls, "self wait")
	elapsed := time.Since(start)
	after := cli.Snapshot().Counters
	hb, res := after.HandBacks-before.HandBacks, after.Resumes-before.Resumes
	looks := cli.ParksForTest() - parks
	t.Logf("%d event-driven calls: %d hand-backs, %d resumes; the progress goroutine looked %d times while a Call held the CQ; %d event wake-ups",
		calls, hb, res, looks, after.Wakeups-before.Wakeups)
	// Most, not all: a Call whose response the progress goroutine
	// delivered before it took over did not get it by its own wait.
	if hb < calls/2 {
		t.Errorf("%d of %d calls handed the CQ back without a wake-up (%d resumes), want most", hb, calls, res)
	}
	// It looks again every selfWaitStep (10 ms) while a Call waits, and
	// once 1 ms after a hand-back: at most one look per call and one per
	// 10 ms of calls, however slow the machine (twice that here);
	// thousands in a third of a second when it spun.
	if bound := uint64(2 * (calls + int(elapsed/(10*time.Millisecond)))); looks > bound {
		t.Errorf("the progress goroutine looked %d times in %d calls (bound %d): it spun beside the waiting Calls", looks, calls, bound)
	}
	receivedAfterCalls(t, ctx, cli, sp)
}

// echoCalls makes n Calls of msg to stream 1's echo handler, one after
// another.
func echoCalls(t *testing.T, ctx context.Context, wd *hang.Watchdog, p *bx.Peer, n int, msg string) {
	t.Helper()
	for i := range n {
		r, err := p.Call(ctx, 1, []byte(msg))
		if err != nil {
			t.Fatalf("call %d: %v", i, hang.Cause(ctx, err))
		}
		r.Release()
		wd.Progress()
	}
}

// receivedAfterCalls checks that after the last Call the client's
// progress goroutine comes back to the CQ on its own: no Recv waits on
// the client, so only it can take in what the server sends now.
func receivedAfterCalls(t *testing.T, ctx context.Context, cli *bx.Endpoint, sp *bx.Peer) {
	t.Helper()
	got := cli.Snapshot().Counters.Received
	for i := range 3 {
		if err := sp.Stream(7).Send(ctx, []byte("after the calls")); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	eventually(t, "the client's progress goroutine receiving after the last Call", func() bool {
		return cli.Snapshot().Counters.Received >= got+3
	})
}

// pollingEchoPair is a pair whose endpoints poll (whatever else runs) with
// the given Spin, the server echoing stream 1 inline (the client has no
// handler), and a hang watchdog of 30 s.
func pollingEchoPair(t *testing.T, spin time.Duration) (srv, cli *bx.Endpoint, p, sp *bx.Peer, ctx context.Context, wd *hang.Watchdog) {
	t.Helper()
	prev := bx.ForcePollForTest(true)
	t.Cleanup(func() { bx.ForcePollForTest(prev) })
	srv, cli, p, sp = pair(t, func(c *bx.Config) { c.Spin = spin })
	srv.HandleInline(1, func(_ context.Context, _ *bx.Peer, m *bx.Msg) ([]byte, error) { return m.Data(), nil })
	ctx, wd = hang.For(t, "", 30*time.Second) // a hang bound (no progress), not a speed bound
	t.Cleanup(wd.Stop)
	return srv, cli, p, sp, ctx, wd
}
