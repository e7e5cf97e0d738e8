package qp_test

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/goverbs/goverbs"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/qp"
)

// duringClose runs op while a Close of obj is in progress (its lock held,
// the object destroyed under it) and checks that op waited for that Close
// and then returned ErrClosed. An op that does not take Close's lock
// returns before (using the handle as Close frees it: the kernel gives a
// freed handle to the context's next object, which the op would then
// modify), or, checking for Close only before it takes the lock, after,
// with the kernel's error for a destroyed handle.
// undo, if not nil, undoes what an op that did not wait did (so that the
// Close can go on).
func duringClose(t *testing.T, what, frame string, obj any, op func() error, undo func()) {
	t.Helper()
	closeHeld, unlock := qp.HoldClose(obj)
	done := make(chan error, 1)
	go func() { done <- op() }()
	early, returned := rxetest.WaitBlocked(t, frame, done)
	if returned && early == nil && undo != nil {
		undo()
	}
	if err := closeHeld(); err != nil {
		unlock()
		t.Fatalf("%s: close under the held lock: %v", what, err)
	}
	unlock()
	if returned {
		t.Errorf("%s returned (%v) while a Close was in progress: it must wait for it", what, early)
		return
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(hang.Scale(20 * time.Second)):
		t.Fatalf("%s did not return after the Close (%s)", what, hang.How())
	}
	if !errors.Is(err, qp.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("%s after a Close it waited for: %v, want ErrClosed", what, err)
	}
}

// TestSRQSetLimitDuringClose: SetLimit checked for Close before it took
// Close's lock and not after, so one that raced a Close sent MODIFY_SRQ
// with the destroyed SRQ's handle (an EINVAL here; another SRQ's limit
// once the kernel reused the handle).
func TestSRQSetLimitDuringClose(t *testing.T) {
	s := newSide(t, rxetest.One(t), pairOpts{})
	srq, err := qp.CreateSRQ(s.pd, qp.SRQConfig{MaxWR: 8})
	if err != nil {
		t.Fatal(err)
	}
	duringClose(t, "SRQ.SetLimit", "qp.(*SRQ).SetLimit(", srq, func() error { return srq.SetLimit(2) }, nil)
}

// TestSRQQueryDuringClose: Query did not take Close's lock at all.
func TestSRQQueryDuringClose(t *testing.T) {
	s := newSide(t, rxetest.One(t), pairOpts{})
	srq, err := qp.CreateSRQ(s.pd, qp.SRQConfig{MaxWR: 8})
	if err != nil {
		t.Fatal(err)
	}
	duringClose(t, "SRQ.Query", "qp.(*SRQ).Query(", srq, func() error { _, err := srq.Query(); return err }, nil)
}

// TestMcastDuringClose: AttachMcast and DetachMcast did not take Close's
// lock (a QP closing under one could join its handle's next owner to the
// group), and after Close they returned an error that was not ErrClosed.
func TestMcastDuringClose(t *testing.T) {
	na := rxetest.One(t)
	mgid := net.ParseIP("::ffff:239.1.9.3")
	for _, attach := range []bool{true, false} {
		s := newSide(t, na, pairOpts{cfg: qp.Config{Type: qp.UD}})
		if err := s.qp.ToRTS(qp.UDOptions{QKey: 0x11}); err != nil {
			t.Fatal(err)
		}
		op, what, undo := s.qp.DetachMcast, "DetachMcast", func() {}
		if attach {
			// One that joined without waiting leaves, or the kernel
			// refuses the Close (EBUSY).
			op, what, undo = s.qp.AttachMcast, "AttachMcast", func() { s.qp.DetachMcast(mgid, 0) }
		}
		duringClose(t, what, "qp.(*QP).mcast(", s.qp, func() error { return op(mgid, 0) }, undo)
		if err := op(mgid, 0); !errors.Is(err, qp.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", what, err)
		}
	}
}
