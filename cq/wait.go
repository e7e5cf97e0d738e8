package cq

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/uverbs/provider"
)

// ErrNoChannel is returned by Notify and Wait on a CQ made without a
// completion channel.
var ErrNoChannel = errors.New("cq: the CQ has no completion channel (create it with Options.Events or Options.Channel)")

// Notify arms the CQ: the next completion (with solicitedOnly, the next
// solicited or error completion) raises one event on its channel. Arming
// again before the event fired is harmless. It waits for a Close in
// progress and returns ErrClosed after one.
func (q *CQ) Notify(solicitedOnly bool) error {
	if q.bad() {
		return errNilCQ
	}
	if q.once.IsClosed() {
		return ErrClosed
	}
	if q.ch == nil {
		return ErrNoChannel
	}
	// Held open (a Close waits), checked again: a CQ closed since the
	// check above has a destroyed handle, which the kernel may have given
	// to a new object of this context already (arming that instead), and
	// a provider's Arm would touch an unmapped ring. The hold is shared:
	// Notifys, and a qp.Create that names the CQ, do not wait for each
	// other.
	if !q.once.Hold() {
		return ErrClosed
	}
	defer q.once.Release()
	if a, ok := q.driver().(provider.CQArmer); ok {
		if err := a.Arm(solicitedOnly); err != nil {
			return err
		}
		q.armed.Add(1)
		return nil
	}
	// REQ_NOTIFY_CQ through write(), as rdma-core sends it: the command
	// lives in the CQ, so arming allocates nothing, and it never blocks
	// (the kernel sets a flag under a spinlock), so it is a raw system
	// call that does not hand this thread's P to the scheduler, like the
	// rxe doorbell.
	cmd := &q.arm[0]
	if solicitedOnly {
		cmd = &q.arm[1]
	}
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(q.fd), uintptr(unsafe.Pointer(cmd)), uintptr(unsafe.Sizeof(*cmd)))
	runtime.KeepAlive(cmd)
	switch {
	case e != 0:
		return fmt.Errorf("cq: arm: %w", &ioctl.Error{Op: "REQ_NOTIFY_CQ", Errno: e})
	case n != unsafe.Sizeof(*cmd):
		return fmt.Errorf("cq: arm: REQ_NOTIFY_CQ: the kernel took %d of %d bytes", n, unsafe.Sizeof(*cmd))
	}
	q.armed.Add(1)
	return nil
}

// armCmd is REQ_NOTIFY_CQ as write() takes it.
type armCmd struct {
	hdr ioctl.CmdHdr
	req ioctl.ReqNotifyCQ
}

// Wait parks the calling goroutine until the CQ may have a completion to
// poll, or ctx is done (then it returns ctx.Err()). It arms the CQ, then
// looks at the queue before sleeping: a completion that arrived before the
// arm took effect would raise no event, and this check is what keeps it
// from being missed (the re-arm/poll race). Wait may return when there is
// nothing to poll after all; callers loop: Poll, and Wait when Poll found
// nothing.
//
// No thread is blocked: the channel's descriptor is in Go's netpoller.
func (q *CQ) Wait(ctx context.Context) error {
	if q.bad() {
		return errNilCQ
	}
	return q.wait(ctx, false)
}

// Interrupt makes a Wait in progress on a CQ with its own channel
// (Options.Events) return uverbs.ErrInterrupted, or the next one if none
// is waiting; it reports false for a CQ without its own channel. It never
// blocks: a goroutine takes the wait over from another, or bounds one
// with a reused timer.
func (q *CQ) Interrupt() bool {
	if q == nil {
		return false
	}
	if q.ch == nil || !q.ownCh {
		return false
	}
	q.ch.Interrupt()
	return true
}

// WaitSolicited is Wait for solicited (and error) completions only.
func (q *CQ) WaitSolicited(ctx context.Context) error {
	if q.bad() {
		return errNilCQ
	}
	return q.wait(ctx, true)
}

func (q *CQ) wait(ctx context.Context, solicited bool) error {
	if q.once.IsClosed() {
		return ErrClosed
	}
	if ctx == nil {
		return errors.New("cq: wait: nil context")
	}
	if q.ch == nil {
		return ErrNoChannel
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if empty, closed := q.waitEmpty(); closed {
		return ErrClosed
	} else if !empty {
		return nil
	}
	if err := q.Notify(solicited); err != nil {
		return err
	}
	if empty, closed := q.waitEmpty(); closed {
		return ErrClosed
	} else if !empty {
		return nil
	}
	if q.ownCh {
		// No reader goroutine between the channel and us (Options.Events).
		if _, err := q.ch.Next(ctx); err != nil {
			if q.once.IsClosed() {
				return ErrClosed
			}
			return err
		}
		q.wakeups.Add(1)
		return nil
	}
	select {
	case <-q.ready:
		q.wakeups.Add(1)
		return nil
	case <-q.closing:
		// Closed under us: the channel goes on serving its other CQs, so
		// its Done would not end this wait.
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	case <-q.ch.Done():
		if q.once.IsClosed() {
			return ErrClosed
		}
		if err := q.ch.Err(); err != nil {
			return err
		}
		return ErrClosed
	}
}

// waitEmpty is the ring's Empty for Wait, counted in waitReads: Close
// marks the CQ closed, then waits until no such read is under way before
// it unmaps the ring, and a read that starts after the mark sees it and
// does not look. (Without it a Wait parked while its context closed had
// read the ring with nothing ordering that read before the unmap: the
// race detector's report in TestGoroutineLeaks.)
func (q *CQ) waitEmpty() (empty, closed bool) {
	q.waitReads.Add(1)
	defer q.waitReads.Add(-1)
	if q.once.IsClosed() {
		return true, true
	}
	return q.driver().Empty(), false
}

// Stats counts arms and event wakeups, for tests and metrics.
type Stats struct {
	Arms    uint64
	Wakeups uint64
	// ChannelEvents is the completion events read from the CQ's channel
	// (of every CQ sharing it). It can exceed Wakeups: an event whose
	// completion Wait already found by polling wakes nobody, and two
	// events before a Wait leave one token.
	ChannelEvents uint64
}

// Stats returns the CQ's event counters.
func (q *CQ) Stats() Stats {
	if q == nil {
		return Stats{}
	}
	s := Stats{Arms: q.armed.Load(), Wakeups: q.wakeups.Load()}
	if q.ch != nil {
		s.ChannelEvents = q.ch.Events()
	}
	return s
}
