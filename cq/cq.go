// Package cq holds completion queues.
//
// Create a CQ on an open device, give it to one or more queue pairs, and
// Poll it into a slice you own: Poll makes no system call and allocates
// nothing. A CQ is polled by one goroutine at a time.
package cq

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"

	"github.com/goverbs/goverbs/internal/uvobj"
	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/uverbs/provider"
)

// WC is a work completion.
type WC = uverbs.WC

// CQ is a completion queue.
type CQ struct {
	ctx *uverbs.Context
	// cqBase holds the provider's CQ (driver), where qp reaches it too
	// (uvobj.CQOf: the clean hook).
	cqBase
	// handleBase is where qp holds the CQ open across QP_CREATE
	// (uvobj.HoldHandle).
	handleBase
	handle uint32
	cqe    int
	once   uvobj.Once // Close once; its lock serialises Close with what must not run beside it

	// Event-driven completions (Options.Channel or Options.Events).
	user    uint64
	ch      *uverbs.CompChannel
	ownCh   bool
	ready   <-chan struct{}
	closing chan struct{} // a shared channel's CQ: closed by Close, ends a Wait parked on ready
	arm     [2]armCmd     // [0] any completion, [1] solicited only; read-only after Create
	fd      int           // the device's descriptor, for arm (it outlives the CQ)
	armed   atomic.Uint64
	wakeups atomic.Uint64
	// waitReads counts the Waits reading the ring now: a Wait may be
	// under way as the CQ closes (it parks, and Close is how it ends), so
	// Close, once the CQ reads closed, waits for 0 before it unmaps the
	// ring (waitEmpty).
	waitReads atomic.Int32
}

// Options are the optional parts of a CQ.
type Options struct {
	// Channel attaches the CQ to a completion channel shared with other
	// CQs; Wait then works.
	Channel *uverbs.CompChannel
	// Events gives the CQ a completion channel of its own (closed with the
	// CQ), so Wait works. Ignored when Channel is set.
	Events bool
	// Vector is the completion vector (interrupt) to use; default 0.
	Vector int
}

// Create makes a CQ of at least cqe entries on ctx. Poll it; for Wait use
// CreateWith and Options.Events or Options.Channel.
func Create(ctx *uverbs.Context, cqe int) (*CQ, error) {
	return CreateWith(ctx, cqe, Options{})
}

// CreateWith makes a CQ with options.
func CreateWith(ctx *uverbs.Context, cqe int, o Options) (q *CQ, err error) {
	if ctx == nil {
		return nil, errors.New("cq: create: nil context")
	}
	if ctx.IsClosed() {
		return nil, ErrClosed
	}
	max := int(ctx.Attr().MaxCQE)
	if cqe < 1 || cqe > max {
		return nil, fmt.Errorf("cq: create: %d entries: want 1..%d (device limit)", cqe, max)
	}
	if o.Vector < 0 || o.Vector >= max1(ctx.NumCompVectors()) {
		return nil, fmt.Errorf("cq: create: completion vector %d out of range 0..%d", o.Vector, max1(ctx.NumCompVectors())-1)
	}
	ch, ownCh := o.Channel, false
	if ch != nil && ch.Context() != ctx {
		return nil, errors.New("cq: create: the completion channel belongs to another device context")
	}
	if ch == nil && o.Events {
		if ch, err = ctx.CreateCompChannel(); err != nil {
			return nil, fmt.Errorf("cq: create: %w", err)
		}
		ownCh = true
		defer func() {
			if err != nil {
				ch.Close()
			}
		}()
	}
	if ch != nil && ch.Fd() < 0 {
		return nil, fmt.Errorf("cq: create: the completion channel is closed: %w", ErrClosed)
	}
	parts := uvobj.Of(ctx)
	user := parts.Objects.NewUserHandle(nil)
	defer func() {
		if err != nil {
			parts.Objects.ReleaseUserHandle(user)
		}
	}()
	drv, err := parts.Driver.NewCQ(cqe)
	if err != nil {
		return nil, fmt.Errorf("cq: create: %w", err)
	}
	in, out := drv.Udata()
	f := parts.File
	var handle, granted uint32
	create := func(chFd int) {
		handle, granted, err = uvobj.CreateCQ(f, &uvobj.CQCreate{CQE: uint32(cqe), User: user, Vector: uint32(o.Vector), Channel: chFd, In: in, Out: out})
	}
	if ch == nil {
		create(-1)
	} else if herr := uvobj.WithFile(ch, create); herr != nil {
		// The channel closed since the look above: its number may be
		// another file's by now (another channel's, which the CQ would
		// report to). WithFile keeps it ours while CQ_CREATE names it.
		return nil, fmt.Errorf("cq: create: the completion channel is closed: %w", ErrClosed)
	}
	if err != nil {
		return nil, fmt.Errorf("cq: create %d entries on %s: %w", cqe, ctx.Name(), err)
	}
	q = &CQ{ctx: ctx, handle: handle, cqe: int(granted), user: user, ch: ch, ownCh: ownCh}
	uvobj.SetHandle(&q.handleBase, &q.once, handle, user)
	*uvobj.CQOf(&q.cqBase) = drv
	for i := range q.arm {
		q.arm[i] = armCmd{
			hdr: ioctl.CmdHdr{Command: ioctl.IB_USER_VERBS_CMD_REQ_NOTIFY_CQ, In_words: uint16((ioctl.SizeofCmdHdr + ioctl.SizeofReqNotifyCQ) / 4)},
			req: ioctl.ReqNotifyCQ{Cq_handle: handle, Solicited_only: uint32(i)},
		}
	}
	q.fd = f.Fd()
	parts.Objects.BindUserHandle(user, q)
	if err := drv.Attach(parts.Device, handle, int(granted)); err != nil {
		q.destroy()
		return nil, fmt.Errorf("cq: create on %s: %w", ctx.Name(), err)
	}
	if ownCh {
		// The channel is this CQ's alone: Wait reads it itself.
		if err = ch.Own(); err != nil {
			q.destroy()
			drv.Close()
			return nil, fmt.Errorf("cq: create: %w", err)
		}
	} else if ch != nil {
		q.closing = make(chan struct{})
		if q.ready, err = ch.Register(user); err != nil {
			q.destroy()
			drv.Close()
			return nil, fmt.Errorf("cq: create: %w", err)
		}
	}
	if err := parts.Objects.Track(q); err != nil { // the context closed meanwhile
		q.destroy()
		drv.Close()
		if !ownCh && ch != nil {
			ch.Unregister(user) // as Close does: the handle may be reused
		}
		return nil, err
	}
	return q, nil
}

// ErrClosed is returned for a use after Close.
var ErrClosed = uverbs.ErrClosed

// IsClosed reports whether Close was called.
func (q *CQ) IsClosed() bool {
	if q == nil {
		return true
	}
	return q.once.IsClosed()
}

func (q *CQ) String() string {
	if q == nil {
		return "<nil>"
	}
	return fmt.Sprintf("CQ %d on %s", q.handle, q.ctx.Name())
}

// Len is the number of entries the kernel granted (at least the number asked).
func (q *CQ) Len() int {
	if q == nil {
		return 0
	}
	return q.cqe
}

// Handle is the kernel handle, or ErrClosed after Close. It waits for a
// Close in progress. The number names this CQ only while it is open: once
// a Close destroyed it, the kernel gives it to the next object the
// context creates, so a handle read before a Close and used after it
// names another CQ, or nothing. qp.Create does not use it so: it holds
// the CQ open from its look at the handle to the kernel's answer, and a
// Close meanwhile waits for it (and then fails, EBUSY: the QP uses the
// CQ).
func (q *CQ) Handle() (uint32, error) {
	if q.bad() {
		return 0, errNilCQ
	}
	if !q.once.Hold() {
		return 0, ErrClosed
	}
	defer q.once.Release()
	return q.handle, nil
}

// Context returns the device context.
func (q *CQ) Context() *uverbs.Context {
	if q == nil {
		return nil
	}
	return q.ctx
}

// Poll moves up to len(wc) completions into wc and returns how many. It
// makes no system call and allocates nothing. It returns ErrClosed after
// Close. Check each WC's Status (or wc[i].Err()).
func (q *CQ) Poll(wc []WC) (int, error) {
	if q.bad() {
		return 0, errNilCQ
	}
	if q.once.IsClosed() {
		return 0, ErrClosed
	}
	return q.driver().Poll(wc), nil
}

// Empty reports whether the CQ holds no completion to poll now (a closed
// CQ is empty, and so is a nil or zero one). Like Poll it makes no system
// call; a completion may arrive just after it looked.
func (q *CQ) Empty() bool {
	if q.bad() {
		return true
	}
	if q.once.IsClosed() {
		return true
	}
	return q.driver().Empty()
}

func (q *CQ) destroy() error { return uvobj.DestroyCQ(uvobj.Of(q.ctx).File, q.handle) }

// Close destroys the CQ. It fails, and the CQ stays usable, while a queue
// pair still uses it. Idempotent. A Wait under way returns ErrClosed. Do
// not Close while another goroutine polls (Poll, Empty): the ring is
// unmapped.
func (q *CQ) Close() error {
	if q.bad() {
		return errNilCQ
	}
	return q.once.Close(uvobj.Of(q.ctx).Objects, q, q.user, q.destroy,
		func(err error) error { return fmt.Errorf("cq: destroy: %w", err) }, q.release)
}

// release is what Close does once the kernel destroyed the CQ: end the
// Waits, unmap the ring, let go of the channel.
func (q *CQ) release() error {
	if q.closing != nil {
		close(q.closing) // a Wait parked on the shared channel returns ErrClosed
	}
	for q.waitReads.Load() != 0 {
		runtime.Gosched() // a Wait's look at the ring, a few loads
	}
	err := q.driver().Close()
	if q.ch != nil {
		q.ch.Unregister(q.user)
		if q.ownCh {
			err = errors.Join(err, q.ch.Close())
		}
	}
	return err
}

func max1(n int) int {
	if n < 1 {
		return 1
	}
	return n
}

// cqBase and handleBase are embedded under names of this package's: no
// field of CQ is exported.
type (
	cqBase     = uvobj.CQBase
	handleBase = uvobj.HandleBase
)

// driver is the provider's CQ, set once at creation.
func (q *CQ) driver() provider.CQ { return *uvobj.CQOf(&q.cqBase) }
