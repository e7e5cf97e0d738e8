package qp

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/goverbs/goverbs/internal/uvobj"
	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/uverbs/provider"
)

// SRQConfig describes a shared receive queue.
type SRQConfig struct {
	MaxWR  uint32
	MaxSGE uint32 // default 1
	// Limit arms the limit event at creation: when fewer than Limit
	// receives remain posted the device reports EventSRQLimitReached once.
	Limit uint32
}

// SRQ is a shared receive queue: one pool of posted receive buffers that
// any number of QPs receive into. Its receive side is used by one
// goroutine at a time.
type SRQ struct {
	pd     *uverbs.PD
	ctx    *uverbs.Context
	drv    provider.SRQ
	handle uint32
	num    uint32
	maxWR  uint32
	maxSGE uint32
	user   uint64
	once   uvobj.Once // Close once; its lock serialises Close with what must not run beside it
}

// SRQ modify mask bits (IB_SRQ_*).
const (
	srqMaxWR = 1 << 0
	srqLimit = 1 << 1
)

// CreateSRQ makes a shared receive queue in pd, checked against the
// device's limits.
func CreateSRQ(pd *uverbs.PD, cfg SRQConfig) (*SRQ, error) {
	if pd == nil {
		return nil, errors.New("qp: create SRQ: nil PD")
	}
	// The PD first: a zero or closed one has no device limits to check
	// the configuration against. Its handle is read again, held open,
	// for the command.
	if _, err := pd.Handle(); err != nil {
		return nil, fmt.Errorf("qp: create SRQ: PD: %w", err)
	}
	if cfg.MaxSGE == 0 {
		cfg.MaxSGE = 1
	}
	ctx := pd.Context()
	a := ctx.Attr()
	if a.MaxSRQ == 0 {
		return nil, fmt.Errorf("qp: create SRQ: %s has no shared receive queues", ctx.Name())
	}
	if cfg.MaxWR == 0 || cfg.MaxWR > a.MaxSRQWR {
		return nil, fmt.Errorf("qp: create SRQ: MaxWR %d out of range 1..%d (device limit)", cfg.MaxWR, a.MaxSRQWR)
	}
	if cfg.MaxSGE > a.MaxSRQSGE {
		return nil, fmt.Errorf("qp: create SRQ: MaxSGE %d out of range 1..%d (device limit)", cfg.MaxSGE, a.MaxSRQSGE)
	}
	if cfg.Limit > cfg.MaxWR {
		return nil, fmt.Errorf("qp: create SRQ: Limit %d above MaxWR %d", cfg.Limit, cfg.MaxWR)
	}
	parts := uvobj.Of(ctx)
	drv, err := parts.Driver.NewSRQ(cfg.MaxWR, cfg.MaxSGE)
	if err != nil {
		return nil, fmt.Errorf("qp: create SRQ: %w", err)
	}
	in, out := drv.Udata()
	// The PD is held open from its handle's read to the kernel's answer:
	// a Close of it meanwhile would free the handle for the next PD the
	// context makes, and the SRQ would be made in that one (as in
	// Create).
	ph, ok := uvobj.HoldHandle(pd)
	if !ok {
		return nil, fmt.Errorf("qp: create SRQ: PD: %w", ErrClosed)
	}
	user := parts.Objects.NewUserHandle(nil)
	req := ioctl.CreateSRQ{User_handle: user, Pd_handle: ph, Max_wr: cfg.MaxWR, Max_sge: cfg.MaxSGE, Srq_limit: cfg.Limit}
	var resp ioctl.CreateSRQResp
	err = parts.File.Write(&ioctl.Cmd{
		Command: ioctl.IB_USER_VERBS_CMD_CREATE_SRQ, In: unsafe.Pointer(&req), InLen: ioctl.SizeofCreateSRQ,
		Out: unsafe.Pointer(&resp), OutLen: ioctl.SizeofCreateSRQResp, DriverIn: in, DriverOut: out,
	}, "CREATE_SRQ")
	uvobj.ReleaseHandle(pd)
	if err != nil {
		parts.Objects.ReleaseUserHandle(user)
		return nil, fmt.Errorf("qp: create SRQ of %d on %s: %w", cfg.MaxWR, ctx.Name(), err)
	}
	s := &SRQ{pd: pd, ctx: ctx, drv: drv, handle: resp.Srq_handle, num: resp.Srqn, maxWR: resp.Max_wr,
		maxSGE: resp.Max_sge, user: user}
	parts.Objects.BindUserHandle(user, s)
	if err := drv.Attach(parts.Device, s.handle, s.maxWR, s.maxSGE); err != nil {
		parts.Objects.ReleaseUserHandle(user)
		s.destroy()
		return nil, fmt.Errorf("qp: create SRQ on %s: %w", ctx.Name(), err)
	}
	if err := parts.Objects.Track(s); err != nil {
		parts.Objects.ReleaseUserHandle(user)
		s.destroy()
		drv.Close()
		return nil, err
	}
	return s, nil
}

// MaxWR is the number of receives the SRQ holds (at least what was asked).
func (s *SRQ) MaxWR() uint32 { return s.orZero().maxWR }

// MaxSGE is the number of SGEs per receive.
func (s *SRQ) MaxSGE() uint32 { return s.orZero().maxSGE }

// Num is the SRQ number.
func (s *SRQ) Num() uint32 { return s.orZero().num }

// IsClosed reports whether Close was called.
func (s *SRQ) IsClosed() bool {
	if s == nil {
		return true
	}
	return s.once.IsClosed()
}

func (s *SRQ) String() string {
	if s == nil {
		return "<nil>"
	}
	return fmt.Sprintf("SRQ %d on %s", s.num, s.ctx.Name())
}

// Handle is the kernel handle, or ErrClosed after Close. The number names
// this SRQ only while it is open: once a Close destroyed it, the kernel
// gives it to the next object the context creates, so a handle read
// before a Close and used after it names another SRQ, or nothing. Create
// does not use it so: it holds the SRQ open from its look at the handle
// to the kernel's answer, and a Close meanwhile waits for it (and then
// fails, EBUSY: the QP uses the SRQ).
func (s *SRQ) Handle() (uint32, error) {
	if s.bad() {
		return 0, errNilSRQ
	}
	if s.once.IsClosed() {
		return 0, ErrClosed
	}
	return s.handle, nil
}

// PostRecv posts a batch of receives (no system call on rxe), all or none.
func (s *SRQ) PostRecv(wrs []RecvWR) error {
	if s.bad() {
		return errNilSRQ
	}
	if s.once.IsClosed() {
		return ErrClosed
	}
	if len(wrs) == 0 {
		return nil
	}
	return s.drv.PostRecv(wrs)
}

// SetLimit arms the limit event: when fewer than limit receives remain,
// the device reports EventSRQLimitReached once, and the limit is disarmed
// until set again. 0 disarms.
func (s *SRQ) SetLimit(limit uint32) error {
	if s.bad() {
		return errNilSRQ
	}
	if s.once.IsClosed() {
		return ErrClosed
	}
	if limit > s.maxWR {
		return fmt.Errorf("qp: SRQ %d: limit %d above its %d receives", s.num, limit, s.maxWR)
	}
	// Checked again under Close's lock: an SRQ closed since the check
	// above has a destroyed handle, which the kernel may have given to a
	// new object of this context already.
	s.once.Lock()
	defer s.once.Unlock()
	if s.once.IsClosed() {
		return ErrClosed
	}
	req := ioctl.ModifySRQ{Srq_handle: s.handle, Attr_mask: srqLimit, Srq_limit: limit}
	err := uvobj.Of(s.ctx).File.Write(&ioctl.Cmd{
		Command: ioctl.IB_USER_VERBS_CMD_MODIFY_SRQ, In: unsafe.Pointer(&req), InLen: ioctl.SizeofModifySRQ,
		DriverIn: s.drv.ModifyUdata(),
	}, "MODIFY_SRQ")
	if err != nil {
		return fmt.Errorf("qp: SRQ %d: set limit %d: %w", s.num, limit, err)
	}
	return nil
}

// SRQAttr is what Query reports.
type SRQAttr struct {
	MaxWR, MaxSGE, Limit uint32
}

// Query asks the kernel for the SRQ's attributes; Limit reads 0 once the
// limit event fired.
func (s *SRQ) Query() (SRQAttr, error) {
	if s.bad() {
		return SRQAttr{}, errNilSRQ
	}
	s.once.Lock() // as SetLimit: not the handle of an SRQ closed meanwhile
	defer s.once.Unlock()
	if s.once.IsClosed() {
		return SRQAttr{}, ErrClosed
	}
	req := ioctl.QuerySRQ{Handle: s.handle}
	var r ioctl.QuerySRQResp
	err := uvobj.Of(s.ctx).File.Write(&ioctl.Cmd{
		Command: ioctl.IB_USER_VERBS_CMD_QUERY_SRQ, In: unsafe.Pointer(&req), InLen: ioctl.SizeofQuerySRQ,
		Out: unsafe.Pointer(&r), OutLen: ioctl.SizeofQuerySRQResp,
	}, "QUERY_SRQ")
	if err != nil {
		return SRQAttr{}, fmt.Errorf("qp: SRQ %d: query: %w", s.num, err)
	}
	return SRQAttr{MaxWR: r.Max_wr, MaxSGE: r.Max_sge, Limit: r.Srq_limit}, nil
}

func (s *SRQ) destroy() error { return uvobj.DestroySRQ(uvobj.Of(s.ctx).File, s.handle) }

// Close destroys the SRQ and unmaps its queue; it fails (EBUSY) while QPs
// use it. Idempotent. SetLimit and Query wait for a Close in progress and
// return ErrClosed after one; do not Close while another goroutine posts
// (PostRecv).
func (s *SRQ) Close() error {
	if s.bad() {
		return errNilSRQ
	}
	return s.once.Close(uvobj.Of(s.ctx).Objects, s, s.user, s.destroy,
		func(err error) error { return fmt.Errorf("qp: destroy SRQ %d: %w", s.num, err) }, s.drv.Close)
}
