package flow

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs"
	"github.com/goverbs/goverbs/internal/hang"
)

// TestAcquireNilContext: the blocking acquires refuse a nil context with
// an error naming the method, without panicking or taking anything; on a
// nil receiver the receiver's error comes first.
func TestAcquireNilContext(t *testing.T) {
	var nilCtx context.Context
	c := NewCredits(CreditsConfig{Initial: 10})
	root := NewWindow(Limits{Msgs: 4})
	q := root.NewChild(Limits{})
	_, epochErr := c.AcquireEpoch(nilCtx, 1)
	for name, err := range map[string]error{
		"Credits.Acquire":      c.Acquire(nilCtx, 1),
		"Credits.AcquireEpoch": epochErr,
		"Window.Acquire":       q.Acquire(nilCtx, 1),
		"Window.AcquireN":      q.AcquireN(nilCtx, 2, 1),
	} {
		if err == nil || !strings.Contains(err.Error(), name+": nil context") {
			t.Errorf("%s(nil ctx): %v, want an error naming %s and the nil context", name, err, name)
		}
	}
	if _, _, consumed := c.State(); consumed != 0 {
		t.Errorf("Credits consumed %d after nil-context acquires, want 0", consumed)
	}
	if m, _ := root.Outstanding(); m != 0 {
		t.Errorf("Window: %d messages outstanding after nil-context acquires, want 0", m)
	}
	if err := (*Credits)(nil).Acquire(nilCtx, 1); !errors.Is(err, goverbs.ErrNil) {
		t.Errorf("nil Credits, nil ctx: %v, want goverbs.ErrNil", err)
	}
	if err := (*Window)(nil).AcquireN(nilCtx, 1, 1); !errors.Is(err, goverbs.ErrNil) {
		t.Errorf("nil Window, nil ctx: %v, want goverbs.ErrNil", err)
	}
}

// TestNewChildTooDeep: a tree is at most maxDepth windows deep; NewChild
// below that returns nil (as for a nil parent) instead of panicking.
func TestNewChildTooDeep(t *testing.T) {
	w := NewWindow(Limits{})
	for i := 1; i < maxDepth; i++ {
		if w = w.NewChild(Limits{}); w == nil {
			t.Fatalf("NewChild at depth %d: nil, want a window", i+1)
		}
	}
	if c := w.NewChild(Limits{}); c != nil {
		t.Fatalf("NewChild below %d levels: %p, want nil", maxDepth, c)
	}
	if !w.TryAcquire(1) || w.Release(1) != nil {
		t.Error("the deepest window does not work")
	}
}

// TestNewDedupHugeWindow: an out-of-range window is clamped, not a
// makeslice panic; a negative one is the minimum.
func TestNewDedupHugeWindow(t *testing.T) {
	for _, tt := range []struct{ window, want int }{
		{math.MaxInt, maxDedupWindow}, {maxDedupWindow + 1, maxDedupWindow}, {maxDedupWindow, maxDedupWindow},
		{-1, 64}, {math.MinInt, 64},
	} {
		d := NewDedup(tt.window, 7)
		if got := d.Window(); got != tt.want {
			t.Errorf("NewDedup(%d).Window() = %d, want %d", tt.window, got, tt.want)
		}
		if d.Accept(7+uint64(tt.want)) || !d.Accept(7+uint64(tt.want)-1) || !d.Accept(7) {
			t.Errorf("NewDedup(%d): window edges wrong", tt.window)
		}
	}
}

// TestReturnerHugeCounts: a count so large that adding it to the
// counters wraps around is refused (ErrOverrun, ErrOverRelease) and
// changes nothing.
func TestReturnerHugeCounts(t *testing.T) {
	r, err := NewReturner(ReturnerConfig{Grant: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Consumed(3); err != nil {
		t.Fatal(err)
	}
	if err := r.Released(1); err != nil {
		t.Fatal(err)
	}
	for _, n := range []uint64{math.MaxUint64, math.MaxUint64 - 2, 6} {
		if err := r.Consumed(n); !errors.Is(err, ErrOverrun) {
			t.Errorf("Consumed(%d) with 3 of 8 consumed: %v, want ErrOverrun", n, err)
		}
	}
	for _, n := range []uint64{math.MaxUint64, math.MaxUint64 - 1, 3} {
		if err := r.Released(n); !errors.Is(err, ErrOverRelease) {
			t.Errorf("Released(%d) with 1 of 3 re-posted: %v, want ErrOverRelease", n, err)
		}
		if err := r.ReleasedControl(n); !errors.Is(err, ErrOverRelease) {
			t.Errorf("ReleasedControl(%d) with 1 of 3 re-posted: %v, want ErrOverRelease", n, err)
		}
	}
	if _, granted, told, consumed := r.State(); granted != 9 || told != 8 || consumed != 3 {
		t.Errorf("state granted %d told %d consumed %d, want 9, 8, 3", granted, told, consumed)
	}
	if err := r.Consumed(5); err != nil { // exactly what is left
		t.Errorf("Consumed(5) with 3 of 8 consumed: %v", err)
	}
	if err := r.Released(7); err != nil { // exactly what is left
		t.Errorf("Released(7) with 1 of 8 re-posted: %v", err)
	}
}

// TestWindowHugeCounts: a request that would carry a window's count past
// MaxInt64 does not fit (the sum wrapped negative and was admitted, under
// a limit or not); a blocking one waits and is admitted once the window
// drains.
func TestWindowHugeCounts(t *testing.T) {
	w := NewWindow(Limits{Msgs: 10, Bytes: 100})
	if !w.TryAcquire(50) {
		t.Fatal("TryAcquire(50) under a 100-byte limit refused")
	}
	if w.TryAcquire(math.MaxInt64) {
		t.Error("TryAcquire(MaxInt64) with 50 of 100 bytes outstanding admitted")
	}
	if w.TryAcquireN(math.MaxInt64, 1) {
		t.Error("TryAcquireN(MaxInt64, 1) with 1 of 10 messages outstanding admitted")
	}
	if m, b := w.Outstanding(); m != 1 || b != 50 {
		t.Errorf("outstanding %d messages, %d bytes, want 1, 50", m, b)
	}

	root := NewWindow(Limits{}) // unlimited
	leaf := root.NewChild(Limits{})
	if !leaf.TryAcquire(math.MaxInt64) {
		t.Fatal("TryAcquire(MaxInt64) on an empty unlimited window refused")
	}
	if leaf.TryAcquire(1) || root.TryAcquire(1) {
		t.Error("TryAcquire(1) with MaxInt64 bytes outstanding admitted")
	}
	if m, b := root.Outstanding(); m != 1 || b != math.MaxInt64 {
		t.Errorf("root outstanding %d messages, %d bytes, want 1, MaxInt64", m, b)
	}
	done := make(chan error, 1)
	go func() { done <- leaf.Acquire(context.Background(), 1) }()
	for deadline := time.Now().Add(hang.Scale(5 * time.Second)); leaf.Stats().Waiting != 1; time.Sleep(time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("Acquire(1) with MaxInt64 bytes outstanding returned without waiting: %v", err)
		default:
		}
		if time.Now().After(deadline) { // a hang bound
			t.Fatalf("Acquire(1) neither returned nor queued (%s)", hang.How())
		}
	}
	if err := leaf.Release(math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Acquire(1) after the release: %v", err)
		}
	case <-time.After(hang.Scale(5 * time.Second)): // a hang bound
		t.Fatal("Acquire(1) not admitted after the window drained")
	}
	if m, b := root.Outstanding(); m != 1 || b != 1 {
		t.Errorf("root outstanding %d messages, %d bytes, want 1, 1", m, b)
	}
}

// TestDedupNilAndZero: a nil Dedup and a zero one agree with each other
// and with Accept: every sequence is Ahead, none is delivered.
func TestDedupNilAndZero(t *testing.T) {
	for name, d := range map[string]*Dedup{"nil": nil, "zero": new(Dedup)} {
		for _, seq := range []uint64{0, 1, math.MaxUint64} {
			if v := d.Offer(seq); v != Ahead {
				t.Errorf("%s Dedup: Offer(%d) = %v, want %v", name, seq, v, Ahead)
			}
			if d.Accept(seq) {
				t.Errorf("%s Dedup: Accept(%d) = true, want false", name, seq)
			}
		}
	}
}
