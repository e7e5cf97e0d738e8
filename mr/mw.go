package mr

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/goverbs/goverbs/internal/uvobj"
	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/uverbs"
)

// MWType is a memory window type (IB_MW_TYPE_*).
type MWType uint8

// Memory window types.
const (
	// MWType1 windows, once bound, accept their rkey on every QP of the
	// protection domain; LOCAL_INV cannot invalidate them.
	MWType1 MWType = 1
	// MWType2 windows are bound by a BIND_MW work request on one QP and
	// accept their rkey only from that QP's peer, until LOCAL_INV on that
	// side or the peer's SEND_WITH_INV invalidates them.
	MWType2 MWType = 2
)

func (t MWType) String() string {
	switch t {
	case MWType1:
		return "type 1"
	case MWType2:
		return "type 2"
	}
	return fmt.Sprintf("MWType(%d)", uint8(t))
}

// mwAccess is what a window may grant.
const mwAccess = RemoteRead | RemoteWrite | RemoteAtomic

// MW is a memory window: an rkey that opens a range of a memory region
// (registered with MWBind) to a peer. Allocate one with AllocMW, bind it
// with a BIND_MW work request that Bind describes, hand RKey to the peer,
// and invalidate it with a LOCAL_INV work request (or let the peer's
// SEND_WITH_INV do it); then bind it again with a new key. A window is
// bound by one goroutine at a time.
type MW struct {
	pd     *uverbs.PD
	typ    MWType
	handle uint32
	// rkey is the window's rkey as of the last Bind: binds execute in
	// send-queue order and the kernel checks each against the key the
	// previous one set.
	rkey atomic.Uint32
	once uvobj.Once // Close once; its lock serialises Close with what must not run beside it
}

// AllocMW allocates a memory window of type typ in pd (ALLOC_MW; the kernel
// has no ioctl method for it). The window starts unbound: its RKey opens
// nothing.
func AllocMW(pd *uverbs.PD, typ MWType) (*MW, error) {
	if pd == nil {
		return nil, errors.New("mr: alloc MW: nil PD")
	}
	if typ != MWType1 && typ != MWType2 {
		return nil, fmt.Errorf("mr: alloc MW: unknown window type %d (want MWType1 or MWType2)", uint8(typ))
	}
	if _, err := pd.Handle(); err != nil {
		return nil, fmt.Errorf("mr: alloc MW: PD: %w", err)
	}
	ctx := pd.Context()
	if max := ctx.Attr().MaxMW; max == 0 {
		return nil, fmt.Errorf("mr: alloc MW on %s: the device supports no memory windows", ctx.Name())
	}
	// Held open to the kernel's answer, as in Register.
	ph, ok := uvobj.HoldHandle(pd)
	if !ok {
		return nil, fmt.Errorf("mr: alloc MW: PD: %w", uverbs.ErrClosed)
	}
	req := ioctl.AllocMW{Pd_handle: ph, Mw_type: uint8(typ)}
	var resp ioctl.AllocMWResp
	err := uvobj.Of(ctx).File.Write(&ioctl.Cmd{
		Command: ioctl.IB_USER_VERBS_CMD_ALLOC_MW,
		In:      unsafe.Pointer(&req), InLen: ioctl.SizeofAllocMW,
		Out: unsafe.Pointer(&resp), OutLen: ioctl.SizeofAllocMWResp,
	}, "ALLOC_MW")
	uvobj.ReleaseHandle(pd)
	if err != nil {
		return nil, fmt.Errorf("mr: alloc %v MW on %s: %w", typ, ctx.Name(), err)
	}
	w := &MW{pd: pd, typ: typ, handle: resp.Handle}
	w.rkey.Store(resp.Rkey)
	if err := uvobj.Of(ctx).Objects.Track(w); err != nil {
		w.destroy()
		return nil, err
	}
	return w, nil
}

// RKey is the window's rkey: as allocated, or as the last Bind set it.
func (w *MW) RKey() uint32 { return w.orZero().rkey.Load() }

// Type is the window's type.
func (w *MW) Type() MWType { return w.orZero().typ }

// PD returns the protection domain.
func (w *MW) PD() *uverbs.PD { return w.orZero().pd }

// IsClosed reports whether the window was closed (by Close, or by closing
// its Context). It is true of a nil or zero MW.
func (w *MW) IsClosed() bool {
	if w.bad() {
		return true
	}
	return w.once.IsClosed()
}

var errMWClosed = fmt.Errorf("mr: bind MW: %w", uverbs.ErrClosed)

// Bind describes a BIND_MW work request that opens n bytes at offset off of
// m to the peer with the given remote access (RemoteRead, RemoteWrite,
// RemoteAtomic), under a new rkey whose low 8 bits are key: post it with
// Opcode qp.OpBindMW on the QP whose peer will use the rkey (a type 2
// window serves that QP only). It returns the request and the new rkey is
// RKey from then on.
//
// Bind advances the window's rkey when it returns, as rdma-core's rxe
// provider does: the kernel checks each bind against the rkey the one
// before it set, in send-queue order, so post the request before the next
// Bind of this window. A request that is never posted, or that completes
// with an error (which moves the QP to ERR), leaves the rkey here ahead of
// the kernel's: close the window and allocate another.
//
// key must differ from the low byte of the current rkey, so that the old
// rkey stops working; 8 bits give 255 binds before a key comes back.
// Bind allocates nothing.
func (w *MW) Bind(m *MR, off, n int, access Access, key uint8) (uverbs.MWBind, error) {
	if w.bad() {
		return uverbs.MWBind{}, errNilMW
	}
	if w.once.IsClosed() {
		return uverbs.MWBind{}, errMWClosed
	}
	if m.bad() {
		return uverbs.MWBind{}, errNilBindMR
	}
	if m.IsClosed() {
		return uverbs.MWBind{}, errBindMRClosed
	}
	if m.pd != w.pd {
		return uverbs.MWBind{}, errors.New("mr: bind MW: the memory region is in another protection domain than the window")
	}
	if m.access&MWBind == 0 {
		return uverbs.MWBind{}, fmt.Errorf("mr: bind MW: the memory region was registered without MWBind access (%v)", m.access)
	}
	if n <= 0 {
		return uverbs.MWBind{}, fmt.Errorf("mr: bind MW: length %d: a window must cover at least one byte", n)
	}
	if off < 0 || off+n > len(m.buf) || off+n < off {
		return uverbs.MWBind{}, fmt.Errorf("mr: bind MW: range [%d, %d) outside the %d-byte region", off, off+n, len(m.buf))
	}
	if access == 0 || access&^mwAccess != 0 {
		return uverbs.MWBind{}, fmt.Errorf("mr: bind MW: access %v: a window grants some of RemoteRead, RemoteWrite and RemoteAtomic, nothing else", access)
	}
	if access&(RemoteWrite|RemoteAtomic) != 0 && m.access&LocalWrite == 0 {
		return uverbs.MWBind{}, fmt.Errorf("mr: bind MW: access %v needs a region with LocalWrite (it has %v)", access, m.access)
	}
	cur := w.rkey.Load()
	if uint8(cur) == key {
		return uverbs.MWBind{}, fmt.Errorf("mr: bind MW: key %#02x is the low byte of the window's current rkey %#x: a bind must change it so that the old rkey stops working", key, cur)
	}
	next := cur&^0xff | uint32(key)
	w.rkey.Store(next)
	return uverbs.MWBind{MWRKey: cur, RKey: next, LKey: m.lkey, Access: uint32(access),
		Addr: m.Addr() + uint64(off), Length: uint64(n)}, nil
}

var errNilBindMR = errors.New("mr: bind MW: nil memory region (or a zero one, not from Register)")

var errBindMRClosed = fmt.Errorf("mr: bind MW: memory region: %w", uverbs.ErrClosed)

func (w *MW) destroy() error { return uvobj.DeallocMW(uvobj.Of(w.pd.Context()).File, w.handle) }

// Close deallocates the window; a bound window stops opening its range.
// Idempotent.
func (w *MW) Close() error {
	if w.bad() {
		return errNilMW
	}
	return w.once.Close(uvobj.Of(w.pd.Context()).Objects, w, 0, w.destroy,
		func(err error) error { return fmt.Errorf("mr: dealloc MW: %w", err) }, nil)
}
