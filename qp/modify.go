package qp

import (
	"errors"
	"fmt"
	"net"
	"unsafe"

	"github.com/goverbs/goverbs/internal/uvobj"
	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/uverbs/provider"
)

// AttrMask selects the fields of Attr a Modify sets (IB_QP_*; the values are
// the InfiniBand verbs' and rdma-core's IBV_QP_*).
type AttrMask uint32

// Attribute mask bits.
const (
	MaskState           AttrMask = 1 << 0
	MaskCurState        AttrMask = 1 << 1
	MaskAccessFlags     AttrMask = 1 << 3
	MaskPKeyIndex       AttrMask = 1 << 4
	MaskPort            AttrMask = 1 << 5
	MaskQKey            AttrMask = 1 << 6
	MaskAV              AttrMask = 1 << 7
	MaskPathMTU         AttrMask = 1 << 8
	MaskTimeout         AttrMask = 1 << 9
	MaskRetryCnt        AttrMask = 1 << 10
	MaskRNRRetry        AttrMask = 1 << 11
	MaskRQPSN           AttrMask = 1 << 12
	MaskMaxQPRdAtomic   AttrMask = 1 << 13
	MaskMinRNRTimer     AttrMask = 1 << 15
	MaskSQPSN           AttrMask = 1 << 16
	MaskMaxDestRdAtomic AttrMask = 1 << 17
	MaskDestQPN         AttrMask = 1 << 20
)

// AV is an address vector: where a connected QP sends. RoCE needs a GID.
type AV struct {
	DGID         net.IP // 16-byte destination GID
	SGIDIndex    uint8
	HopLimit     uint8
	TrafficClass uint8
	FlowLabel    uint32
	DLID         uint16
	SL           uint8
	Port         uint8
	IsGlobal     bool
}

// Attr holds QP attributes for Modify and Query.
type Attr struct {
	State           State
	CurState        State
	Access          mr.Access
	PKeyIndex       uint16
	Port            uint8
	QKey            uint32
	AV              AV
	PathMTU         uverbs.MTU
	Timeout         uint8
	RetryCnt        uint8
	RNRRetry        uint8
	RQPSN           uint32
	SQPSN           uint32
	MaxRdAtomic     uint8
	MaxDestRdAtomic uint8
	MinRNRTimer     uint8
	DestQPN         uint32
	// Filled by Query only.
	Caps interface{}
}

// Modify changes the QP's attributes selected by mask; with MaskState it
// moves the QP to attr.State. Port, MTU and GID index are checked against
// the device before the kernel sees them.
func (q *QP) Modify(attr *Attr, mask AttrMask) error {
	if q.bad() {
		return errNilQP
	}
	if attr == nil {
		return fmt.Errorf("qp: QP %d: modify: nil Attr", q.qpn)
	}
	q.once.Lock()
	defer q.once.Unlock()
	if q.once.IsClosed() {
		return ErrClosed
	}
	if err := q.check(attr, mask); err != nil {
		return err
	}
	// A UD QP's sends are checked against the path MTU (checkUD): the
	// active MTU of its port, read before it reaches RTS however it
	// gets there (ToRTS, or Init and Modify).
	var udMTU uint32
	if q.cfg.Type == UD && mask&MaskState != 0 && attr.State == RTS {
		port := q.port
		if mask&MaskPort != 0 {
			port = attr.Port
		}
		pa, err := q.ctx.QueryPort(int(port))
		if err != nil {
			return fmt.Errorf("qp: QP %d: modify to %v: %w", q.qpn, attr.State, err)
		}
		udMTU = uint32(pa.ActiveMTU.Bytes())
	}
	to := provider.QPState(attr.State)
	hooks, _ := q.drv.(provider.QPModifier)
	if hooks != nil {
		if err := hooks.BeforeModify(uint32(mask), to); err != nil {
			return fmt.Errorf("qp: QP %d: modify: provider: %w", q.qpn, err)
		}
	}
	c := ioctl.ModifyQP{
		Qp_handle: q.handle, Attr_mask: uint32(mask), Qkey: attr.QKey, Rq_psn: attr.RQPSN, Sq_psn: attr.SQPSN,
		Dest_qp_num: attr.DestQPN, Qp_access_flags: uint32(attr.Access), Pkey_index: attr.PKeyIndex,
		Qp_state: uint8(attr.State), Cur_qp_state: uint8(attr.CurState), Path_mtu: uint8(attr.PathMTU),
		Max_rd_atomic: attr.MaxRdAtomic, Max_dest_rd_atomic: attr.MaxDestRdAtomic, Min_rnr_timer: attr.MinRNRTimer,
		Port_num: attr.Port, Timeout: attr.Timeout, Retry_cnt: attr.RetryCnt, Rnr_retry: attr.RNRRetry,
	}
	if mask&MaskAV != 0 {
		av := &attr.AV
		copy(c.Dest.Dgid[:], av.DGID.To16())
		c.Dest.Flow_label = av.FlowLabel
		c.Dest.Dlid = av.DLID
		c.Dest.Sgid_index = av.SGIDIndex
		c.Dest.Hop_limit = av.HopLimit
		c.Dest.Traffic_class = av.TrafficClass
		c.Dest.Sl = av.SL
		c.Dest.Port_num = av.Port
		if av.IsGlobal {
			c.Dest.Is_global = 1
		}
	}
	err := uvobj.Of(q.ctx).File.Write(&ioctl.Cmd{
		Command: ioctl.IB_USER_VERBS_CMD_MODIFY_QP, In: unsafe.Pointer(&c), InLen: ioctl.SizeofModifyQP,
	}, "MODIFY_QP")
	if err != nil {
		if mask&MaskState != 0 {
			return fmt.Errorf("qp: QP %d: modify to %v: %w", q.qpn, attr.State, err)
		}
		return fmt.Errorf("qp: QP %d: modify: %w", q.qpn, err)
	}
	if mask&MaskPort != 0 {
		q.port = attr.Port
	}
	if mask&MaskMaxQPRdAtomic != 0 && q.cfg.Type == RC {
		q.noReads.Store(attr.MaxRdAtomic == 0) // before the state, as udMTU
	}
	if mask&MaskState != 0 {
		if udMTU != 0 {
			q.udMTU.Store(udMTU) // before the state: a sender that sees RTS sees it
		}
		q.state.Store(uint32(attr.State))
		if attr.State == Reset {
			q.cleanCQs()
		}
	}
	if hooks != nil {
		if err := hooks.AfterModify(uint32(mask), to); err != nil {
			return fmt.Errorf("qp: QP %d: modify: provider: %w", q.qpn, err)
		}
	}
	return nil
}

// cleanCQs lets a provider whose CQ rings outlive a QP's completions
// (provider.CQCleaner, rdma-core's __mlx5_cq_clean) drop this QP's, once
// it went to RESET or was destroyed. rxe's CQs do not need it.
func (q *QP) cleanCQs() {
	var srq provider.SRQ
	if q.cfg.SRQ != nil {
		srq = q.cfg.SRQ.drv
	}
	send, recv := q.cfg.SendCQ, q.cfg.RecvCQ
	if send == nil || recv == nil {
		return
	}
	if cl, ok := (*uvobj.CQOf(recv)).(provider.CQCleaner); ok {
		cl.Clean(q.qpn, srq)
	}
	if send != recv {
		if cl, ok := (*uvobj.CQOf(send)).(provider.CQCleaner); ok {
			cl.Clean(q.qpn, nil)
		}
	}
}

// maxQPN is the largest QP number: the wire carries 24 bits (BTH).
const maxQPN = 1<<24 - 1

// checkRanges refuses attributes wider than their field on the wire or
// in the spec, which rxe stores as given: a destination QPN over 24 bits
// addresses the QP of its low 24 (bth_init masks it), a retry count over
// 7 retries that many times and an RNR retry over 7 is not "infinite"
// (only 7 is), an RNR timer over 31 goes out masked to 5 bits (32 is 0,
// the longest); a timeout over 31 is EINVAL. Only the fields in mask.
func checkRanges(attr *Attr, mask AttrMask) error {
	switch {
	case mask&MaskDestQPN != 0 && attr.DestQPN > maxQPN:
		return fmt.Errorf("destination QPN %#x is over 24 bits", attr.DestQPN)
	case mask&MaskTimeout != 0 && attr.Timeout > 31:
		return fmt.Errorf("timeout %d out of range 0..31", attr.Timeout)
	case mask&MaskRetryCnt != 0 && attr.RetryCnt > 7:
		return fmt.Errorf("retry count %d out of range 0..7", attr.RetryCnt)
	case mask&MaskRNRRetry != 0 && attr.RNRRetry > 7:
		return fmt.Errorf("RNR retry %d out of range 0..7 (7: infinite)", attr.RNRRetry)
	case mask&MaskMinRNRTimer != 0 && attr.MinRNRTimer > 31:
		return fmt.Errorf("minimum RNR timer %d out of range 0..31", attr.MinRNRTimer)
	}
	return nil
}

// check validates what the kernel would only answer with EINVAL, or take
// and misapply (checkRanges).
func (q *QP) check(attr *Attr, mask AttrMask) error {
	if mask&MaskState != 0 && attr.State > Err {
		return fmt.Errorf("qp: QP %d: modify: unknown state %d", q.qpn, attr.State)
	}
	if err := checkRanges(attr, mask); err != nil {
		return fmt.Errorf("qp: QP %d: modify: %w", q.qpn, err)
	}
	port := int(q.port)
	if mask&MaskPort != 0 {
		port = int(attr.Port)
	}
	if mask&MaskAV != 0 && attr.AV.Port != 0 {
		port = int(attr.AV.Port)
	}
	if mask&(MaskPort|MaskAV|MaskPathMTU) == 0 {
		return nil
	}
	if port < 1 || port > int(q.ctx.Attr().PhysPortCnt) {
		return fmt.Errorf("qp: QP %d: port %d out of range: %s has ports 1..%d", q.qpn, port, q.ctx.Name(), q.ctx.Attr().PhysPortCnt)
	}
	if mask&(MaskPathMTU|MaskAV) == 0 {
		return nil
	}
	pa, err := q.ctx.QueryPort(port)
	if err != nil {
		return err
	}
	if mask&MaskPathMTU != 0 {
		if attr.PathMTU.Bytes() == 0 {
			return fmt.Errorf("qp: QP %d: modify to %v: invalid path MTU %v", q.qpn, attr.State, attr.PathMTU)
		}
		if attr.PathMTU > pa.ActiveMTU {
			return fmt.Errorf("qp: QP %d: modify to %v: path MTU %v > port %d active MTU %v", q.qpn, attr.State, attr.PathMTU, port, pa.ActiveMTU)
		}
	}
	if mask&MaskAV != 0 && attr.AV.IsGlobal {
		if uint32(attr.AV.SGIDIndex) >= pa.GIDTableLen {
			return fmt.Errorf("qp: QP %d: modify to %v: GID index %d out of range 0..%d", q.qpn, attr.State, attr.AV.SGIDIndex, pa.GIDTableLen-1)
		}
		if _, err := q.ctx.GID(port, int(attr.AV.SGIDIndex)); err != nil {
			return err
		}
		if len(attr.AV.DGID) != net.IPv6len && attr.AV.DGID.To16() == nil {
			return fmt.Errorf("qp: QP %d: modify to %v: destination GID %v is not 16 bytes", q.qpn, attr.State, attr.AV.DGID)
		}
	}
	return nil
}

// Query asks the kernel for the QP's current attributes and state.
func (q *QP) Query() (Attr, error) {
	if q.bad() {
		return Attr{}, errNilQP
	}
	q.once.Lock()
	defer q.once.Unlock()
	if q.once.IsClosed() {
		return Attr{}, ErrClosed
	}
	var r ioctl.QueryQPResp
	req := ioctl.QueryQP{Qp_handle: q.handle, Attr_mask: 0xffffffff}
	err := uvobj.Of(q.ctx).File.Write(&ioctl.Cmd{
		Command: ioctl.IB_USER_VERBS_CMD_QUERY_QP, In: unsafe.Pointer(&req), InLen: ioctl.SizeofQueryQP,
		Out: unsafe.Pointer(&r), OutLen: ioctl.SizeofQueryQPResp,
	}, "QUERY_QP")
	if err != nil {
		return Attr{}, fmt.Errorf("qp: QP %d: query: %w", q.qpn, err)
	}
	a := Attr{
		State: State(r.Qp_state), CurState: State(r.Cur_qp_state), Access: mr.Access(r.Qp_access_flags),
		PKeyIndex: r.Pkey_index, Port: r.Port_num, QKey: r.Qkey, PathMTU: uverbs.MTU(r.Path_mtu),
		Timeout: r.Timeout, RetryCnt: r.Retry_cnt, RNRRetry: r.Rnr_retry, RQPSN: r.Rq_psn, SQPSN: r.Sq_psn,
		MaxRdAtomic: r.Max_rd_atomic, MaxDestRdAtomic: r.Max_dest_rd_atomic, MinRNRTimer: r.Min_rnr_timer,
		DestQPN: r.Dest_qp_num,
		AV: AV{DGID: net.IP(append([]byte(nil), r.Dest.Dgid[:]...)), SGIDIndex: r.Dest.Sgid_index,
			HopLimit: r.Dest.Hop_limit, TrafficClass: r.Dest.Traffic_class, FlowLabel: r.Dest.Flow_label,
			DLID: r.Dest.Dlid, SL: r.Dest.Sl, Port: r.Dest.Port_num, IsGlobal: r.Dest.Is_global != 0},
	}
	return a, nil
}

// Remote is what a peer tells about its QP so that ours can connect to it.
type Remote struct {
	QPN uint32
	PSN uint32 // the peer's send PSN: our receive PSN
	GID net.IP // the peer's GID (RoCE); nil on InfiniBand with LID
	LID uint16
}

// ConnectOptions tune Connect. The zero value works on RoCE: port 1, the
// default GID (RoCE v2, IPv4), the port's active MTU, rdma-core's
// pingpong timeouts.
type ConnectOptions struct {
	Port     uint8      // default 1
	GIDIndex int        // -1 or unset (0 with UseGIDIndex false): DefaultGID
	UseGID   bool       // use GIDIndex as given
	MTU      uverbs.MTU // default: port active MTU
	PSN      uint32     // our send PSN
	Access   mr.Access  // remote access the peer may use on this QP
	SL       uint8
	// Timeouts and retries; zero means the default shown. Timeout and
	// MinRNRTimer take 0..31, RetryCnt and RNRRetry 0..7 (RC only).
	Timeout     uint8 // 14 (4.096 us * 2^14 = 67 ms)
	RetryCnt    uint8 // 7
	RNRRetry    uint8 // 7 (infinite)
	MinRNRTimer uint8 // 12 (0.64 ms)
	MaxRdAtomic uint8 // 1; outstanding RDMA reads/atomics we issue
	MaxDestRd   uint8 // 1; the peer's we serve
}

// Connect moves an RC or UC QP from RESET through INIT and RTR to RTS,
// connected to remote. A QP already in INIT keeps its posted receives (and
// the port and access it was given by Init); one in any other state is
// reset first, which drops its outstanding work requests.
func (q *QP) Connect(remote Remote, o ConnectOptions) error {
	if q.bad() {
		return errNilQP
	}
	if q.cfg.Type == UD {
		return errors.New("qp: Connect is for RC and UC QPs; a UD QP needs ToRTS with a QKey")
	}
	// Before any state change: a bad GID must not reset a live QP.
	if remote.GID != nil && remote.GID.To16() == nil {
		return fmt.Errorf("qp: QP %d: connect: remote GID of %d bytes (% x) is not a 16-byte GID or an IPv4 address", q.qpn, len(remote.GID), []byte(remote.GID))
	}
	if o.Port == 0 {
		o.Port = 1
	}
	if int(o.Port) > int(q.ctx.Attr().PhysPortCnt) {
		return fmt.Errorf("qp: QP %d: connect: port %d out of range: %s has ports 1..%d", q.qpn, o.Port, q.ctx.Name(), q.ctx.Attr().PhysPortCnt)
	}
	def := func(v *uint8, d uint8) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Timeout, 14)
	def(&o.RetryCnt, 7)
	def(&o.RNRRetry, 7)
	def(&o.MinRNRTimer, 12)
	def(&o.MaxRdAtomic, 1)
	def(&o.MaxDestRd, 1)
	pa, err := q.ctx.QueryPort(int(o.Port))
	if err != nil {
		return err
	}
	if o.MTU == 0 {
		o.MTU = pa.ActiveMTU
	}
	// Before any state change, as the GID above: what the RTR and RTS
	// steps would refuse only once the QP was reset.
	ranges := MaskDestQPN
	if q.cfg.Type == RC {
		ranges |= MaskTimeout | MaskRetryCnt | MaskRNRRetry | MaskMinRNRTimer
	}
	if err := checkRanges(&Attr{DestQPN: remote.QPN, Timeout: o.Timeout, RetryCnt: o.RetryCnt, RNRRetry: o.RNRRetry,
		MinRNRTimer: o.MinRNRTimer}, ranges); err != nil {
		return fmt.Errorf("qp: QP %d: connect: %w", q.qpn, err)
	}
	av := AV{Port: o.Port, SL: o.SL, DLID: remote.LID, HopLimit: 1}
	if remote.GID != nil && !remote.GID.Equal(net.IPv6zero) {
		var g uverbs.GID
		if o.UseGID {
			g, err = q.ctx.GID(int(o.Port), o.GIDIndex)
		} else {
			g, err = q.ctx.DefaultGID(int(o.Port))
		}
		if err != nil {
			return err
		}
		// The address vector's sgid_index is 8 bits; rxe's GID table
		// has 1024 entries: uint8 would name another GID.
		if g.Index > 255 {
			return fmt.Errorf("qp: QP %d: connect: GID index %d does not fit an address vector's 8 bits", q.qpn, g.Index)
		}
		av.IsGlobal, av.DGID, av.SGIDIndex = true, remote.GID.To16(), uint8(g.Index)
	}
	if err := q.toInit(&Attr{Port: o.Port, Access: o.Access}, MaskPKeyIndex|MaskPort|MaskAccessFlags); err != nil {
		return err
	}
	mask := MaskState | MaskAV | MaskPathMTU | MaskDestQPN | MaskRQPSN
	if q.cfg.Type == RC {
		mask |= MaskMaxDestRdAtomic | MaskMinRNRTimer
	}
	if err := q.Modify(&Attr{State: RTR, AV: av, PathMTU: o.MTU, DestQPN: remote.QPN, RQPSN: remote.PSN & 0xffffff,
		MaxDestRdAtomic: o.MaxDestRd, MinRNRTimer: o.MinRNRTimer}, mask); err != nil {
		return err
	}
	mask = MaskState | MaskSQPSN
	if q.cfg.Type == RC {
		mask |= MaskTimeout | MaskRetryCnt | MaskRNRRetry | MaskMaxQPRdAtomic
	}
	return q.Modify(&Attr{State: RTS, SQPSN: o.PSN & 0xffffff, Timeout: o.Timeout, RetryCnt: o.RetryCnt,
		RNRRetry: o.RNRRetry, MaxRdAtomic: o.MaxRdAtomic}, mask)
}

// Init moves a RESET QP to INIT on port with the given remote access; a
// receive may be posted from then on.
func (q *QP) Init(port uint8, access mr.Access) error {
	if q.bad() {
		return errNilQP
	}
	if port == 0 {
		port = 1
	}
	return q.Modify(&Attr{State: Init, Port: port, Access: access}, MaskState|MaskPKeyIndex|MaskPort|MaskAccessFlags)
}

// ToError moves the QP to ERR: outstanding work requests complete with
// flush errors.
func (q *QP) ToError() error { return q.Modify(&Attr{State: Err}, MaskState) }

// toInit brings q to INIT with attr (mask: what of it to set besides the
// state): from RESET at once, from another state through RESET. A QP
// already in INIT stays as it is, and so do receives posted to it there
// (rdma-core's ping-pongs post them in INIT).
func (q *QP) toInit(attr *Attr, mask AttrMask) error {
	switch q.State() {
	case Init:
		return nil
	case Reset:
	default:
		if err := q.Modify(&Attr{State: Reset}, MaskState); err != nil {
			return err
		}
	}
	attr.State = Init
	return q.Modify(attr, MaskState|mask)
}
