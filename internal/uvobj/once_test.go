package uvobj_test

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/internal/uvobj"
)

type closer struct{}

func (closer) Close() error { return nil }

// TestHoldDelaysClose: a Close waits for a Hold (a create naming the
// object's handle) to be released before it destroys, and a Hold after
// the Close finds the object closed and holds nothing (a second Close
// would otherwise wait for good). No device needed.
func TestHoldDelaysClose(t *testing.T) {
	var o uvobj.Once
	var tab uvobj.Table
	if !o.Hold() {
		t.Fatal("Hold of an open object failed")
	}
	destroyed := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- o.Close(&tab, closer{}, 0, func() error { close(destroyed); return nil }, nil, nil)
	}()
	if err, returned := rxetest.WaitBlocked(t, "uvobj.(*Once).Close(", done); returned {
		t.Fatalf("Close returned (%v) while the object was held", err)
	}
	select {
	case <-destroyed:
		t.Fatal("Close destroyed the object while it was held")
	default:
	}
	o.Release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hang.Scale(20 * time.Second)):
		t.Fatalf("Close did not return after the Release (%s)", hang.How())
	}
	if o.Hold() {
		t.Fatal("Hold of a closed object succeeded")
	}
	if err := o.Close(&tab, closer{}, 0, func() error { t.Error("destroyed twice"); return nil }, nil, nil); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
