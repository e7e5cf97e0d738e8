package bx

import (
	"sync/atomic"
	"time"
)

// Polling is a bet that the CPU is ours to burn: it pays when the poller
// and the peer each have a core, and it costs when they do not. On a
// machine with more runnable threads than cores (a parameter server with
// several worker and server processes on two cores, users' machines with
// other load), a spinning poller holds a core that the peer process, the
// kernel's rxe work or this process's own goroutines need, and the
// scheduler takes it away from the poller anyway, a time slice at a time.
//
// spinYield notices that: the poll loops read the clock every 16 polls,
// and when more than yieldGap passed between two reads of an empty spin,
// the polling thread was not running (descheduled, or its P ran other
// goroutines for that long). The endpoint then stops spinning for a
// back-off and waits for completion events instead, as it does when idle;
// the back-off doubles while contention persists (from 16 to 1024 Spins)
// and starts over after a spin window that ends without it. Yields in the
// endpoint's counters count the spins cut short.
type spinYield struct {
	until   atomic.Int64 // monoNanos before which the endpoint does not spin; 0: none
	end     atomic.Int64 // monoNanos at which the last back-off ended (until, kept)
	backoff atomic.Int64 // the last back-off, nanoseconds; 0 after a calm window
}

// monoBase anchors monotonic clock readings as integers.
var monoBase = time.Now()

func monoNanos(t time.Time) int64 { return int64(t.Sub(monoBase)) }

// yieldGap is how long a spin may go between two clock reads (16 polls,
// normally microseconds) before it counts as having lost its CPU: four
// Spins, at least a millisecond (a scheduler time slice).
func yieldGap(spin time.Duration) time.Duration { return max(4*spin, time.Millisecond) }

const (
	minYield = 16   // Spins: the first back-off
	maxYield = 1024 // Spins: the longest
)

// spinning reports whether a poll loop may keep spinning at now, gap after
// its previous clock read; a gap above yieldGap starts or extends a
// back-off (and counts a yield in st).
func (y *spinYield) spinning(now time.Time, gap, spin time.Duration, st *Stats) bool {
	if y.note(now, gap, spin, st) {
		return false
	}
	return !y.offAt(monoNanos(now))
}

// note records contention when gap, the time since a spin's previous
// clock read, exceeds yieldGap, and reports whether it did.
func (y *spinYield) note(now time.Time, gap, spin time.Duration, st *Stats) bool {
	if gap > yieldGap(spin) {
		n := monoNanos(now)
		b := y.backoff.Load()
		if b > 0 && n < y.end.Load()+2*b {
			b = min(2*b, int64(maxYield*spin))
		} else {
			b = int64(minYield * spin)
		}
		y.backoff.Store(b)
		y.end.Store(n + b)
		y.until.Store(n + b)
		st.Yields.Add(1)
		return true
	}
	return false
}

// off reports whether a back-off is running (it reads the clock only when
// one was set).
func (y *spinYield) off() bool {
	if y.until.Load() == 0 {
		return false
	}
	return y.offAt(monoNanos(time.Now()))
}

func (y *spinYield) offAt(n int64) bool {
	u := y.until.Load()
	if u == 0 {
		return false
	}
	if n < u {
		return true
	}
	y.until.CompareAndSwap(u, 0)
	return false
}

// calm records a spin window that ended without losing the CPU: the next
// contention starts from the shortest back-off.
func (y *spinYield) calm() { y.backoff.Store(0) }
