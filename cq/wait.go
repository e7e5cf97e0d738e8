package cq

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/uverbs/provider"
)

// ErrNoChannel is returned by Notify and Wait on a CQ made without a
// completion channel.
var ErrNoChannel = errors.New("cq: the CQ has no completion channel (create it with Options.Events or Options.Channel)")

// Notify arms the CQ: the next completion (with solicitedOnly, the next
// solicited or error completion) raises one event on its channel. Arming
// again before the event fired is harmless.
func (q *CQ) Notify(solicitedOnly bool) error {
	if q.closed.Load() {
		return ErrClosed
	}
	if q.ch == nil {
		return ErrNoChannel
	}
	if a, ok := q.drv.(provider.CQArmer); ok {
		return a.Arm(solicitedOnly)
	}
	// The request lives in the CQ, so arming allocates nothing.
	req := &q.armReq[0]
	if solicitedOnly {
		req = &q.armReq[1]
	}
	err := q.ctx.File().Write(&ioctl.Cmd{
		Command: ioctl.IB_USER_VERBS_CMD_REQ_NOTIFY_CQ, In: unsafe.Pointer(req), InLen: ioctl.SizeofReqNotifyCQ,
	}, "REQ_NOTIFY_CQ")
	if err != nil {
		return fmt.Errorf("cq: arm: %w", err)
	}
	q.armed.Add(1)
	return nil
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
func (q *CQ) Wait(ctx context.Context) error { return q.wait(ctx, false) }

// WaitSolicited is Wait for solicited (and error) completions only.
func (q *CQ) WaitSolicited(ctx context.Context) error { return q.wait(ctx, true) }

func (q *CQ) wait(ctx context.Context, solicited bool) error {
	if q.closed.Load() {
		return ErrClosed
	}
	if q.ch == nil {
		return ErrNoChannel
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if !q.drv.Empty() {
		return nil
	}
	if err := q.Notify(solicited); err != nil {
		return err
	}
	if !q.drv.Empty() {
		return nil
	}
	if q.ownCh {
		// No reader goroutine between the channel and us (Options.Events).
		if _, err := q.ch.Next(ctx); err != nil {
			if q.closed.Load() {
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
	case <-ctx.Done():
		return ctx.Err()
	case <-q.ch.Done():
		if q.closed.Load() {
			return ErrClosed
		}
		if err := q.ch.Err(); err != nil {
			return err
		}
		return ErrClosed
	}
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
	s := Stats{Arms: q.armed.Load(), Wakeups: q.wakeups.Load()}
	if q.ch != nil {
		s.ChannelEvents = q.ch.Events()
	}
	return s
}
