// Package leakcheck finds goroutines that outlive the Close of what
// started them: a test takes a Baseline, makes and closes its objects,
// and Check waits (bounded by hang.Scale, a hang bound, not a speed
// bound) for the goroutine count to come back to it. On failure it
// prints the stacks of the goroutines that were not there at the
// baseline (pprof's goroutine profile, debug=1, grouped by stack).
package leakcheck

import (
	"bytes"
	"fmt"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
)

// Bound is how long Check waits for goroutines to exit after a Close
// (scaled by hang.Factor): what Close started should be gone when it
// returns, or at once after; this only absorbs the scheduler.
const Bound = 10 * time.Second

// ignored are goroutines that come and go with the test harness, not
// with what a test checks: a hang watchdog (hang.For, hang.Watch) and
// the testing package's own, and the goroutine taking the profile (a
// subtest's checks a baseline its parent took).
var ignored = []string{
	"internal/leakcheck.stacks",
	"internal/hang.(*Watchdog).run",
	"testing.(*T).Run",
	"testing.tRunner.func",
	"testing.runFuzzTests",
	"os/signal.signal_recv",
}

// A Baseline is the goroutines running when it was taken.
type Baseline struct {
	n      int
	stacks map[string]int
}

// Take records the goroutines running now.
func Take() Baseline {
	s := stacks()
	return Baseline{n: count(s), stacks: s}
}

// Check fails t unless the goroutines (the ignored ones aside) are back
// to b within Bound (scaled): after what, e.g. "close of 5 endpoints".
func (b Baseline) Check(t testing.TB, what string) {
	t.Helper()
	if leaked := b.Wait(Bound); leaked != "" {
		t.Errorf("%s: goroutines outlived it (%d at the baseline):\n%s", what, b.n, leaked)
	}
}

// Wait polls until the goroutines are back to b and returns "", or, once
// d (scaled) has passed, returns the stacks of the goroutines not in b.
func (b Baseline) Wait(d time.Duration) string {
	deadline := time.Now().Add(hang.Scale(d))
	for {
		s := stacks()
		if count(s) <= b.n {
			return ""
		}
		if time.Now().After(deadline) {
			return b.diff(s)
		}
		runtime.Gosched()
		time.Sleep(10 * time.Millisecond)
	}
}

// diff describes the goroutines of now that b does not have.
func (b Baseline) diff(now map[string]int) string {
	var out strings.Builder
	total := 0
	for st, n := range now {
		if extra := n - b.stacks[st]; extra > 0 && !isIgnored(st) {
			total += extra
			fmt.Fprintf(&out, "%d more of:\n%s\n", extra, st)
		}
	}
	return fmt.Sprintf("%d goroutines more than at the baseline:\n%s", total, out.String())
}

// stacks returns the goroutine profile grouped by stack, each stack's
// text (frames, no addresses) mapped to its count.
func stacks() map[string]int {
	var buf bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&buf, 1)
	m := map[string]int{}
	// "goroutine profile: total N", then records "N @ addrs\n#\tframe..."
	// separated by blank lines.
	for _, rec := range strings.Split(buf.String(), "\n\n") {
		rec = strings.TrimSpace(rec)
		head, body, ok := strings.Cut(rec, "\n")
		if !ok || strings.HasPrefix(head, "goroutine profile") {
			if strings.HasPrefix(head, "goroutine profile") {
				// The first record follows the profile's header line.
				head, body, ok = strings.Cut(body, "\n")
				if !ok {
					continue
				}
			} else {
				continue
			}
		}
		ns, _, _ := strings.Cut(head, " @")
		n, err := strconv.Atoi(strings.TrimSpace(ns))
		if err != nil {
			continue
		}
		m[body] += n
	}
	return m
}

func isIgnored(stack string) bool {
	for _, s := range ignored {
		if strings.Contains(stack, s) {
			return true
		}
	}
	return false
}

// count is the number of goroutines in s that are not ignored.
func count(s map[string]int) int {
	n := 0
	for st, k := range s {
		if !isIgnored(st) {
			n += k
		}
	}
	return n
}
