package bx

import (
	"testing"
	"time"
)

func TestSpinYield(t *testing.T) {
	const spin = 250 * time.Microsecond
	var y spinYield
	var st Stats
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	// Short gaps: keep spinning, nothing counted.
	if !y.spinning(at(0), 20*time.Microsecond, spin, &st) || st.Yields.Load() != 0 {
		t.Fatalf("a 20us gap stopped the spin (yields %d)", st.Yields.Load())
	}
	if y.offAt(monoNanos(at(0))) {
		t.Fatal("back-off running without contention")
	}
	// A gap above yieldGap: stop, count, back off 16 Spins.
	if y.spinning(at(0), 2*time.Millisecond, spin, &st) {
		t.Fatal("a 2ms gap between clock reads did not stop the spin")
	}
	if st.Yields.Load() != 1 {
		t.Fatalf("yields %d, want 1", st.Yields.Load())
	}
	if !y.offAt(monoNanos(at(minYield*spin - time.Microsecond))) {
		t.Fatal("back-off over before 16 Spins")
	}
	if y.spinning(at(time.Millisecond), 10*time.Microsecond, spin, &st) {
		t.Fatal("spinning during the back-off")
	}
	// Contention again soon after: the back-off doubles.
	now := at(minYield * spin)
	if y.offAt(monoNanos(now)) {
		t.Fatal("back-off still on after 16 Spins")
	}
	y.spinning(now, 5*time.Millisecond, spin, &st)
	if got, want := time.Duration(y.backoff.Load()), 2*minYield*spin; got != want {
		t.Fatalf("second back-off %v, want %v", got, want)
	}
	// ... up to 1024 Spins.
	for range 20 {
		now = now.Add(time.Duration(y.backoff.Load()))
		y.spinning(now, 5*time.Millisecond, spin, &st)
	}
	if got, want := time.Duration(y.backoff.Load()), maxYield*spin; got != want {
		t.Fatalf("back-off grew to %v, want at most %v", got, want)
	}
	// A calm window: the next contention starts from the shortest again.
	y.calm()
	now = now.Add(time.Duration(y.backoff.Load()) + maxYield*spin)
	y.spinning(now, 5*time.Millisecond, spin, &st)
	if got, want := time.Duration(y.backoff.Load()), minYield*spin; got != want {
		t.Fatalf("back-off after a calm window %v, want %v", got, want)
	}
	// Long after any contention, spinning is allowed and off() clears.
	later := now.Add(time.Second)
	if !y.spinning(later, time.Microsecond, spin, &st) || y.until.Load() != 0 {
		t.Fatal("back-off did not end")
	}
	// A large Spin: the gap threshold follows it (4 Spins).
	if !y.spinning(later, 30*time.Millisecond, 10*time.Millisecond, &st) {
		t.Fatal("a 30ms gap with a 10ms Spin stopped the spin")
	}
}
