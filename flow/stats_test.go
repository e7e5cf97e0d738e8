package flow

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
)

// fakeClock drives stall accounting in tests: WaitTime is then exactly the
// time the test advanced while a waiter was queued.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func useFakeClock(t *testing.T) *fakeClock {
	t.Helper()
	c := &fakeClock{t: time.Unix(1000, 0)}
	f := c.now
	clock.Store(&f)
	t.Cleanup(func() { clock.Store(nil) })
	return c
}

// stallStats is the part of CreditStats and WindowStats a stall test checks.
type stallStats struct {
	Stalls, Cancelled, Waiting uint64
	WaitTime                   time.Duration
}

// stallTarget adapts a Credits or a Window (the leaf acquired at) to the
// stall table.
type stallTarget struct {
	acquire func(ctx context.Context, n uint64) error
	give    func(n uint64) error // grant n more credits / release n bytes
	close   func()
	stats   func() stallStats
}

func creditsTarget(c *Credits) stallTarget {
	granted := func() uint64 { _, g, _ := c.State(); return g }
	return stallTarget{
		acquire: func(ctx context.Context, n uint64) error { return c.Acquire(ctx, n) },
		give:    func(n uint64) error { return c.Grant(granted()+n, 0) },
		close:   c.Close,
		stats: func() stallStats {
			st := c.Stats()
			return stallStats{st.Stalls, st.Cancelled, st.Waiting, st.WaitTime}
		},
	}
}

func windowTarget(w *Window) stallTarget {
	return stallTarget{
		acquire: func(ctx context.Context, n uint64) error { return w.Acquire(ctx, int64(n)) },
		give:    func(n uint64) error { return w.Release(int64(n)) },
		close:   w.Close,
		stats: func() stallStats {
			st := w.Stats()
			return stallStats{st.Stalls, st.Cancelled, st.Waiting, st.WaitTime}
		},
	}
}

// sop is one step of a stall table test.
type sop struct {
	op  string        // acquire (must not wait), wait (must wait: queued in the background), advance, give, cancel, done, close
	n   uint64        // acquire, wait: credits or bytes; give: credits granted or bytes released
	d   time.Duration // advance
	id  int           // wait, cancel, done: the waiter
	err error         // acquire, done: expected result (errors.Is; nil: success)
	st  stallStats    // the counters after the step
}

func runStallTable(t *testing.T, tgt stallTarget, ops []sop) {
	t.Helper()
	clk := useFakeClock(t)
	type waiter struct {
		cancel context.CancelFunc
		errc   chan error
	}
	waiters := map[int]waiter{}
	for i, o := range ops {
		switch o.op {
		case "acquire":
			if err := tgt.acquire(context.Background(), o.n); !errors.Is(err, o.err) || (o.err == nil && err != nil) {
				t.Fatalf("step %d %+v: Acquire = %v", i, o, err)
			}
		case "wait":
			ctx, cancel := context.WithCancel(context.Background())
			w := waiter{cancel, make(chan error, 1)}
			waiters[o.id] = w
			before := tgt.stats().Stalls
			go func() { w.errc <- tgt.acquire(ctx, o.n) }()
			waitStalls(t, func() uint64 { return tgt.stats().Stalls }, before+1)
		case "advance":
			clk.advance(o.d)
		case "give":
			if err := tgt.give(o.n); err != nil {
				t.Fatalf("step %d %+v: %v", i, o, err)
			}
		case "cancel":
			waiters[o.id].cancel()
			fallthrough
		case "done":
			select {
			case err := <-waiters[o.id].errc:
				if !errors.Is(err, o.err) || (o.err == nil && err != nil) {
					t.Fatalf("step %d %+v: waiter %d returned %v", i, o, o.id, err)
				}
			case <-time.After(hang.Scale(5 * time.Second)): // a hang bound
				t.Fatalf("step %d %+v: waiter %d still waiting after %v (%s)", i, o, o.id, hang.Scale(5*time.Second), hang.How())
			}
		case "close":
			tgt.close()
		default:
			t.Fatalf("step %d: unknown op %q", i, o.op)
		}
		got := tgt.stats()
		if o.op == "give" || o.op == "close" {
			// A waiter this woke adds its wait time when it runs: only its
			// "done" step can check that.
			got.WaitTime = o.st.WaitTime
		}
		if got != o.st {
			t.Fatalf("step %d %+v: stats %+v, want %+v", i, o, got, o.st)
		}
	}
	for _, w := range waiters {
		w.cancel()
	}
}

const ms = time.Millisecond

func TestCreditsStallStats(t *testing.T) {
	tests := []struct {
		name    string
		initial uint64 // the grant at setup, the control reserve included
		ops     []sop
	}{
		{"no stall while credits suffice", 4, []sop{
			{op: "acquire", n: 2},
			{op: "advance", d: 7 * ms},
			{op: "acquire", n: 1},
		}},
		{"one stall, granted after 5ms", 1, []sop{
			{op: "wait", n: 1, id: 1, st: stallStats{Stalls: 1, Waiting: 1}},
			{op: "advance", d: 5 * ms, st: stallStats{Stalls: 1, Waiting: 1}},
			{op: "give", n: 1, st: stallStats{Stalls: 1}},
			{op: "done", id: 1, st: stallStats{Stalls: 1, WaitTime: 5 * ms}},
		}},
		{"a cancelled wait counts its time", 1, []sop{
			{op: "wait", n: 1, id: 1, st: stallStats{Stalls: 1, Waiting: 1}},
			{op: "advance", d: 3 * ms, st: stallStats{Stalls: 1, Waiting: 1}},
			{op: "cancel", id: 1, err: context.Canceled, st: stallStats{Stalls: 1, Cancelled: 1, WaitTime: 3 * ms}},
		}},
		{"two waiters served in order", 2, []sop{
			{op: "wait", n: 2, id: 1, st: stallStats{Stalls: 1, Waiting: 1}},
			{op: "wait", n: 1, id: 2, st: stallStats{Stalls: 2, Waiting: 2}},
			{op: "advance", d: 2 * ms, st: stallStats{Stalls: 2, Waiting: 2}},
			{op: "give", n: 1, st: stallStats{Stalls: 2, Waiting: 1}}, // 2 data credits: the head only
			{op: "done", id: 1, st: stallStats{Stalls: 2, Waiting: 1, WaitTime: 2 * ms}},
			{op: "advance", d: 4 * ms, st: stallStats{Stalls: 2, Waiting: 1, WaitTime: 2 * ms}},
			{op: "give", n: 1, st: stallStats{Stalls: 2, WaitTime: 2 * ms}},
			{op: "done", id: 2, st: stallStats{Stalls: 2, WaitTime: 8 * ms}},
			// A later acquire that fits is not a stall.
			{op: "give", n: 1, st: stallStats{Stalls: 2, WaitTime: 8 * ms}},
			{op: "acquire", n: 1, st: stallStats{Stalls: 2, WaitTime: 8 * ms}},
		}},
		{"close ends a wait", 1, []sop{
			{op: "wait", n: 1, id: 1, st: stallStats{Stalls: 1, Waiting: 1}},
			{op: "advance", d: time.Second, st: stallStats{Stalls: 1, Waiting: 1}},
			{op: "close", st: stallStats{Stalls: 1}},
			{op: "done", id: 1, err: ErrClosed, st: stallStats{Stalls: 1, WaitTime: time.Second}},
			{op: "acquire", n: 1, err: ErrClosed, st: stallStats{Stalls: 1, WaitTime: time.Second}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runStallTable(t, creditsTarget(NewCredits(CreditsConfig{Initial: tt.initial, MaxGrant: 8})), tt.ops)
		})
	}
}

func TestWindowStallStats(t *testing.T) {
	tests := []struct {
		name string
		lim  Limits // the leaf's; the root allows 2 messages, 1000 bytes
		ops  []sop
	}{
		{"no stall while the window has room", Limits{Msgs: 4}, []sop{
			{op: "acquire", n: 100},
			{op: "advance", d: ms},
			{op: "acquire", n: 100},
		}},
		{"full leaf: one stall until a release", Limits{Msgs: 1}, []sop{
			{op: "acquire", n: 10},
			{op: "wait", n: 10, id: 1, st: stallStats{Stalls: 1, Waiting: 1}},
			{op: "advance", d: 9 * ms, st: stallStats{Stalls: 1, Waiting: 1}},
			{op: "give", n: 10, st: stallStats{Stalls: 1}},
			{op: "done", id: 1, st: stallStats{Stalls: 1, WaitTime: 9 * ms}},
		}},
		{"full root stalls the leaf", Limits{}, []sop{
			{op: "acquire", n: 600},
			{op: "wait", n: 600, id: 1, st: stallStats{Stalls: 1, Waiting: 1}}, // 1200 bytes > 1000 at the root
			{op: "advance", d: 2 * ms, st: stallStats{Stalls: 1, Waiting: 1}},
			{op: "cancel", id: 1, err: context.Canceled, st: stallStats{Stalls: 1, Cancelled: 1, WaitTime: 2 * ms}},
			{op: "wait", n: 600, id: 2, st: stallStats{Stalls: 2, Cancelled: 1, Waiting: 1, WaitTime: 2 * ms}},
			{op: "advance", d: 3 * ms, st: stallStats{Stalls: 2, Cancelled: 1, Waiting: 1, WaitTime: 2 * ms}},
			{op: "give", n: 600, st: stallStats{Stalls: 2, Cancelled: 1, WaitTime: 2 * ms}},
			{op: "done", id: 2, st: stallStats{Stalls: 2, Cancelled: 1, WaitTime: 5 * ms}},
		}},
		{"close ends a wait", Limits{Msgs: 1}, []sop{
			{op: "acquire", n: 1},
			{op: "wait", n: 1, id: 1, st: stallStats{Stalls: 1, Waiting: 1}},
			{op: "advance", d: 4 * ms, st: stallStats{Stalls: 1, Waiting: 1}},
			{op: "close", st: stallStats{Stalls: 1}},
			{op: "done", id: 1, err: ErrClosed, st: stallStats{Stalls: 1, WaitTime: 4 * ms}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := NewWindow(Limits{Msgs: 2, Bytes: 1000})
			runStallTable(t, windowTarget(root.NewChild(tt.lim)), tt.ops)
		})
	}
}

// TestWindowWaitingPerLeaf: Waiting counts the waiters queued at that leaf,
// not its siblings'.
func TestWindowWaitingPerLeaf(t *testing.T) {
	root := NewWindow(Limits{Msgs: 1})
	a, b := root.NewChild(Limits{}), root.NewChild(Limits{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := a.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	e1 := acquireAsync(t, ctx, b, 1)
	e2 := acquireAsync(t, ctx, b, 1)
	if wa, wb, wr := a.Stats().Waiting, b.Stats().Waiting, root.Stats().Waiting; wa != 0 || wb != 2 || wr != 0 {
		t.Fatalf("waiting: a %d, b %d, root %d; want 0, 2, 0", wa, wb, wr)
	}
	cancel()
	<-e1
	<-e2
	if w := b.Stats().Waiting; w != 0 {
		t.Fatalf("waiting after cancel: %d", w)
	}
}

// TestAcquiredCountsGiveBack: a waiter granted while its context is being
// cancelled gives what it was granted back, and the Acquired counters
// (and Window's Oversize) give it back too: they count what an Acquire
// returned with, as for a waiter cancelled before its grant.
func TestAcquiredCountsGiveBack(t *testing.T) {
	t.Run("Credits", func(t *testing.T) {
		c := NewCredits(CreditsConfig{Initial: 1})
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- c.Acquire(ctx, 1) }()
		waitStalls(t, func() uint64 { return c.Stats().Stalls }, 1)
		c.mu.Lock()
		cancel()
		waitLockedOut(t, "(*Credits).acquire")
		if err := c.grant(3, 0); err != nil { // grants the waiter, cancelled already
			t.Fatal(err)
		}
		c.mu.Unlock()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire = %v, want context.Canceled", err)
		}
		if _, _, consumed := c.State(); consumed != 0 || c.Stats().Acquired != 0 {
			t.Errorf("after the cancelled waiter: consumed %d, stats %+v; want 0 acquired", consumed, c.Stats())
		}
	})
	t.Run("Window", func(t *testing.T) {
		root := NewWindow(Limits{Msgs: 1, Bytes: 10})
		q := root.NewChild(Limits{})
		if !q.TryAcquire(1) {
			t.Fatal("first TryAcquire failed")
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := acquireAsync(t, ctx, q, 20) // oversize at the root
		root.t.mu.Lock()
		cancel()
		waitLockedOut(t, "(*Window).acquire")
		q.put(1, 1) // Release's body: the waiter is granted, cancelled already
		root.t.dispatch()
		root.t.mu.Unlock()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire = %v, want context.Canceled", err)
		}
		for _, w := range []*Window{root, q} {
			m, b := w.Outstanding()
			if st := w.Stats(); m != 0 || b != 0 || st.Acquired != 1 || st.Oversize != 0 {
				t.Errorf("after the cancelled waiter: %d/%d outstanding, stats %+v; want 0/0, 1 acquired (the TryAcquire), 0 oversize", m, b, st)
			}
		}
	})
}

// waitLockedOut waits until a goroutine in fn is blocked on a mutex (the
// one the test holds).
func waitLockedOut(t *testing.T, fn string) {
	t.Helper()
	ctx, _ := hang.For(t, "", 5*time.Second)
	buf := make([]byte, 1<<20)
	for {
		for g := range strings.SplitSeq(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, fn) && strings.Contains(g, "Mutex).Lock") {
				return
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("no goroutine in %s blocked on the lock: %v", fn, hang.Err(ctx))
		}
		time.Sleep(100 * time.Microsecond)
	}
}
