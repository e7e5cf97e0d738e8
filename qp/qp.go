// Package qp holds queue pairs.
//
// Create a QP in a protection domain with its completion queues, bring it
// up with Connect (RESET -> INIT -> RTR -> RTS, given the peer's QPN, PSN
// and GID), then PostRecv and PostSend batches of work requests; each batch
// costs one doorbell. Completions arrive on the CQs. A QP's send side is
// used by one goroutine at a time, and so is its receive side.
package qp

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/uvobj"
	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/uverbs/provider"
	"github.com/goverbs/goverbs/wr"
)

// Work request types.
type (
	SGE       = uverbs.SGE
	SendWR    = uverbs.SendWR
	RecvWR    = uverbs.RecvWR
	Opcode    = uverbs.Opcode
	SendFlags = uverbs.SendFlags
	MWBind    = uverbs.MWBind
)

// Send opcodes.
const (
	OpRDMAWrite         = wr.OpRDMAWrite
	OpRDMAWriteWithImm  = wr.OpRDMAWriteWithImm
	OpSend              = wr.OpSend
	OpSendWithImm       = wr.OpSendWithImm
	OpRDMARead          = wr.OpRDMARead
	OpAtomicCmpAndSwp   = wr.OpAtomicCmpAndSwp
	OpAtomicFetchAndAdd = wr.OpAtomicFetchAndAdd
	OpLocalInv          = wr.OpLocalInv
	OpBindMW            = wr.OpBindMW
	OpSendWithInv       = wr.OpSendWithInv
)

// Send flags.
const (
	Fence     = wr.SendFence
	Signaled  = wr.SendSignaled
	Solicited = wr.SendSolicited
	// Inline copies the bytes the SGEs describe into the send queue
	// when the request is posted, instead of the device reading them
	// later: the SGEs' LKeys are not used and the memory need not be
	// registered, but each SGE's Addr must point at Length bytes of this
	// process's memory, readable at post time. PostSend and QueueSend
	// refuse an Addr of 0 (or a range that wraps around); any other bad
	// address cannot be checked cheaply and faults like a bad unsafe
	// pointer. Once posted, the memory may be reused at once.
	Inline = wr.SendInline
)

// ErrQueueFull is returned when the send or receive queue cannot take the
// whole batch; nothing of the batch was posted.
var ErrQueueFull = provider.ErrQueueFull

// ErrClosed is returned for a use after Close.
var ErrClosed = uverbs.ErrClosed

// Type is a QP transport type.
type Type uint32

// QP types.
const (
	RC Type = ioctl.IB_UVERBS_QPT_RC
	UC Type = ioctl.IB_UVERBS_QPT_UC
	UD Type = ioctl.IB_UVERBS_QPT_UD
)

func (t Type) String() string {
	switch t {
	case RC:
		return "RC"
	case UC:
		return "UC"
	case UD:
		return "UD"
	}
	return fmt.Sprintf("Type(%d)", uint32(t))
}

// State is a QP state.
type State uint8

// QP states.
const (
	Reset State = iota
	Init
	RTR
	RTS
	SQD
	SQE
	Err
)

func (s State) String() string {
	names := [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}
	if int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Config describes a QP to create.
type Config struct {
	Type           Type
	SendCQ, RecvCQ *cq.CQ
	// SRQ makes the QP receive from a shared receive queue; MaxRecvWR and
	// MaxRecvSGE must then be 0.
	SRQ        *SRQ
	MaxSendWR  uint32
	MaxRecvWR  uint32
	MaxSendSGE uint32 // default 1
	MaxRecvSGE uint32 // default 1
	MaxInline  uint32
	// SignalAll makes every send produce a completion.
	SignalAll bool
}

// QP is a queue pair.
type QP struct {
	pd     *uverbs.PD
	ctx    *uverbs.Context
	cfg    Config
	drv    provider.QP
	handle uint32
	qpn    uint32
	caps   provider.QPCaps
	state  atomic.Uint32
	port   uint8
	user   uint64
	udMTU  atomic.Uint32
	// noReads: an RC QP moved to RTS with MaxRdAtomic 0 (MaskMaxQPRdAtomic
	// is required there, and 0 is Attr's zero value): rxe holds an RDMA
	// READ or atomic, and every request behind it, for ever (its
	// requester waits for a read slot it has none of). Refused instead.
	noReads atomic.Bool
	once    uvobj.Once // Close once; its lock serialises Close with what must not run beside it
}

// Create makes a QP in pd. Its capabilities are checked against the
// device's limits first. The PD, CQs and SRQ are held open across the
// kernel command: a Close of one of them meanwhile waits for Create (and
// then fails, EBUSY, while the QP uses it); after one, Create returns an
// error that wraps ErrClosed and names it.
func Create(pd *uverbs.PD, cfg Config) (*QP, error) {
	if pd == nil {
		return nil, errors.New("qp: create: nil PD")
	}
	if cfg.SendCQ == nil || cfg.RecvCQ == nil {
		return nil, errors.New("qp: create: SendCQ and RecvCQ are required")
	}
	// The PD and CQs first: a zero or closed one has no device limits
	// to check the capabilities against. Their handles are read again,
	// held open, for the command (holdParts).
	if _, err := pd.Handle(); err != nil {
		return nil, fmt.Errorf("qp: create: PD: %w", err)
	}
	ctx := pd.Context()
	if _, err := cfg.SendCQ.Handle(); err != nil {
		return nil, fmt.Errorf("qp: create: send CQ: %w", err)
	}
	if _, err := cfg.RecvCQ.Handle(); err != nil {
		return nil, fmt.Errorf("qp: create: receive CQ: %w", err)
	}
	// The kernel looks the CQ handles up in the PD's context: one of
	// another context's would name an unrelated CQ there, or none.
	if cfg.SendCQ.Context() != ctx {
		return nil, errors.New("qp: create: the send CQ belongs to another device context than the PD")
	}
	if cfg.RecvCQ.Context() != ctx {
		return nil, errors.New("qp: create: the receive CQ belongs to another device context than the PD")
	}
	if cfg.Type == 0 {
		cfg.Type = RC
	}
	if cfg.MaxSendSGE == 0 {
		cfg.MaxSendSGE = 1
	}
	if cfg.MaxRecvSGE == 0 && cfg.SRQ == nil {
		cfg.MaxRecvSGE = 1
	}
	if err := checkCaps(ctx.Attr(), cfg); err != nil {
		return nil, err
	}
	if cfg.SRQ != nil {
		if _, err := cfg.SRQ.Handle(); err != nil {
			return nil, fmt.Errorf("qp: create: SRQ: %w", err)
		}
		if cfg.SRQ.pd.Context() != ctx {
			return nil, errors.New("qp: create: the SRQ belongs to another device context")
		}
	}
	parts := uvobj.Of(ctx)
	drv, err := parts.Driver.NewQP(provider.QPRequest{
		HasSRQ: cfg.SRQ != nil, Type: uint32(cfg.Type), MaxSendWR: cfg.MaxSendWR, MaxRecvWR: cfg.MaxRecvWR,
		MaxSendSGE: cfg.MaxSendSGE, MaxRecvSGE: cfg.MaxRecvSGE, MaxInline: cfg.MaxInline, SignalAll: cfg.SignalAll,
	})
	if err != nil {
		return nil, fmt.Errorf("qp: create: %w", err)
	}
	in, out := drv.Udata()
	f := parts.File
	user := parts.Objects.NewUserHandle(nil)
	h, err := holdParts(pd, &cfg)
	if err != nil {
		parts.Objects.ReleaseUserHandle(user)
		return nil, err
	}
	handle, qpn, rcap, err := uvobj.CreateQP(f, &uvobj.QPCreate{PD: h.pd, SendCQ: h.send, RecvCQ: h.recv, SRQ: h.srq, HasSRQ: cfg.SRQ != nil,
		User: user, Type: uint8(cfg.Type), SignalAll: cfg.SignalAll, In: in, Out: out,
		Cap: ioctl.QPCap{Send_wr: cfg.MaxSendWR, Recv_wr: cfg.MaxRecvWR, Send_sge: cfg.MaxSendSGE,
			Recv_sge: cfg.MaxRecvSGE, Inline_data: cfg.MaxInline}})
	h.release()
	if err != nil {
		parts.Objects.ReleaseUserHandle(user)
		return nil, fmt.Errorf("qp: create %v QP on %s: %w", cfg.Type, ctx.Name(), err)
	}
	q := &QP{pd: pd, ctx: ctx, cfg: cfg, drv: drv, handle: handle, qpn: qpn, user: user,
		caps: provider.QPCaps{MaxSendWR: rcap.Send_wr, MaxRecvWR: rcap.Recv_wr, MaxSendSGE: rcap.Send_sge,
			MaxRecvSGE: rcap.Recv_sge, MaxInline: rcap.Inline_data}}
	parts.Objects.BindUserHandle(user, q)
	if err := drv.Attach(parts.Device, handle, qpn, q.caps); err != nil {
		parts.Objects.ReleaseUserHandle(user)
		q.destroy()
		return nil, fmt.Errorf("qp: create on %s: %w", ctx.Name(), err)
	}
	if err := parts.Objects.Track(q); err != nil {
		parts.Objects.ReleaseUserHandle(user)
		q.destroy()
		drv.Close()
		return nil, err
	}
	return q, nil
}

// held is what holdParts holds open: the handles CREATE_QP names.
type held struct {
	pd, send, recv, srq uint32
	cfg                 *Config
	pdo                 *uverbs.PD
}

// holdParts holds the QP's PD, CQs and SRQ open (a Close of one waits
// until release) and reads their handles, or returns ErrClosed naming the
// first one found closed, holding nothing. A handle read without the hold
// may be destroyed by a Close before CREATE_QP, and the kernel gives a
// destroyed handle to the context's next object: the QP would be made on
// a CQ (or PD, or SRQ) created meanwhile, or the command fail with the
// kernel's error instead of ErrClosed. Once the QP exists the kernel
// refuses to destroy what it uses (EBUSY). The order is fixed: PD, the
// CQs by their place in the context (one hold when SendCQ is RecvCQ),
// SRQ; nothing holds one of these and waits for another otherwise.
func holdParts(pd *uverbs.PD, cfg *Config) (h held, err error) {
	h.cfg, h.pdo = cfg, pd
	var ok bool
	if h.pd, ok = uvobj.HoldHandle(pd); !ok {
		return held{}, fmt.Errorf("qp: create: PD: %w", ErrClosed)
	}
	// Each CQ is held once: a second shared hold of one lock waits
	// behind a Close that waits for the first.
	first, firstH, second, secondH := cfg.SendCQ, &h.send, cfg.RecvCQ, &h.recv
	if uvobj.HandleOrder(second) < uvobj.HandleOrder(first) {
		first, firstH, second, secondH = second, secondH, first, firstH
	}
	if *firstH, ok = uvobj.HoldHandle(first); !ok {
		uvobj.ReleaseHandle(pd)
		return held{}, fmt.Errorf("qp: create: %s: %w", cqRole(cfg, first), ErrClosed)
	}
	if second == first {
		*secondH = *firstH
	} else if *secondH, ok = uvobj.HoldHandle(second); !ok {
		uvobj.ReleaseHandle(first)
		uvobj.ReleaseHandle(pd)
		return held{}, fmt.Errorf("qp: create: %s: %w", cqRole(cfg, second), ErrClosed)
	}
	if s := cfg.SRQ; s != nil {
		if !s.once.Hold() {
			h.releaseCQs()
			uvobj.ReleaseHandle(pd)
			return held{}, fmt.Errorf("qp: create: SRQ: %w", ErrClosed)
		}
		h.srq = s.handle
	}
	return h, nil
}

// cqRole names c's role in cfg, for errors.
func cqRole(cfg *Config, c *cq.CQ) string {
	if c == cfg.SendCQ {
		return "send CQ"
	}
	return "receive CQ"
}

func (h *held) releaseCQs() {
	uvobj.ReleaseHandle(h.cfg.SendCQ)
	if h.cfg.RecvCQ != h.cfg.SendCQ {
		uvobj.ReleaseHandle(h.cfg.RecvCQ)
	}
}

// release ends holdParts' holds.
func (h *held) release() {
	if h.cfg.SRQ != nil {
		h.cfg.SRQ.once.Release()
	}
	h.releaseCQs()
	uvobj.ReleaseHandle(h.pdo)
}

func checkCaps(a uverbs.DeviceAttr, cfg Config) error {
	switch cfg.Type {
	case RC, UC, UD:
	default:
		return fmt.Errorf("qp: create: unknown QP type %d", uint32(cfg.Type))
	}
	type lim struct {
		name      string
		got, max  uint32
		allowZero bool
	}
	srq := cfg.SRQ != nil
	if srq && (cfg.MaxRecvWR != 0 || cfg.MaxRecvSGE != 0) {
		return fmt.Errorf("qp: create: MaxRecvWR %d and MaxRecvSGE %d must be 0 with an SRQ", cfg.MaxRecvWR, cfg.MaxRecvSGE)
	}
	for _, l := range []lim{
		{"MaxSendWR", cfg.MaxSendWR, a.MaxQPWR, false},
		{"MaxRecvWR", cfg.MaxRecvWR, a.MaxQPWR, srq},
		{"MaxSendSGE", cfg.MaxSendSGE, a.MaxSGE, false},
		{"MaxRecvSGE", cfg.MaxRecvSGE, a.MaxSGE, srq},
	} {
		if l.got > l.max || (l.got == 0 && !l.allowZero) {
			return fmt.Errorf("qp: create: %s %d out of range 1..%d (device limit)", l.name, l.got, l.max)
		}
	}
	return nil
}

// IsClosed reports whether Close was called.
func (q *QP) IsClosed() bool {
	if q == nil {
		return true
	}
	return q.once.IsClosed()
}

func (q *QP) String() string {
	if q == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%v QP %d on %s", q.cfg.Type, q.qpn, q.ctx.Name())
}

// QPN is the queue pair number peers address.
func (q *QP) QPN() uint32 { return q.orZero().qpn }

// Type is the QP's transport type.
func (q *QP) Type() Type { return q.orZero().cfg.Type }

// Caps returns what the kernel granted.
func (q *QP) Caps() provider.QPCaps { return q.orZero().caps }

// State is the state the QP was last moved to by this process. The kernel
// may have moved it to ERR since; Query tells.
func (q *QP) State() State { return State(q.orZero().state.Load()) }

// PostSend posts a batch of send work requests with one doorbell. The whole
// batch is posted or none of it: ErrQueueFull when it does not fit, an error
// naming the request when one is invalid (one wrapping ErrClosed for a UD
// request through a closed address handle). The QP must be in RTS.
func (q *QP) PostSend(wrs []SendWR) error {
	if q.bad() {
		return errNilQP
	}
	if err := q.checkSend("post send", wrs); err != nil || len(wrs) == 0 {
		return err
	}
	return q.drv.PostSend(wrs)
}

// checkSend is what PostSend and QueueSend check before the provider
// sees a batch: the QP open and in RTS (or SQD), UD requests complete.
// An empty batch on an open QP is nothing to do (nil).
func (q *QP) checkSend(op string, wrs []SendWR) error {
	if q.once.IsClosed() {
		return ErrClosed
	}
	if len(wrs) == 0 {
		return nil
	}
	if s := q.State(); s != RTS && s != SQD {
		return &StateError{Op: op, State: s, Want: "RTS"}
	}
	if q.cfg.Type == UD {
		return q.checkUD(wrs)
	}
	if q.noReads.Load() {
		for i := range wrs {
			switch wrs[i].Opcode {
			case OpRDMARead, OpAtomicCmpAndSwp, OpAtomicFetchAndAdd:
				return fmt.Errorf("qp: QP %d: %s: work request %d (id %d): %v on a QP whose MaxRdAtomic is 0 (set at the move to RTS): the device would hold it, and every request after it, for ever",
					q.qpn, op, i, wrs[i].ID, wrs[i].Opcode)
			}
		}
	}
	return nil
}

// QueueSend is PostSend without the doorbell: the batch is in the send
// queue (the same checks, the whole batch or none of it), and the device
// starts on it at the next Ring or PostSend. Several goroutines that send
// on one QP can so share one doorbell (one system call on rxe): each
// queues its requests under the lock it already holds for the queue, and
// whoever rings covers all of them. QueueSend and PostSend must not run
// concurrently on one QP; Ring may.
func (q *QP) QueueSend(wrs []SendWR) error {
	if q.bad() {
		return errNilQP
	}
	if err := q.checkSend("queue send", wrs); err != nil || len(wrs) == 0 {
		return err
	}
	return q.drv.QueueSend(wrs)
}

// Ring rings the send doorbell once for every work request queued so far
// (QueueSend). Any goroutine may call it at any time, also while another
// queues; it waits for a Close in progress and returns ErrClosed after
// one.
func (q *QP) Ring() error {
	if q.bad() {
		return errNilQP
	}
	q.once.Lock()
	defer q.once.Unlock()
	if q.once.IsClosed() {
		return ErrClosed
	}
	return q.drv.Ring()
}

// PostRecv posts a batch of receive work requests (no system call on rxe).
// The whole batch is posted or none of it. The QP must be past RESET.
func (q *QP) PostRecv(wrs []RecvWR) error {
	if q.bad() {
		return errNilQP
	}
	if q.once.IsClosed() {
		return ErrClosed
	}
	if len(wrs) == 0 {
		return nil
	}
	if q.cfg.SRQ != nil {
		return errors.New("qp: post receive: the QP receives through its SRQ: post there")
	}
	if q.State() == Reset {
		return &StateError{Op: "post receive", State: Reset, Want: "INIT, RTR or RTS"}
	}
	return q.drv.PostRecv(wrs)
}

// StateError is returned for an operation the QP's state does not allow.
type StateError struct {
	Op    string
	State State
	Want  string
}

func (e *StateError) Error() string {
	if e == nil {
		return "qp: nil StateError"
	}
	return fmt.Sprintf("qp: %s: QP is in state %v, must be %s", e.Op, e.State, e.Want)
}

// destroyHooked is destroy with the provider's hooks: its work before
// the command (provider.QPDestroyer), and once the kernel destroyed the QP
// (no completion of it can come any more) the CQ clean
// (provider.CQCleaner), as rdma-core's mlx5_destroy_qp orders them.
func (q *QP) destroyHooked() error {
	if d, ok := q.drv.(provider.QPDestroyer); ok {
		if err := d.BeforeDestroy(); err != nil {
			return fmt.Errorf("provider: %w", err)
		}
	}
	if err := q.destroy(); err != nil {
		return err
	}
	q.cleanCQs()
	return nil
}

func (q *QP) destroy() error { return uvobj.DestroyQP(uvobj.Of(q.ctx).File, q.handle) }

// Close destroys the QP and unmaps its queues. Idempotent. Do not Close
// while another goroutine posts.
func (q *QP) Close() error {
	if q.bad() {
		return errNilQP
	}
	return q.once.Close(uvobj.Of(q.ctx).Objects, q, q.user, q.destroyHooked,
		func(err error) error { return fmt.Errorf("qp: destroy QP %d: %w", q.qpn, err) }, q.drv.Close)
}
