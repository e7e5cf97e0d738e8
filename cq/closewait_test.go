package cq_test

import (
	"errors"
	"testing"
	"time"

	"github.com/goverbs/goverbs"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestNotifyDuringClose: Notify (which Wait calls, and a Wait may run as
// its CQ closes) checked for Close without taking Close's lock, and then
// sent REQ_NOTIFY_CQ with the handle Close was freeing: an EINVAL instead
// of ErrClosed, or, once the kernel gave the handle to a new object of the
// context, an arm of another CQ. It now waits for a Close in progress and
// returns ErrClosed.
func TestNotifyDuringClose(t *testing.T) {
	ctx := rxetest.Open(t, rxetest.One(t))
	shared, err := ctx.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	for _, o := range []cq.Options{{Events: true}, {Channel: shared}} {
		c, err := cq.CreateWith(ctx, 8, o)
		if err != nil {
			t.Fatal(err)
		}
		closeHeld, unlock := cq.HoldClose(c)
		done := make(chan error, 1)
		go func() { done <- c.Notify(false) }()
		early, returned := rxetest.WaitBlocked(t, "cq.(*CQ).Notify(", done)
		if err := closeHeld(); err != nil {
			unlock()
			t.Fatalf("close under the held lock: %v", err)
		}
		unlock()
		if returned {
			t.Errorf("options %+v: Notify returned (%v) while a Close was in progress: it must wait for it", o, early)
			continue
		}
		select {
		case err = <-done:
		case <-time.After(hang.Scale(20 * time.Second)):
			t.Fatalf("Notify did not return after the Close (%s)", hang.How())
		}
		if !errors.Is(err, cq.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
			t.Errorf("options %+v: Notify after a Close it waited for: %v, want ErrClosed", o, err)
		}
	}
}
