// Package mr registers memory with an RDMA device.
//
// A user allocates memory outside the Go heap with Alloc (anonymous mmap,
// huge pages where the system has them), registers it in a protection
// domain with Register, and hands the MR's LKey (and, to peers, its RKey
// and address) to work requests. Close deregisters; Memory.Close unmaps.
package mr

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"unsafe"

	"github.com/goverbs/goverbs/internal/uvobj"
	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/uverbs"
	"golang.org/x/sys/unix"
)

// Access says what the device may do with a region (IB_ACCESS_*).
type Access uint32

// Access flags.
const (
	LocalWrite   Access = ioctl.IB_UVERBS_ACCESS_LOCAL_WRITE
	RemoteWrite  Access = ioctl.IB_UVERBS_ACCESS_REMOTE_WRITE
	RemoteRead   Access = ioctl.IB_UVERBS_ACCESS_REMOTE_READ
	RemoteAtomic Access = ioctl.IB_UVERBS_ACCESS_REMOTE_ATOMIC
	// MWBind lets memory windows be bound to the region (see MW).
	MWBind Access = ioctl.IB_UVERBS_ACCESS_MW_BIND
)

func (a Access) String() string {
	var s []string
	for _, f := range []struct {
		a Access
		n string
	}{{LocalWrite, "LocalWrite"}, {RemoteWrite, "RemoteWrite"}, {RemoteRead, "RemoteRead"}, {RemoteAtomic, "RemoteAtomic"}, {MWBind, "MWBind"}} {
		if a&f.a != 0 {
			s = append(s, f.n)
			a &^= f.a
		}
	}
	if a != 0 {
		s = append(s, fmt.Sprintf("%#x", uint32(a)))
	}
	if len(s) == 0 {
		return "LocalRead"
	}
	return strings.Join(s, "|")
}

const known = LocalWrite | RemoteWrite | RemoteRead | RemoteAtomic | MWBind

// Memory is a block of memory outside the Go heap.
type Memory struct {
	mu   sync.Mutex
	buf  []byte // nil after Close
	size int    // Alloc's size, never cleared: 0 only in a zero Memory
	huge bool
}

// hugePage is the size of the huge pages Alloc tries.
const hugePage = 2 << 20

// Alloc maps size bytes of zeroed anonymous memory outside the Go heap.
// Sizes that are a multiple of 2 MiB try huge pages first and fall back to
// normal pages when the system has none reserved; either way that memory is
// 2 MiB-aligned. Other sizes are 64 KiB-aligned.
func Alloc(size int) (*Memory, error) {
	if size <= 0 {
		return nil, fmt.Errorf("mr: alloc %d bytes: size must be positive", size)
	}
	align := granule
	if size%hugePage == 0 {
		// hugetlb mappings are aligned to the huge page size.
		if p, err := unix.MmapPtr(-1, 0, nil, uintptr(size), prot, anon|unix.MAP_HUGETLB); err == nil {
			return &Memory{buf: unsafe.Slice((*byte)(p), size), size: size, huge: true}, nil
		}
		align = hugePage
	}
	p, err := mmapAligned(size, align)
	if err != nil {
		return nil, fmt.Errorf("mr: alloc %d bytes: %w", size, err)
	}
	return &Memory{buf: unsafe.Slice((*byte)(p), size), size: size}, nil
}

const (
	prot = unix.PROT_READ | unix.PROT_WRITE
	anon = unix.MAP_PRIVATE | unix.MAP_ANONYMOUS
)

// mmapAligned maps size bytes of plain pages at an address aligned to
// align, a power of two. mmap only promises page alignment (without
// reserved huge pages, a 2 MiB-multiple mapping is 4 KiB-aligned on most
// kernels), so it maps align more than needed and unmaps the ends.
func mmapAligned(size, align int) (unsafe.Pointer, error) {
	page := unix.Getpagesize()
	length := roundUp(size, page)
	if align <= page {
		return unix.MmapPtr(-1, 0, nil, uintptr(length), prot, anon)
	}
	total := length + align - page
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(total), prot, anon)
	if err != nil {
		return nil, err
	}
	head := (align - int(uintptr(p)%uintptr(align))) % align
	if head > 0 {
		if err := unix.MunmapPtr(p, uintptr(head)); err != nil {
			unix.MunmapPtr(p, uintptr(total))
			return nil, err
		}
	}
	q := unsafe.Add(p, head)
	if tail := total - head - length; tail > 0 {
		if err := unix.MunmapPtr(unsafe.Add(q, length), uintptr(tail)); err != nil {
			unix.MunmapPtr(q, uintptr(total-head))
			return nil, err
		}
	}
	return q, nil
}

// Bytes returns the memory, or nil after Close (or of a nil or zero
// Memory).
func (m *Memory) Bytes() []byte {
	if m.bad() {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.buf
}

// Huge reports whether the memory sits on huge pages.
func (m *Memory) Huge() bool {
	if m.bad() {
		return false
	}
	return m.huge
}

// Close unmaps the memory. Deregister every MR on it first. Idempotent.
func (m *Memory) Close() error {
	if m.bad() {
		return errNilMemory
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.buf == nil {
		return nil
	}
	// Alloc's mappings are not in x/sys/unix's table of Mmap'ed slices.
	err := unix.MunmapPtr(unsafe.Pointer(&m.buf[0]), uintptr(len(m.buf)))
	m.buf = nil
	return err
}

// MR is a registered memory region.
type MR struct {
	pd     *uverbs.PD
	buf    []byte
	access Access
	handle uint32
	lkey   uint32
	rkey   uint32
	once   uvobj.Once // Close once; its lock serialises Close with what must not run beside it
}

// Register registers buf in pd. buf must stay mapped, and must not be
// memory the Go garbage collector may free, until the MR is closed: use
// Alloc. Remote write and remote atomic access need LocalWrite too.
func Register(pd *uverbs.PD, buf []byte, access Access) (*MR, error) {
	if pd == nil {
		return nil, errors.New("mr: register: nil PD")
	}
	if len(buf) == 0 {
		return nil, errors.New("mr: register: empty buffer")
	}
	if access&^known != 0 {
		return nil, fmt.Errorf("mr: register: unknown access flags %#x", uint32(access&^known))
	}
	if access&(RemoteWrite|RemoteAtomic) != 0 && access&LocalWrite == 0 {
		return nil, fmt.Errorf("mr: register: access %v: remote write and remote atomic need LocalWrite too", access)
	}
	if _, err := pd.Handle(); err != nil {
		return nil, fmt.Errorf("mr: register: PD: %w", err)
	}
	ctx := pd.Context()
	// The PD is held open from its handle's read to the kernel's answer:
	// a Close of it meanwhile would free the handle for the next PD the
	// context makes, and the MR would be registered in that one.
	ph, ok := uvobj.HoldHandle(pd)
	if !ok {
		return nil, fmt.Errorf("mr: register: PD: %w", uverbs.ErrClosed)
	}
	addr := uint64(uintptr(unsafe.Pointer(&buf[0])))
	req := ioctl.RegMR{Start: addr, Length: uint64(len(buf)), Hca_va: addr, Pd_handle: ph, Access_flags: uint32(access)}
	var resp ioctl.RegMRResp
	err := uvobj.Of(ctx).File.Write(&ioctl.Cmd{
		Command: ioctl.IB_USER_VERBS_CMD_REG_MR,
		In:      unsafe.Pointer(&req), InLen: ioctl.SizeofRegMR,
		Out: unsafe.Pointer(&resp), OutLen: ioctl.SizeofRegMRResp,
	}, "REG_MR")
	uvobj.ReleaseHandle(pd)
	if err != nil {
		return nil, fmt.Errorf("mr: register %d bytes at %#x (%v) on %s: %w", len(buf), addr, access, ctx.Name(), err)
	}
	m := &MR{pd: pd, buf: buf, access: access, handle: resp.Handle, lkey: resp.Lkey, rkey: resp.Rkey}
	if err := uvobj.Of(ctx).Objects.Track(m); err != nil {
		m.destroy()
		return nil, err
	}
	return m, nil
}

// LKey is the local key that SGEs name.
func (m *MR) LKey() uint32 { return m.orZero().lkey }

// RKey is the remote key a peer uses for RDMA and atomics.
func (m *MR) RKey() uint32 { return m.orZero().rkey }

// Addr is the address of the first byte, as work requests name it (0 for
// a nil or zero MR).
func (m *MR) Addr() uint64 {
	if m.bad() {
		return 0
	}
	return m.addr()
}

// addr is Addr of an MR that is not bad: buf has a first byte.
func (m *MR) addr() uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(m.buf)))) }

// Len is the region's length in bytes.
func (m *MR) Len() int { return len(m.orZero().buf) }

// Bytes is the registered memory.
func (m *MR) Bytes() []byte { return m.orZero().buf }

// Access returns the region's access flags.
func (m *MR) Access() Access { return m.orZero().access }

// PD returns the protection domain.
func (m *MR) PD() *uverbs.PD { return m.orZero().pd }

// Contains reports whether [addr, addr+n) lies inside the region.
func (m *MR) Contains(addr uint64, n int) bool {
	if m.bad() {
		return false
	}
	a := m.addr()
	return addr >= a && n >= 0 && addr+uint64(n) <= a+uint64(len(m.buf)) && addr+uint64(n) >= addr
}

// SGE returns the SGE for n bytes at offset off, or an error if that range
// is outside the region, n is 4 GiB or more (an SGE's length is 32 bits),
// or the MR is closed (uverbs.ErrClosed: its LKey no
// longer names anything, or names a region registered since).
func (m *MR) SGE(off, n int) (uverbs.SGE, error) {
	if m.bad() {
		return uverbs.SGE{}, errNilMR
	}
	if m.once.IsClosed() {
		return uverbs.SGE{}, errMRClosed
	}
	if off < 0 || n < 0 || off+n > len(m.buf) || off+n < off {
		return uverbs.SGE{}, fmt.Errorf("mr: SGE [%d, %d) outside the %d-byte region", off, off+n, len(m.buf))
	}
	if uint64(n) > math.MaxUint32 {
		return uverbs.SGE{}, fmt.Errorf("mr: SGE of %d bytes: an SGE's length is 32 bits (at most %d)", n, uint64(math.MaxUint32))
	}
	return uverbs.SGE{Addr: m.addr() + uint64(off), Length: uint32(n), LKey: m.lkey}, nil
}

func (m *MR) destroy() error { return uvobj.DeregMR(uvobj.Of(m.pd.Context()).File, m.handle) }

var errMRClosed = fmt.Errorf("mr: SGE: %w", uverbs.ErrClosed)

// IsClosed reports whether the MR was closed (by Close, or by closing its
// Context). It is true of a nil or zero MR.
func (m *MR) IsClosed() bool {
	if m.bad() {
		return true
	}
	return m.once.IsClosed()
}

// Close deregisters the region. Idempotent.
func (m *MR) Close() error {
	if m.bad() {
		return errNilMR
	}
	return m.once.Close(uvobj.Of(m.pd.Context()).Objects, m, 0, m.destroy,
		func(err error) error { return fmt.Errorf("mr: deregister: %w", err) }, nil)
}
