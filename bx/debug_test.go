package bx_test

import (
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
)

// TestDumpStateHeldLock: DumpState is what a hang's report shows, and a
// hang is often a lock someone holds for good; the dump must not join it.
// With lane 0's send lock held it returns, says the lock is held, and
// still shows the rest (the other end's lanes, the peer's credits).
func TestDumpStateHeldLock(t *testing.T) {
	_, _, p, _ := pair(t, nil)
	release := p.HoldLaneForTest(0)
	done := make(chan string, 1)
	go func() {
		var b strings.Builder
		bx.DumpState(&b)
		done <- b.String()
	}()
	var d string
	select {
	case d = <-done:
	case <-time.After(time.Minute): // a hang bound: it takes 0.2 s per held lock
		release()
		t.Fatal("DumpState blocked on a held lane lock")
	}
	release()
	for _, want := range []string{"lane 0: its send lock (mu) held for", "credits (we send)", "lane 0 live true"} {
		if !strings.Contains(d, want) {
			t.Errorf("the dump lacks %q:\n%s", want, d)
		}
	}
}
