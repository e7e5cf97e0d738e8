package qp

import (
	"fmt"
	"net"
	"unsafe"

	"github.com/goverbs/goverbs/internal/uvobj"
	"github.com/goverbs/goverbs/ioctl"
)

// AttachMcast attaches a UD QP to the multicast group gid (mlid is the
// group's LID on InfiniBand, 0 on RoCE): datagrams sent to the group (QPN
// 0xFFFFFF) are then delivered to this QP too. It is the ATTACH_MCAST
// command (ibv_attach_mcast); rdma_cm's join does it for the ID's QP.
func (q *QP) AttachMcast(gid net.IP, mlid uint16) error {
	if q.bad() {
		return errNilQP
	}
	return q.mcast(ioctl.IB_USER_VERBS_CMD_ATTACH_MCAST, "ATTACH_MCAST", "attach to", gid, mlid)
}

// DetachMcast undoes AttachMcast (DETACH_MCAST). The kernel refuses to
// destroy a QP that is still attached to a group (Close fails with EBUSY):
// detach it first (cm's LeaveMulticast and ID.Close do).
func (q *QP) DetachMcast(gid net.IP, mlid uint16) error {
	if q.bad() {
		return errNilQP
	}
	return q.mcast(ioctl.IB_USER_VERBS_CMD_DETACH_MCAST, "DETACH_MCAST", "detach from", gid, mlid)
}

func (q *QP) mcast(cmd uint32, op, verb string, gid net.IP, mlid uint16) error {
	g := gid.To16()
	if g == nil {
		return fmt.Errorf("qp: QP %d: %s multicast group %v: not a GID", q.qpn, verb, gid)
	}
	if q.cfg.Type != UD {
		return fmt.Errorf("qp: QP %d: %s multicast group %v: a %v QP cannot join (UD only)", q.qpn, verb, gid, q.cfg.Type)
	}
	// Under Close's lock: the handle of a QP closed meanwhile may be a
	// new QP's already, which would join (or leave) the group instead.
	q.once.Lock()
	defer q.once.Unlock()
	if q.once.IsClosed() {
		return fmt.Errorf("qp: QP %d: %s multicast group %v: QP closed: %w", q.qpn, verb, gid, ErrClosed)
	}
	// ib_uverbs_attach_mcast and ib_uverbs_detach_mcast share a layout.
	c := ioctl.AttachMcast{Handle: q.handle, Mlid: mlid}
	copy(c.Gid[:], g)
	if err := uvobj.Of(q.ctx).File.Write(&ioctl.Cmd{Command: cmd, In: unsafe.Pointer(&c), InLen: ioctl.SizeofAttachMcast}, op); err != nil {
		return fmt.Errorf("qp: QP %d: %s multicast group %v: %w", q.qpn, verb, gid, err)
	}
	return nil
}
