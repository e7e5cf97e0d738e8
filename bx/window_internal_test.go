package bx

import (
	"testing"
	"time"
)

// TestNextWindow: the spin window doubles after a short sleep, stops at
// maxSpinGrowth Spins, and is halved (down to Spin) after a long sleep.
func TestNextWindow(t *testing.T) {
	const spin = 100 * time.Microsecond
	top := maxSpinGrowth * spin
	for _, c := range []struct {
		w, d, want time.Duration
	}{
		{spin, 0, 2 * spin},
		{spin, top / 2, 2 * spin},
		{2 * spin, top - 1, 4 * spin},
		{top / 2, spin, top},
		{top, spin, top},    // capped
		{top, top, top / 2}, // a sleep as long as the cap: halved
		{4 * spin, time.Hour, 2 * spin},
		{spin, time.Hour, spin}, // not below Spin
	} {
		if got := nextWindow(c.w, spin, c.d); got != c.want {
			t.Errorf("nextWindow(%v, %v, %v) = %v, want %v", c.w, spin, c.d, got, c.want)
		}
	}
}
