package bx

import (
	"testing"
	"time"
)

// TestYieldDue: a poller gives its CPU away only once its CQ has been
// empty for the interval, and then once per interval; a wait shorter than
// that (a ping-pong's answer) never yields; 0 turns it off.
func TestYieldDue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(us int) time.Time { return t0.Add(time.Duration(us) * time.Microsecond) }
	const every = 100 * time.Microsecond
	for _, c := range []struct {
		name            string
		now, idle, last time.Time
		every           time.Duration
		want            bool
	}{
		{"empty for less than the interval", at(99), at(0), time.Time{}, every, false},
		{"empty for the interval, never yielded", at(100), at(0), time.Time{}, every, true},
		{"yielded less than an interval ago", at(250), at(0), at(200), every, false},
		{"yielded an interval ago", at(300), at(0), at(200), every, true},
		{"no idle start yet", at(500), time.Time{}, time.Time{}, every, false},
		{"off", at(10000), at(0), time.Time{}, 0, false},
	} {
		if got := yieldDue(c.now, c.idle, c.last, c.every); got != c.want {
			t.Errorf("%s: yieldDue = %v, want %v", c.name, got, c.want)
		}
	}
}
