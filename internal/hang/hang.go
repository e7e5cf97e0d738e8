// Package hang bounds tests by progress, not by speed.
//
// Machines of one kind differ 2-4x in speed, and a loaded one (two TCG
// guests on two cores, the race detector) is slower again. A test bound
// must catch a hang, never fail a correct run because it was slow. So:
//
//   - Watch gives a context that ends when the work it watches has made no
//     progress for an idle period (scaled by Factor), however long the
//     whole run takes. Its cause says how long it waited in all and how
//     much progress it saw.
//   - Where only a total bound can be had (a tool that prints once, at its
//     end), Scale stretches the bound by Factor, the speed of this machine
//     now against the one the bounds were written on.
//
// Factor is measured once per process with a fixed CPU loop (median of
// five runs, so another process's load counts) against the time the same
// loop took on the reference machine. The loop is register-only: the race
// detector does not slow it, and qemu's TCG translates it to about native
// speed (8.4 ms in the rxe guest, 8.5 ms on its host), so one reference
// serves the host and the guest. GOVERBS_TEST_SLOWDOWN=F sets it instead.
package hang

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The calibration loop's length, and its time on the machine the test
// bounds were written on (the fastest of runs of `go test -run
// TestCalibrate -v ./internal/hang` on a 2-core machine of the project's
// kind, on the host and in the guest).
const (
	loopIters = 1 << 22
	reference = 8500 * time.Microsecond
)

// MaxFactor caps the measured factor: a machine measured slower than that
// is a measurement gone wrong, not a reason to wait forever.
const MaxFactor = 8

var (
	factorOnce sync.Once
	factor     float64
	factorHow  string
)

// Factor returns how many times slower than the reference machine this
// one runs now: at least 1, at most MaxFactor (unless set by
// GOVERBS_TEST_SLOWDOWN).
func Factor() float64 {
	factorOnce.Do(func() { factor, factorHow = measure() })
	return factor
}

// How says where Factor came from, for logs and failure messages.
func How() string {
	Factor()
	return factorHow
}

func measure() (float64, string) {
	if s := os.Getenv("GOVERBS_TEST_SLOWDOWN"); s != "" {
		if f, err := strconv.ParseFloat(s, 64); err == nil && f > 0 {
			return f, fmt.Sprintf("speed factor %.2g (GOVERBS_TEST_SLOWDOWN)", f)
		}
	}
	d := Calibrate()
	f := min(max(float64(d)/float64(reference), 1), MaxFactor)
	return f, fmt.Sprintf("speed factor %.2g (calibration loop %v, reference %v)", f, d.Round(10*time.Microsecond), reference)
}

// Calibrate runs the calibration loop five times (after one warm-up) and
// returns the median time of one run.
func Calibrate() time.Duration {
	var ds [5]time.Duration
	sink.Store(spin(loopIters / 8))
	for i := range ds {
		t0 := time.Now()
		sink.Add(spin(loopIters))
		ds[i] = time.Since(t0)
	}
	s := ds[:]
	slices.Sort(s)
	return s[len(s)/2]
}

// sink keeps the compiler from dropping the loop.
var sink atomic.Uint64

// spin is register-only work (xorshift), so the race detector, which
// instruments memory accesses, does not change its time.
func spin(n int) uint64 {
	x := uint64(88172645463325252)
	for range n {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	return x
}

// Scale returns d stretched by Factor; a product past the largest
// Duration is the largest Duration (a bound of forever, not a negative
// one that has already passed).
func Scale(d time.Duration) time.Duration {
	s := float64(d) * Factor()
	if s >= math.MaxInt64 { // float64(MaxInt64) is 2^63: converting it overflows
		return math.MaxInt64
	}
	return time.Duration(s)
}

// Error is the cause of a Watch context that ended for want of progress.
type Error struct {
	What   string        // the work watched
	Idle   time.Duration // the bound on time without progress (scaled)
	Waited time.Duration // since Watch began
	Steps  int64         // progress steps seen
	Note   string        // what the watched work last said of itself (Watchdog.Note)
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: no progress for %v (a hang; %s): waited %v in all, %d steps of progress seen",
		e.What, e.Idle.Round(time.Second), How(), e.Waited.Round(time.Second), e.Steps)
	if e.Note != "" {
		s += ", last: " + e.Note
	}
	return s
}

// A Watchdog ends its context when Progress has not been called for its
// idle period.
type Watchdog struct {
	what   string
	idle   time.Duration
	start  time.Time
	last   atomic.Int64 // the last progress, as time since start (monotonic: a wall clock step, NTP in a guest, is no hang)
	steps  atomic.Int64
	note   atomic.Pointer[string]
	cancel context.CancelCauseFunc
	done   chan struct{}
	once   sync.Once
}

// Watch returns a context derived from parent that ends, with an *Error
// as its cause (context.Cause), once the work has made no progress for
// Scale(idle) (at once for an idle period of zero or less). Stop releases
// it.
func Watch(parent context.Context, what string, idle time.Duration) (context.Context, *Watchdog) {
	ctx, cancel := context.WithCancelCause(parent)
	w := &Watchdog{what: what, idle: Scale(idle), start: time.Now(), cancel: cancel, done: make(chan struct{})}
	go w.run(ctx)
	return ctx, w
}

// For is Watch for a test: the watchdog stops when the test ends. An empty
// what names the test.
func For(t testing.TB, what string, idle time.Duration) (context.Context, *Watchdog) {
	t.Helper()
	if what == "" {
		what = t.Name()
	}
	ctx, w := Watch(context.Background(), what, idle)
	t.Cleanup(w.Stop)
	return ctx, w
}

func (w *Watchdog) run(ctx context.Context) {
	tick := time.NewTicker(max(min(w.idle/8, time.Second), 1)) // NewTicker panics at <= 0
	defer tick.Stop()
	for {
		select {
		case <-w.done:
			return
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if now.Sub(w.start)-time.Duration(w.last.Load()) >= w.idle {
				e := w.err(now)
				dumpStacks(e)
				w.cancel(e)
				return
			}
		}
	}
}

func (w *Watchdog) err(now time.Time) *Error {
	e := &Error{What: w.what, Idle: w.idle, Waited: now.Sub(w.start), Steps: w.steps.Load()}
	if n := w.note.Load(); n != nil {
		e.Note = *n
	}
	return e
}

// maxDumps bounds the goroutine dumps one process writes (the first
// hang's is the one that tells most; later ones are often its echo).
const maxDumps = 2

var (
	dumps   atomic.Int32
	dumpOut io.Writer // tests; nil: os.Stderr
)

// dumpStacks writes every goroutine's stack to stderr when a watchdog
// fires, before its context ends: what the hung work was blocked on, as
// it was blocked (after the cancel the waiters unwind). A hang in CI is
// then diagnosed from its log, not by reproducing it. GOVERBS_HANG_DUMP=0
// turns it off.
func dumpStacks(e *Error) {
	if os.Getenv("GOVERBS_HANG_DUMP") == "0" || dumps.Add(1) > maxDumps {
		return
	}
	out := dumpOut
	if out == nil {
		out = os.Stderr
	}
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	fmt.Fprintf(out, "=== hang: %v\n=== goroutines of pid %d when the watchdog fired (%d bytes%s):\n%s\n=== end of goroutines\n",
		e, os.Getpid(), n, map[bool]string{true: ", cut at 1 MiB"}[n == len(buf)], buf[:n])
	dumpersMu.Lock()
	ds := append([]func(io.Writer){}, dumpers...)
	dumpersMu.Unlock()
	if len(ds) > 0 {
		fmt.Fprintf(out, "=== state when the watchdog fired:\n")
		for _, d := range ds {
			d(out)
		}
		fmt.Fprintf(out, "=== end of state\n")
	}
}

var (
	dumpersMu sync.Mutex
	dumpers   []func(io.Writer)
)

// OnDump adds f to what a firing watchdog writes after the goroutines: the
// state of the work it watched as the work itself describes it (bx's
// credits and windows, say), which stacks alone do not show. Call it from
// TestMain or init.
func OnDump(f func(io.Writer)) {
	if f == nil {
		return
	}
	dumpersMu.Lock()
	dumpers = append(dumpers, f)
	dumpersMu.Unlock()
}

// Progress records one step of progress.
func (w *Watchdog) Progress() {
	w.steps.Add(1)
	w.last.Store(int64(time.Since(w.start)))
}

// Note records progress and says what was done, for the failure message.
func (w *Watchdog) Note(format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	w.note.Store(&s)
	w.Progress()
}

// Steps returns the progress steps seen so far.
func (w *Watchdog) Steps() int64 { return w.steps.Load() }

// Stop releases the watchdog and cancels its context.
func (w *Watchdog) Stop() {
	w.once.Do(func() {
		close(w.done)
		w.cancel(context.Canceled)
	})
}

// Err returns the reason ctx ended: the watchdog's *Error when it was a
// hang, else ctx.Err(). Use it in failure messages instead of ctx.Err().
func Err(ctx context.Context) error {
	if c := context.Cause(ctx); c != nil {
		return c
	}
	return ctx.Err()
}

// Writer counts every write as progress: a subprocess whose output goes
// through it is watched by what it prints.
func (w *Watchdog) Writer(dst interface{ Write([]byte) (int, error) }) *ProgressWriter {
	return &ProgressWriter{w: w, dst: dst}
}

// ProgressWriter is Watchdog.Writer's io.Writer.
type ProgressWriter struct {
	w   *Watchdog
	dst interface{ Write([]byte) (int, error) }
	mu  sync.Mutex
}

func (p *ProgressWriter) Write(b []byte) (int, error) {
	p.w.Progress()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dst.Write(b)
}

// Cause returns err, with the watchdog's reason added when ctx ended for
// want of progress, so a failure says how long it waited and what it saw
// instead of a bare "context deadline exceeded" or "i/o timeout". A nil
// err stays nil.
func Cause(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if c := context.Cause(ctx); errors.As(c, &e) && !errors.Is(err, e) {
		return fmt.Errorf("%w (%v)", err, e)
	}
	return err
}
