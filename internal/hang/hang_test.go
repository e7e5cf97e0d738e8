package hang

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// TestCalibrate logs this machine's calibration loop time and factor: the
// reference constants come from it.
func TestCalibrate(t *testing.T) {
	d := Calibrate()
	if d <= 0 {
		t.Fatalf("calibration loop took %v", d)
	}
	f := Factor()
	if f < 1 || (f > MaxFactor && !strings.Contains(How(), "GOVERBS_TEST_SLOWDOWN")) {
		t.Fatalf("factor %v out of [1, %d]: %s", f, MaxFactor, How())
	}
	t.Logf("loop %v; %s", d, How())
}

func TestScale(t *testing.T) {
	if got, want := Scale(time.Minute), time.Duration(float64(time.Minute)*Factor()); got != want {
		t.Fatalf("Scale(1m) = %v, want %v", got, want)
	}
	if Scale(time.Second) < time.Second {
		t.Fatalf("Scale shrank a bound: %v", Scale(time.Second))
	}
}

// A watched context that sees no progress ends with an *Error naming the
// work, the wait and the progress seen.
func TestWatchEndsWithoutProgress(t *testing.T) {
	var dump strings.Builder
	dumpOut = &dump
	dumps.Store(0)
	defer func() { dumpOut = nil }()
	blocked := make(chan struct{})
	defer close(blocked)
	go blockedWorker(blocked)
	ctx, w := Watch(context.Background(), "test work", 20*time.Millisecond)
	defer w.Stop()
	w.Note("step %d", 1)
	w.Progress()
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute): // the test's own hang bound
		t.Fatal("watchdog did not fire within a minute of no progress")
	}
	var e *Error
	if !errors.As(Err(ctx), &e) {
		t.Fatalf("cause %v, want *Error", Err(ctx))
	}
	if e.Steps != 2 || e.Note != "step 1" || e.Waited < e.Idle {
		t.Fatalf("error %+v: want 2 steps, note \"step 1\", waited >= idle", e)
	}
	for _, s := range []string{"test work", "no progress for", "waited", "2 steps", "last: step 1", "speed factor"} {
		if !strings.Contains(e.Error(), s) {
			t.Errorf("message %q lacks %q", e.Error(), s)
		}
	}
	// The dump was written before the context ended, and shows the
	// goroutine the work was stuck in.
	for _, s := range []string{"=== hang: test work: no progress", "hang.blockedWorker", "=== end of goroutines"} {
		if !strings.Contains(dump.String(), s) {
			t.Errorf("goroutine dump lacks %q:\n%.2000s", s, dump.String())
		}
	}
}

// blockedWorker is a goroutine stuck the way hung work is, for the dump.
func blockedWorker(c chan struct{}) { <-c }

// Progress keeps a watched context alive past its idle period many times
// over, and Stop ends it with context.Canceled, not a hang.
func TestWatchProgressKeepsAlive(t *testing.T) {
	const idle = 200 * time.Millisecond
	ctx, w := Watch(context.Background(), "busy work", idle)
	end := time.Now().Add(3 * Scale(idle))
	for time.Now().Before(end) {
		w.Progress()
		if ctx.Err() != nil {
			t.Fatalf("ended despite progress: %v", Err(ctx))
		}
		time.Sleep(10 * time.Millisecond)
	}
	w.Stop()
	w.Stop() // idempotent
	if !errors.Is(Err(ctx), context.Canceled) {
		t.Fatalf("after Stop: %v, want context.Canceled", Err(ctx))
	}
}

// Output through Writer counts as progress.
func TestWriterIsProgress(t *testing.T) {
	_, w := Watch(context.Background(), "tool", time.Minute)
	defer w.Stop()
	var b strings.Builder
	pw := w.Writer(&b)
	pw.Write([]byte("a"))
	pw.Write([]byte("b"))
	if b.String() != "ab" || w.Steps() != 2 {
		t.Fatalf("wrote %q, %d steps; want \"ab\", 2", b.String(), w.Steps())
	}
}

func TestSlowdownOverride(t *testing.T) {
	t.Setenv("GOVERBS_TEST_SLOWDOWN", "2.5")
	if f, how := measure(); f != 2.5 || !strings.Contains(how, "GOVERBS_TEST_SLOWDOWN") {
		t.Fatalf("measure() = %v, %q; want 2.5 from GOVERBS_TEST_SLOWDOWN", f, how)
	}
}

// A bound too large to stretch stays the largest Duration instead of
// wrapping to a negative one (a deadline already passed).
func TestScaleSaturates(t *testing.T) {
	for _, d := range []time.Duration{math.MaxInt64, math.MaxInt64 / 2} {
		if got := Scale(d); got < d {
			t.Errorf("Scale(%d) = %d, want at least %d", d, got, d)
		}
	}
}

// An idle period too short for a tick (under 8 ns after scaling, zero or
// negative) ends the context for want of progress instead of panicking
// in the watchdog's goroutine.
func TestWatchTinyIdle(t *testing.T) {
	t.Setenv("GOVERBS_HANG_DUMP", "0")
	for _, idle := range []time.Duration{-time.Second, 0, 1} {
		ctx, w := Watch(context.Background(), "tiny", idle)
		select {
		case <-ctx.Done():
		case <-time.After(time.Minute): // the test's own hang bound
			t.Fatalf("idle %v: watchdog did not fire within a minute", idle)
		}
		var e *Error
		if !errors.As(Err(ctx), &e) {
			t.Errorf("idle %v: cause %v, want *Error", idle, Err(ctx))
		}
		w.Stop()
	}
}
