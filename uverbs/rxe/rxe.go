package rxe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/uverbs/provider"
	gwr "github.com/goverbs/goverbs/wr" // (wr names work requests here)
	"golang.org/x/sys/unix"
)

// ABIVersion is the rxe userspace ABI this provider speaks (the uverbs
// device's sysfs abi_version; RXE_UVERBS_ABI_VERSION in the kernel).
const ABIVersion = 2

// Provider is the rxe provider.
type Provider struct{}

// Name implements provider.Provider.
func (Provider) Name() string { return "rxe" }

// rxe registers itself with the core (uverbs imports this package).
func init() { provider.Register(Provider{}) }

// DriverID implements provider.Provider.
func (Provider) DriverID() uint32 { return ioctl.RDMA_DRIVER_RXE }

// CheckABI implements provider.Provider.
func (Provider) CheckABI(v int) error {
	if v != ABIVersion {
		return fmt.Errorf("rxe: kernel driver ABI version %d, this provider speaks %d", v, ABIVersion)
	}
	return nil
}

// NewContext implements provider.Provider.
func (Provider) NewContext() provider.Context { return &context{} }

type context struct{ dev provider.Device }

func (c *context) Udata() (in, out []byte)            { return nil, nil }
func (c *context) Attach(dev provider.Device) error   { c.dev = dev; return nil }
func (c *context) Close() error                       { return nil }
func (c *context) NewCQ(cqe int) (provider.CQ, error) { return &cq{}, nil }
func (c *context) NewAH() (provider.AH, error)        { return &AH{}, nil }

func (c *context) NewSRQ(maxWR, maxSGE uint32) (provider.SRQ, error) { return &srq{}, nil }

func (c *context) NewQP(req provider.QPRequest) (provider.QP, error) {
	if req.Type != ioctl.IB_UVERBS_QPT_RC && req.Type != ioctl.IB_UVERBS_QPT_UC && req.Type != ioctl.IB_UVERBS_QPT_UD {
		return nil, fmt.Errorf("rxe: QP type %d not supported", req.Type)
	}
	return &qp{typ: req.Type, hasSRQ: req.HasSRQ}, nil
}

// cq is a completion queue ring of struct ib_uverbs_wc entries.
type cq struct {
	resp ioctl.RxeCreateCQResp
	dev  provider.Device
	r    ring
}

func (c *cq) Udata() (in, out []byte) {
	return nil, unsafe.Slice((*byte)(unsafe.Pointer(&c.resp)), ioctl.SizeofRxeCreateCQResp)
}

func (c *cq) Attach(dev provider.Device, handle uint32, cqe int) error {
	mem, err := dev.Mmap(int64(c.resp.Mi.Offset), int(c.resp.Mi.Size))
	if err != nil {
		return fmt.Errorf("rxe: map completion queue: %w", err)
	}
	r, err := newRing(mem)
	if err != nil {
		dev.Munmap(mem)
		return err
	}
	if r.elemSize < ioctl.SizeofWC {
		dev.Munmap(mem)
		return fmt.Errorf("rxe: completion entries of %d bytes, want at least %d", r.elemSize, ioctl.SizeofWC)
	}
	c.dev, c.r = dev, r
	return nil
}

func (c *cq) Poll(wc []provider.WC) int {
	r := &c.r
	if r.mem == nil {
		return 0
	}
	cons := atomic.LoadUint32(r.cons)
	prod := atomic.LoadUint32(r.prod) // acquire: entries before it are written
	n := 0
	for n < len(wc) && cons != prod {
		k := (*ioctl.WC)(r.slot(cons))
		w := &wc[n]
		w.ID = k.Wr_id
		w.Status = provider.WCStatus(k.Status)
		w.Opcode = provider.WCOpcode(k.Opcode)
		w.VendorErr = k.Vendor_err
		w.ByteLen = k.Byte_len
		w.Imm = binary.BigEndian.Uint32(k.Ex[:])
		w.InvRKey = 0
		if k.Wc_flags&uint32(gwr.WCWithInv) != 0 {
			// The union holds invalidate_rkey in host order.
			w.InvRKey, w.Imm = binary.NativeEndian.Uint32(k.Ex[:]), 0
		}
		w.QPNum = k.Qp_num
		w.SrcQP = k.Src_qp
		w.Flags = provider.WCFlags(k.Wc_flags)
		w.PKeyIndex = k.Pkey_index
		w.SLID = k.Slid
		w.SL = k.Sl
		w.DLIDPathBits = k.Dlid_path_bits
		w.PortNum = k.Port_num
		cons = (cons + 1) & r.mask
		n++
	}
	if n > 0 {
		atomic.StoreUint32(r.cons, cons) // release: the slots are free again
	}
	return n
}

func (c *cq) Empty() bool {
	if c.r.mem == nil {
		return true
	}
	return atomic.LoadUint32(c.r.cons) == atomic.LoadUint32(c.r.prod)
}

func (c *cq) Close() error {
	if c.r.mem == nil {
		return nil
	}
	err := c.dev.Munmap(c.r.mem)
	c.r = ring{}
	return err
}

// doorbell is the POST_SEND command with no work requests that makes the
// kernel look at the send queue, sent with write() like rdma-core does.
type doorbell struct {
	hdr  ioctl.CmdHdr
	cmd  ioctl.PostSend
	resp ioctl.PostSendResp
}

type qp struct {
	typ    uint32
	hasSRQ bool
	resp   ioctl.RxeCreateQPResp
	dev    provider.Device
	fd     int
	caps   provider.QPCaps
	sq, rq ring
	db     *doorbell
}

func (q *qp) Udata() (in, out []byte) {
	return nil, unsafe.Slice((*byte)(unsafe.Pointer(&q.resp)), ioctl.SizeofRxeCreateQPResp)
}

func (q *qp) Attach(dev provider.Device, handle, qpn uint32, caps provider.QPCaps) error {
	q.dev, q.caps = dev, caps
	var err error
	if q.sq, err = q.mapRing(q.resp.Sq_mi, "send"); err != nil {
		return err
	}
	if !q.hasSRQ {
		if q.rq, err = q.mapRing(q.resp.Rq_mi, "receive"); err != nil {
			q.Close()
			return err
		}
	}
	q.fd = dev.File().Fd()
	db := new(doorbell)
	db.hdr.Command = ioctl.IB_USER_VERBS_CMD_POST_SEND
	db.hdr.In_words = uint16((ioctl.SizeofCmdHdr + ioctl.SizeofPostSend) / 4)
	db.hdr.Out_words = uint16(ioctl.SizeofPostSendResp / 4)
	db.cmd.Response = uint64(uintptr(unsafe.Pointer(&db.resp)))
	db.cmd.Qp_handle = handle
	// The kernel rejects a wqe_size below its own send_wr; the value is
	// otherwise unused when wr_count is 0.
	db.cmd.Wqe_size = 56
	q.db = db
	return nil
}

func (q *qp) mapRing(mi ioctl.RxeMMInfo, which string) (ring, error) {
	mem, err := q.dev.Mmap(int64(mi.Offset), int(mi.Size))
	if err != nil {
		return ring{}, fmt.Errorf("rxe: map %s queue: %w", which, err)
	}
	r, err := newRing(mem)
	if err != nil {
		q.dev.Munmap(mem)
		return ring{}, err
	}
	return r, nil
}

func (q *qp) Close() error {
	var errs []error
	for _, r := range []*ring{&q.sq, &q.rq} {
		if r.mem != nil {
			errs = append(errs, q.dev.Munmap(r.mem))
			*r = ring{}
		}
	}
	return errors.Join(errs...)
}

var errNoRQ = errors.New("rxe: the QP receives through its shared receive queue: post receives there")

func (q *qp) PostRecv(wrs []provider.RecvWR) error {
	if q.hasSRQ {
		return errNoRQ
	}
	return postRecv(&q.rq, q.caps.MaxRecvSGE, wrs)
}

// postRecv writes receive WQEs; no system call is needed. It validates
// and writes each in one pass: what it writes past the producer index is
// the kernel's only once that index is stored, so a request that fails
// leaves none of the list posted (TestRecvBatchRefusedWhole). One pass
// reads each request once; bx posts a receive per message.
func postRecv(r *ring, maxSGE uint32, wrs []provider.RecvWR) error {
	if r.mem == nil {
		return errClosed
	}
	prod := atomic.LoadUint32(r.prod)
	if uint32(len(wrs)) > r.free(prod) {
		return provider.ErrQueueFull
	}
	for i := range wrs {
		wr := &wrs[i]
		if n := len(wr.SGEs); n > int(maxSGE) {
			return fmt.Errorf("rxe: receive work request %d (id %d): %d SGEs, the queue takes %d", i, wr.ID, n, maxSGE)
		}
		total, ok := sgeTotal(wr.SGEs)
		if !ok {
			return fmt.Errorf("rxe: receive work request %d (id %d): SGE lengths overflow 32 bits", i, wr.ID)
		}
		w := (*ioctl.RxeRecvWqe)(r.slot(prod))
		w.Id = wr.ID
		w.Dma = ioctl.RxeDMAInfo{Length: total, Resid: total, Num_sge: uint32(len(wr.SGEs))}
		copySGEs(unsafe.Add(unsafe.Pointer(w), ioctl.RxeRecvWqeOffData), wr.SGEs)
		prod = (prod + 1) & r.mask
	}
	atomic.StoreUint32(r.prod, prod) // release: the kernel may consume them
	return nil
}

var errClosed = ioctl.ErrClosed

func sgeTotal(sges []provider.SGE) (uint32, bool) {
	var t uint64
	for i := range sges {
		t += uint64(sges[i].Length)
	}
	return uint32(t), t <= 1<<31
}

func copySGEs(dst unsafe.Pointer, sges []provider.SGE) {
	for i := range sges {
		s := (*ioctl.RxeSGE)(unsafe.Add(dst, uintptr(i)*ioctl.SizeofRxeSGE))
		s.Addr = sges[i].Addr
		s.Length = sges[i].Length
		s.Lkey = sges[i].LKey
	}
}

// validSend checks one work request against what this QP and rxe accept.
func (q *qp) validSend(i int, wr *provider.SendWR) error {
	total, ok := sgeTotal(wr.SGEs)
	if !ok {
		return fmt.Errorf("rxe: send work request %d (id %d): SGE lengths overflow 32 bits", i, wr.ID)
	}
	if wr.Flags&gwr.SendInline != 0 {
		if total > q.caps.MaxInline {
			return fmt.Errorf("rxe: send work request %d (id %d): %d bytes inline, the QP takes %d", i, wr.ID, total, q.caps.MaxInline)
		}
		if wr.Opcode != gwr.OpSend && wr.Opcode != gwr.OpSendWithImm && wr.Opcode != gwr.OpSendWithInv &&
			wr.Opcode != gwr.OpRDMAWrite && wr.Opcode != gwr.OpRDMAWriteWithImm {
			return fmt.Errorf("rxe: send work request %d (id %d): %v cannot carry inline data", i, wr.ID, wr.Opcode)
		}
		// writeSend reads the inline bytes at the SGEs' addresses: those
		// that cannot be process memory are refused (any other bad one
		// cannot be checked cheaply).
		for j := range wr.SGEs {
			if s := &wr.SGEs[j]; s.Length > 0 && (s.Addr == 0 || s.Addr+uint64(s.Length) < s.Addr) {
				return badInline(i, wr.ID, j, s)
			}
		}
	} else if len(wr.SGEs) > int(q.caps.MaxSendSGE) {
		return fmt.Errorf("rxe: send work request %d (id %d): %d SGEs, the QP takes %d", i, wr.ID, len(wr.SGEs), q.caps.MaxSendSGE)
	}
	switch wr.Opcode {
	case gwr.OpSend, gwr.OpSendWithImm:
		if q.typ == ioctl.IB_UVERBS_QPT_UD {
			if ah, ok := wr.AH.(*AH); !ok || ah == nil || ah.resp.Num == 0 {
				return fmt.Errorf("rxe: send work request %d (id %d): a UD send needs an address handle of this device", i, wr.ID)
			}
		}
	case gwr.OpRDMAWrite, gwr.OpRDMAWriteWithImm, gwr.OpRDMARead:
		if q.typ == ioctl.IB_UVERBS_QPT_UD || (q.typ == ioctl.IB_UVERBS_QPT_UC && wr.Opcode == gwr.OpRDMARead) {
			return fmt.Errorf("rxe: send work request %d (id %d): %v is not allowed on this QP type", i, wr.ID, wr.Opcode)
		}
	case gwr.OpAtomicCmpAndSwp, gwr.OpAtomicFetchAndAdd:
		if q.typ != ioctl.IB_UVERBS_QPT_RC {
			return fmt.Errorf("rxe: send work request %d (id %d): atomics need an RC QP", i, wr.ID)
		}
		if len(wr.SGEs) != 1 || wr.SGEs[0].Length != 8 {
			return fmt.Errorf("rxe: send work request %d (id %d): an atomic takes exactly one 8-byte SGE", i, wr.ID)
		}
		if wr.RemoteAddr%8 != 0 {
			return fmt.Errorf("rxe: send work request %d (id %d): atomic remote address %#x is not 8-byte aligned", i, wr.ID, wr.RemoteAddr)
		}
	case gwr.OpSendWithInv:
		// rxe has SEND_WITH_INVALIDATE packets for RC only.
		if q.typ != ioctl.IB_UVERBS_QPT_RC {
			return fmt.Errorf("rxe: send work request %d (id %d): SEND_WITH_INV needs an RC QP", i, wr.ID)
		}
	case gwr.OpLocalInv:
		if q.typ != ioctl.IB_UVERBS_QPT_RC {
			return fmt.Errorf("rxe: send work request %d (id %d): LOCAL_INV needs an RC QP", i, wr.ID)
		}
		if len(wr.SGEs) != 0 {
			return fmt.Errorf("rxe: send work request %d (id %d): LOCAL_INV takes no SGEs", i, wr.ID)
		}
	case gwr.OpBindMW:
		return validBind(i, q.typ, wr)
	default:
		return fmt.Errorf("rxe: send work request %d (id %d): opcode %v not supported", i, wr.ID, wr.Opcode)
	}
	return nil
}

// badInline is validSend's error for an inline SGE whose address cannot
// be read, out of its line (too costly to inline).
func badInline(i int, id uint64, j int, s *provider.SGE) error {
	if s.Addr == 0 {
		return fmt.Errorf("rxe: send work request %d (id %d): inline SGE %d: address 0 with length %d", i, id, j, s.Length)
	}
	return fmt.Errorf("rxe: send work request %d (id %d): inline SGE %d: range %#x+%d wraps around", i, id, j, s.Addr, s.Length)
}

// mwAccess are the access flags a window may grant (rxe also knows zero
// based windows, which goverbs does not offer).
const mwAccess = ioctl.IB_UVERBS_ACCESS_REMOTE_READ | ioctl.IB_UVERBS_ACCESS_REMOTE_WRITE | ioctl.IB_UVERBS_ACCESS_REMOTE_ATOMIC

// validBind checks what the kernel would otherwise answer with a bind
// error completion that moves the QP to ERR.
func validBind(i int, typ uint32, wr *provider.SendWR) error {
	b := &wr.Bind
	switch {
	case typ != ioctl.IB_UVERBS_QPT_RC && typ != ioctl.IB_UVERBS_QPT_UC:
		return fmt.Errorf("rxe: send work request %d (id %d): BIND_MW needs an RC or UC QP", i, wr.ID)
	case len(wr.SGEs) != 0 || wr.Flags&gwr.SendInline != 0:
		return fmt.Errorf("rxe: send work request %d (id %d): BIND_MW takes no SGEs or inline data", i, wr.ID)
	case b.RKey>>8 != b.MWRKey>>8:
		return fmt.Errorf("rxe: send work request %d (id %d): BIND_MW new rkey %#x names another window than the window's rkey %#x (only the low 8 bits may change)", i, wr.ID, b.RKey, b.MWRKey)
	case b.Access&^mwAccess != 0:
		return fmt.Errorf("rxe: send work request %d (id %d): BIND_MW access %#x: a window grants only remote read, write and atomic access", i, wr.ID, b.Access)
	case b.Addr+b.Length < b.Addr:
		return fmt.Errorf("rxe: send work request %d (id %d): BIND_MW range %#x+%d wraps around", i, wr.ID, b.Addr, b.Length)
	}
	return nil
}

func (q *qp) PostSend(wrs []provider.SendWR) error {
	if err := q.QueueSend(wrs); err != nil {
		return err
	}
	return q.ring()
}

// Ring implements provider.QP.
func (q *qp) Ring() error { return q.ring() }

// QueueSend implements provider.QP: the WQEs and the producer index are
// written; the kernel reads them at the next doorbell.
func (q *qp) QueueSend(wrs []provider.SendWR) error {
	r := &q.sq
	if r.mem == nil {
		return errClosed
	}
	for i := range wrs {
		if err := q.validSend(i, &wrs[i]); err != nil {
			return err
		}
	}
	prod := atomic.LoadUint32(r.prod)
	if uint32(len(wrs)) > r.free(prod) {
		return provider.ErrQueueFull
	}
	for i := range wrs {
		q.writeSend((*ioctl.RxeSendWqe)(r.slot(prod)), &wrs[i])
		prod = (prod + 1) & r.mask
	}
	atomic.StoreUint32(r.prod, prod) // release: the WQEs are complete
	return nil
}

func (q *qp) writeSend(w *ioctl.RxeSendWqe, wr *provider.SendWR) {
	// The work-request part is ours; status, state, PSNs and the rest
	// belong to the kernel and are left alone except state.
	w.Wr = ioctl.RxeSendWr{Wr_id: wr.ID, Opcode: uint32(wr.Opcode), Send_flags: uint32(wr.Flags)}
	u := unsafe.Pointer(&w.Wr.Wr[0])
	switch wr.Opcode {
	case gwr.OpLocalInv, gwr.OpSendWithInv:
		// ex.invalidate_rkey shares the union with imm_data but is in
		// host order.
		binary.NativeEndian.PutUint32(w.Wr.Ex[:], wr.InvRKey)
	default:
		binary.BigEndian.PutUint32(w.Wr.Ex[:], wr.Imm)
	}
	switch wr.Opcode {
	case gwr.OpBindMW:
		b := &wr.Bind
		*(*ioctl.RxeWrMW)(u) = ioctl.RxeWrMW{Addr: b.Addr, Length: b.Length, Mr_lkey: b.LKey, Mw_rkey: b.MWRKey, Rkey: b.RKey, Access: b.Access}
	case gwr.OpRDMAWrite, gwr.OpRDMAWriteWithImm, gwr.OpRDMARead:
		*(*ioctl.RxeWrRDMA)(u) = ioctl.RxeWrRDMA{Addr: wr.RemoteAddr, Rkey: wr.RKey}
	case gwr.OpAtomicCmpAndSwp, gwr.OpAtomicFetchAndAdd:
		*(*ioctl.RxeWrAtomic)(u) = ioctl.RxeWrAtomic{Remote_addr: wr.RemoteAddr, Compare_add: wr.CompareAdd, Swap: wr.Swap, Rkey: wr.RKey}
	default:
		if q.typ == ioctl.IB_UVERBS_QPT_UD {
			ud := (*ioctl.RxeWrUD)(u)
			ud.Remote_qpn, ud.Remote_qkey = wr.RemoteQPN, wr.RemoteQKey
			ud.Ah_num = wr.AH.(*AH).resp.Num
		}
	}
	// The kernel takes the remote address from iova, not from the union.
	w.Iova = wr.RemoteAddr
	w.State = 0
	total, _ := sgeTotal(wr.SGEs)
	w.Dma = ioctl.RxeDMAInfo{Length: total, Resid: total, Num_sge: uint32(len(wr.SGEs))}
	data := unsafe.Add(unsafe.Pointer(w), ioctl.RxeSendWqeOffData)
	if wr.Flags&gwr.SendInline != 0 {
		off := uintptr(0)
		for _, s := range wr.SGEs {
			if s.Length > 0 {
				// SGE addresses of inline sends point at process memory
				// the caller owns (registered or not); reinterpret the
				// address as a pointer.
				addr := uintptr(s.Addr)
				src := unsafe.Slice(*(**byte)(unsafe.Pointer(&addr)), s.Length)
				copy(unsafe.Slice((*byte)(unsafe.Add(data, off)), s.Length), src)
				off += uintptr(s.Length)
			}
		}
		return
	}
	copySGEs(data, wr.SGEs)
}

// ring sends the doorbell: one POST_SEND with no work requests covers every
// WQE published so far. The write never blocks, so it is a raw system call:
// a normal one lets the scheduler hand this thread's P to another thread
// whenever the kernel's rxe work takes longer than the runtime's syscall
// threshold, which under emulation is nearly every doorbell and cost a
// 1.7-4.5x slower ping-pong than rdma-core.
func (q *qp) ring() error {
	db := q.db
	// RawSyscallNoError is x/sys's bare SYSCALL stub: unix.RawSyscall goes
	// through three wrappers to the runtime's (about 40 instructions a
	// doorbell, scripts/bench-instr's rp variant); the kernel's -errno
	// comes back in r1 instead.
	r, _ := unix.RawSyscallNoError(unix.SYS_WRITE, uintptr(q.fd), uintptr(unsafe.Pointer(db)), ioctl.SizeofCmdHdr+ioctl.SizeofPostSend)
	runtime.KeepAlive(db)
	if e := syscallErrno(r); e != 0 {
		return &ioctl.Error{Op: "rxe: doorbell (POST_SEND)", Errno: e}
	}
	return nil
}

// syscallErrno is the error number in a raw system call's return value r
// (Linux returns -errno, from -4095 to -1), or 0.
func syscallErrno(r uintptr) unix.Errno {
	if v := int(r); v < 0 && v > -4096 {
		return unix.Errno(-v)
	}
	return 0
}

// AH is an rxe address handle: the kernel keeps the address vector and
// hands out a number that UD send WQEs carry.
type AH struct {
	resp ioctl.RxeCreateAHResp
	// AHState is marked by uverbs.AH.Close; a UD send through a closed
	// AH is refused before it is posted (provider.ClosableAH).
	provider.AHState
}

// Udata implements provider.AH.
func (a *AH) Udata() (in, out []byte) {
	return nil, unsafe.Slice((*byte)(unsafe.Pointer(&a.resp)), ioctl.SizeofRxeCreateAHResp)
}

// Attach implements provider.AH.
func (a *AH) Attach(handle uint32) error {
	if a.resp.Num == 0 {
		return errors.New("rxe: CREATE_AH returned no ah_num (kernel older than 5.10?)")
	}
	return nil
}

// Num is the ah_num UD sends carry.
func (a *AH) Num() uint32 { return a.resp.Num }

// srq is a shared receive queue: a ring of receive WQEs like a QP's.
type srq struct {
	resp   ioctl.RxeCreateSRQResp
	modify ioctl.RxeModifySRQCmd
	dev    provider.Device
	maxSGE uint32
	r      ring
}

func (s *srq) Udata() (in, out []byte) {
	return nil, unsafe.Slice((*byte)(unsafe.Pointer(&s.resp)), ioctl.SizeofRxeCreateSRQResp)
}

func (s *srq) ModifyUdata() []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&s.modify)), ioctl.SizeofRxeModifySRQCmd)
}

func (s *srq) Attach(dev provider.Device, handle, maxWR, maxSGE uint32) error {
	mem, err := dev.Mmap(int64(s.resp.Mi.Offset), int(s.resp.Mi.Size))
	if err != nil {
		return fmt.Errorf("rxe: map shared receive queue: %w", err)
	}
	r, err := newRing(mem)
	if err != nil {
		dev.Munmap(mem)
		return err
	}
	s.dev, s.r, s.maxSGE = dev, r, maxSGE
	return nil
}

func (s *srq) PostRecv(wrs []provider.RecvWR) error { return postRecv(&s.r, s.maxSGE, wrs) }

func (s *srq) Close() error {
	if s.r.mem == nil {
		return nil
	}
	err := s.dev.Munmap(s.r.mem)
	s.r = ring{}
	return err
}
