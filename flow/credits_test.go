package flow

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goverbs/goverbs"
	"github.com/goverbs/goverbs/internal/hang"
)

// cop is one step of a Credits table test; avail is Available() after it.
type cop struct {
	op    string // grant, try, ctl, reset, resync
	a, b  uint64 // grant: cumulative; try: n; resync: granted, consumed
	epoch uint32
	ok    bool  // try, ctl
	err   error // grant, reset, resync (errors.Is; nil means none)
	avail uint64
}

func TestCreditsTable(t *testing.T) {
	tests := []struct {
		name string
		cfg  CreditsConfig
		ops  []cop
	}{
		{"acquire and grant", CreditsConfig{Initial: 4, MaxGrant: 4}, []cop{
			{op: "try", a: 2, ok: true, avail: 1},
			{op: "try", a: 2, ok: false, avail: 1},
			{op: "try", a: 1, ok: true, avail: 0},
			{op: "try", a: 1, ok: false, avail: 0}, // the reserve is not for data
			{op: "try", a: 0, ok: true, avail: 0},
			{op: "ctl", ok: true, avail: 0}, // the reserve is for control
			{op: "ctl", ok: false, avail: 0},
			{op: "grant", a: 6, avail: 1},
			{op: "grant", a: 5, avail: 1},                          // reordered: stale
			{op: "grant", a: 6, avail: 1},                          // duplicate
			{op: "grant", a: 9, err: ErrImpossibleGrant, avail: 1}, // 5 outstanding > 4 posted
			{op: "grant", a: 8, epoch: 1, err: ErrEpochAhead, avail: 1},
			{op: "grant", a: 8, avail: 3},
			{op: "ctl", ok: true, avail: 2}, // control uses any credit
		}},
		{"in-order grants", CreditsConfig{Initial: 4, InOrderGrants: true}, []cop{
			{op: "try", a: 3, ok: true, avail: 0},
			{op: "grant", a: 6, avail: 2},
			{op: "grant", a: 6, avail: 2},
			{op: "grant", a: 5, err: ErrGrantBackwards, avail: 2},
		}},
		{"epochs", CreditsConfig{Initial: 8, MaxGrant: 8}, []cop{
			{op: "try", a: 7, ok: true, avail: 0},
			{op: "ctl", ok: true, avail: 0},
			// Receiver saw 6 of our 8: two were lost with the QP.
			{op: "resync", a: 10, b: 6, epoch: 1, avail: 3},
			{op: "grant", a: 20, epoch: 0, avail: 3}, // older epoch: ignored
			{op: "grant", a: 12, epoch: 1, avail: 5},
			{op: "resync", a: 12, b: 6, epoch: 1, err: ErrStaleEpoch, avail: 5},
			{op: "resync", a: 5, b: 6, epoch: 2, err: ErrImpossibleGrant, avail: 5},
			{op: "resync", a: 20, b: 6, epoch: 2, err: ErrImpossibleGrant, avail: 5},
			{op: "reset", epoch: 1, err: ErrStaleEpoch, avail: 5},
			{op: "reset", epoch: 3, avail: 0},
			{op: "grant", a: 12, epoch: 1, avail: 0},
			{op: "grant", a: 8, epoch: 3, avail: 7},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCredits(tt.cfg)
			for i, o := range tt.ops {
				var err error
				switch o.op {
				case "grant":
					err = c.Grant(o.a, o.epoch)
				case "try":
					if got := c.TryAcquire(o.a); got != o.ok {
						t.Fatalf("step %d %+v: TryAcquire = %v", i, o, got)
					}
				case "ctl":
					if got := c.TryAcquireControl(); got != o.ok {
						t.Fatalf("step %d %+v: TryAcquireControl = %v", i, o, got)
					}
				case "reset":
					err = c.Reset(o.epoch)
				case "resync":
					err = c.Resync(o.epoch, o.a, o.b)
				default:
					t.Fatalf("bad op %q", o.op)
				}
				if (o.err == nil) != (err == nil) || (o.err != nil && !errors.Is(err, o.err)) {
					t.Fatalf("step %d %+v: err = %v", i, o, err)
				}
				if got := c.Available(); got != o.avail {
					e, g, n := c.State()
					t.Fatalf("step %d %+v: Available = %d, want %d (epoch %d granted %d consumed %d)",
						i, o, got, o.avail, e, g, n)
				}
			}
		})
	}
}

// waitStalls waits until n Acquire calls are queued (counted as stalls).
func waitStalls(t *testing.T, stalls func() uint64, n uint64) {
	t.Helper()
	limit := hang.Scale(5 * time.Second) // a hang bound
	deadline := time.Now().Add(limit)
	for stalls() < n {
		if time.Now().After(deadline) {
			t.Fatalf("waiters never queued: %d of %d in %v (%s)", stalls(), n, limit, hang.How())
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func TestCreditsAcquireFIFO(t *testing.T) {
	c := NewCredits(CreditsConfig{Initial: 1, MaxGrant: 8})
	ctx := context.Background()
	order := make(chan int, 2)
	go func() {
		if err := c.Acquire(ctx, 3); err != nil {
			t.Error(err)
		}
		order <- 3
	}()
	waitStalls(t, func() uint64 { return c.Stats().Stalls }, 1)
	go func() {
		if err := c.Acquire(ctx, 1); err != nil {
			t.Error(err)
		}
		order <- 1
	}()
	waitStalls(t, func() uint64 { return c.Stats().Stalls }, 2)
	// One data credit: the small waiter must not overtake the large one,
	// nor may TryAcquire barge.
	if err := c.Grant(2, 0); err != nil {
		t.Fatal(err)
	}
	if c.TryAcquire(1) {
		t.Fatal("TryAcquire barged past waiters")
	}
	select {
	case n := <-order:
		t.Fatalf("waiter %d served out of order", n)
	case <-time.After(20 * time.Millisecond):
	}
	if err := c.Grant(4, 0); err != nil { // 3 data credits: the head only
		t.Fatal(err)
	}
	if n := <-order; n != 3 {
		t.Fatalf("waiter %d served first, want 3", n)
	}
	select {
	case <-order:
		t.Fatal("second waiter served without credits")
	case <-time.After(10 * time.Millisecond):
	}
	if err := c.Grant(5, 0); err != nil {
		t.Fatal(err)
	}
	if n := <-order; n != 1 {
		t.Fatalf("served %d, want 1", n)
	}
	if got := c.Available(); got != 0 {
		t.Fatalf("Available = %d, want 0", got)
	}
}

func TestCreditsAcquireCancel(t *testing.T) {
	c := NewCredits(CreditsConfig{Initial: 1, MaxGrant: 8})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Acquire(ctx, 5) }()
	waitStalls(t, func() uint64 { return c.Stats().Stalls }, 1)
	small := make(chan error, 1)
	go func() { small <- c.Acquire(context.Background(), 1) }()
	waitStalls(t, func() uint64 { return c.Stats().Stalls }, 2)
	if err := c.Grant(3, 0); err != nil { // 2 data credits: not enough for the head
		t.Fatal(err)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire = %v", err)
	}
	if err := <-small; err != nil { // unblocked by the head leaving
		t.Fatal(err)
	}
	if got := c.Available(); got != 1 {
		t.Fatalf("Available = %d, want 1: the cancelled waiter consumed", got)
	}
	// Already-cancelled contexts fail fast and take nothing.
	if err := c.Acquire(ctx, 1); !errors.Is(err, context.Canceled) || c.Available() != 1 {
		t.Fatalf("Acquire(done ctx) = %v, Available %d", err, c.Available())
	}
	if err := c.Acquire(context.Background(), 8); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Acquire(8) with 8 posted = %v, want ErrTooLarge", err)
	}
	if st := c.Stats(); st.Cancelled != 1 || st.Stalls != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCreditsClose(t *testing.T) {
	c := NewCredits(CreditsConfig{Initial: 1})
	errc := make(chan error, 1)
	go func() { errc <- c.Acquire(context.Background(), 1) }()
	waitStalls(t, func() uint64 { return c.Stats().Stalls }, 1)
	c.Close()
	c.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Fatalf("Acquire after Close = %v", err)
	}
	if err := c.Grant(5, 0); !errors.Is(err, ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Fatalf("Grant after Close = %v", err)
	}
	if c.TryAcquire(0) || c.TryAcquireControl() {
		t.Fatal("acquired after Close")
	}
}

// TestCreditsConcurrent: many goroutines acquire and return credits through
// a granter; outstanding never exceeds the data credits, every acquire
// without a deadline is satisfied, cancelled ones take nothing.
func TestCreditsConcurrent(t *testing.T) {
	const (
		posted     = 16
		goroutines = 32
		iters      = 300
	)
	c := NewCredits(CreditsConfig{Initial: posted, MaxGrant: posted, InOrderGrants: true})
	returns := make(chan uint64, goroutines)
	granterDone := make(chan struct{})
	go func() { // the receiver: re-posts and grants in order
		defer close(granterDone)
		cum := uint64(posted)
		for n := range returns {
			cum += n
			if err := c.Grant(cum, 0); err != nil {
				t.Error(err)
			}
		}
	}()
	var out, maxOut, timeouts atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range iters {
				n := uint64(1 + (g+i)%3)
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if (g+i)%7 == 0 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(i%5)*time.Microsecond)
				}
				err := c.Acquire(ctx, n)
				cancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("Acquire: %v", err)
						return
					}
					timeouts.Add(1)
					continue
				}
				o := out.Add(int64(n))
				if o > posted-ControlReserve {
					t.Errorf("outstanding %d > %d data credits", o, posted-ControlReserve)
				}
				for m := maxOut.Load(); o > m && !maxOut.CompareAndSwap(m, o); m = maxOut.Load() {
				}
				out.Add(-int64(n))
				returns <- n
			}
		})
	}
	wg.Wait()
	close(returns)
	<-granterDone
	if got := c.Available(); got != posted-ControlReserve {
		e, g, n := c.State()
		t.Fatalf("Available = %d after all returned, want %d (epoch %d granted %d consumed %d)",
			got, posted-ControlReserve, e, g, n)
	}
	st := c.Stats()
	t.Logf("max outstanding %d, timeouts %d, stats %+v", maxOut.Load(), timeouts.Load(), st)
}

// TestCreditsAcquireEpoch: AcquireEpoch names the epoch the credits were
// consumed in, for an immediate grant and for a waiter granted after a
// Resync moved to a new epoch.
func TestCreditsAcquireEpoch(t *testing.T) {
	c := NewCredits(CreditsConfig{Epoch: 3, Initial: 3})
	ctx := context.Background()
	if e, err := c.AcquireEpoch(ctx, 2); err != nil || e != 3 {
		t.Fatalf("immediate: epoch %d, %v; want 3", e, err)
	}
	type res struct {
		epoch uint32
		err   error
	}
	done := make(chan res, 1)
	go func() {
		e, err := c.AcquireEpoch(ctx, 1)
		done <- res{e, err}
	}()
	for c.Stats().Stalls == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := c.Resync(5, 10, 0); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.epoch != 5 {
		t.Fatalf("after resync: epoch %d, %v; want 5", r.epoch, r.err)
	}
	if _, granted, consumed := c.State(); granted != 10 || consumed != 1 {
		t.Errorf("state granted %d consumed %d, want 10 and 1", granted, consumed)
	}
	c.Close()
	if _, err := c.AcquireEpoch(ctx, 1); !errors.Is(err, ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}
