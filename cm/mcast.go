package cm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/uverbs"
)

// MulticastQPN is the destination QPN of datagrams sent to a multicast
// group (what the join event reports as the group's QPN).
const MulticastQPN = 0xFFFFFF

// ErrNotJoined: LeaveMulticast of an address the ID did not join.
var ErrNotJoined = errors.New("cm: not a member of that multicast group")

// ErrMulticast matches an *EventError of a MULTICAST_ERROR event.
var ErrMulticast = errors.New("cm: multicast join failed")

// JoinOptions modify a multicast join.
type JoinOptions struct {
	// SendOnly joins as a send-only full member: the ID may send to the
	// group but its QP is not attached and receives nothing from it (on
	// RoCE no IGMP membership is made either).
	SendOnly bool
}

// Multicast is a group an ID joined (JoinMulticast). Send to it with an
// address handle made from AH, QPN MulticastQPN and QKey.
type Multicast struct {
	Addr     netip.Addr
	SendOnly bool
	// From the MULTICAST_JOIN event (its UD parameters).
	AH   uverbs.AHAttr // DGID is the group's GID (::ffff:a.b.c.d for IPv4 on RoCE)
	QPN  uint32        // MulticastQPN
	QKey uint32        // the port space's Q_Key (0x01234567 on UDP)
	MLID uint16        // the group's LID (InfiniBand; 0 on RoCE)

	id       *ID
	uid      uint64
	handle   uint32 // the kernel's multicast handle (JOIN_MCAST's response)
	joined   bool   // the join event arrived
	attached bool   // the ID's QP is attached to the group
	left     bool
}

// MGID is the group's GID, the address the QP is attached to.
func (m *Multicast) MGID() net.IP {
	if m == nil {
		return nil
	}
	return m.AH.DGID
}

func (m *Multicast) String() string {
	if m == nil {
		return "<nil>"
	}
	return fmt.Sprintf("multicast group %v", m.Addr)
}

// JoinMulticast joins the multicast group addr (an IPv4 or IPv6 multicast
// address) on a UDP ID that is bound to a device address (Bind) or has a
// resolved address (ResolveAddr), and waits for the join (MULTICAST_JOIN).
// If the ID has a QP (CreateQP) and the join is not send-only, the QP is
// attached to the group (ATTACH_MCAST), as librdmacm does; a QP created
// later is attached by CreateQP. The group is left by LeaveMulticast or by
// Close. A MULTICAST_ERROR event is an *EventError matching ErrMulticast.
// One that comes after the join (the group is no longer accessible; as
// librdmacm, nothing is marked) is returned by Wait, with Event.Multicast
// the group, which stays joined until LeaveMulticast: leave it (the
// kernel keeps it until then), and join again if desired.
func (id *ID) JoinMulticast(ctx context.Context, addr netip.Addr, o JoinOptions) (*Multicast, error) {
	if id.bad() {
		return nil, errNilID
	}
	op := fmt.Sprintf("join multicast %v", addr)
	if ctx == nil {
		return nil, fmt.Errorf("cm: %s: nil context", op)
	}
	if err := id.check(op); err != nil {
		return nil, err
	}
	if id.ps != UDP {
		return nil, fmt.Errorf("cm: %s: the ID is in the %v port space; multicast needs a UDP ID", op, id.ps)
	}
	if !addr.IsValid() || !addr.Unmap().IsMulticast() {
		return nil, fmt.Errorf("cm: %s: not a multicast address (IPv4 224.0.0.0/4 or IPv6 ff00::/8)", op)
	}
	addr = addr.Unmap()
	c := ioctl.UcmJoinMcast{Id: id.handle}
	n, err := putSockaddr(&c.Addr, netip.AddrPortFrom(addr, 0))
	if err != nil {
		return nil, fmt.Errorf("cm: %s: %w", op, err)
	}
	c.Addr_size = n
	if o.SendOnly {
		c.Join_flags = ioctl.RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER
	} else {
		c.Join_flags = ioctl.RDMA_MC_JOIN_FLAG_FULLMEMBER
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cm: %s: %w", op, err)
	}
	m := &Multicast{Addr: addr, SendOnly: o.SendOnly, id: id}
	// The command and the group's entry on the ID are one step for
	// Close (opMu): a join either is made and entered before Close takes
	// the ID's groups (and Close leaves it), or finds the ID closed and
	// writes nothing.
	id.opMu.Lock()
	// Register the group before the command: its events carry its uid.
	id.ch.mu.Lock()
	id.mu.Lock()
	if id.closed {
		id.mu.Unlock()
		id.ch.mu.Unlock()
		id.opMu.Unlock()
		return nil, fmt.Errorf("cm: %s: %w", op, ErrClosed)
	}
	for _, o := range id.mcs {
		if o.Addr == addr {
			id.mu.Unlock()
			id.ch.mu.Unlock()
			id.opMu.Unlock()
			return nil, fmt.Errorf("cm: %s: the ID is a member already", op)
		}
	}
	id.ch.nextUID++
	m.uid = id.ch.nextUID
	id.ch.mcs[m.uid] = m
	id.mu.Unlock()
	id.ch.mu.Unlock()
	c.Uid = m.uid
	var r ioctl.UcmCreateIDResp
	if err := id.ch.command(ioctl.RDMA_USER_CM_CMD_JOIN_MCAST, unsafe.Pointer(&c), ioctl.SizeofUcmJoinMcast,
		int(unsafe.Offsetof(c.Response)), unsafe.Pointer(&r), ioctl.SizeofUcmCreateIDResp, "JOIN_MCAST"); err != nil {
		id.ch.mu.Lock()
		delete(id.ch.mcs, m.uid)
		id.ch.mu.Unlock()
		id.opMu.Unlock()
		return nil, fmt.Errorf("cm: %s: %w", op, err)
	}
	id.mu.Lock()
	m.handle = r.Id
	id.mcs = append(id.mcs, m)
	id.mu.Unlock()
	id.opMu.Unlock()

	ev, err := id.waitMatch(ctx, m)
	if err == nil && ev.Type == MulticastError {
		err = &EventError{Op: op, Event: ev}
	}
	if err == nil {
		err = id.attach(m)
	}
	if err != nil {
		// A closed ID's Close left the group (or leaves it now); one left
		// by LeaveMulticast is gone already.
		if lerr := id.leave(m); lerr != nil && !errors.Is(lerr, ErrClosed) {
			err = errors.Join(err, lerr)
		}
		if ee := (*EventError)(nil); errors.As(err, &ee) {
			return nil, err // names the step already
		}
		return nil, fmt.Errorf("cm: %s: %w", op, err)
	}
	return m, nil
}

// errLeftWhileJoining ends a join whose group LeaveMulticast left while
// the join waited (the kernel drops the group's events with the leave).
var errLeftWhileJoining = fmt.Errorf("left (LeaveMulticast) before the join completed: %w", ErrNotJoined)

// attach records the join event's parameters (already in m) and attaches
// the ID's QP, if any and not send-only; ErrClosed if Close came first.
func (id *ID) attach(m *Multicast) error {
	return id.whileOpen(func() error {
		id.mu.Lock()
		left := m.left
		m.joined = !left
		id.mu.Unlock()
		if left {
			return errLeftWhileJoining
		}
		return id.attachLocked(m)
	})
}

// attachLocked attaches the ID's QP to a joined group m, unless there is
// no QP, m is send-only or attached already. opMu is held.
func (id *ID) attachLocked(m *Multicast) error {
	id.mu.Lock()
	q := id.qp
	do := q != nil && m.joined && !m.SendOnly && !m.attached && !m.left
	id.mu.Unlock()
	if !do {
		return nil
	}
	if err := q.AttachMcast(m.AH.DGID, m.MLID); err != nil {
		return fmt.Errorf("attach the QP: %w", err)
	}
	id.mu.Lock()
	m.attached = true
	id.mu.Unlock()
	return nil
}

// Multicasts returns the groups the ID joined (or is joining).
func (id *ID) Multicasts() []*Multicast {
	if id == nil {
		return nil
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	return append([]*Multicast(nil), id.mcs...)
}

// LeaveMulticast leaves the group addr: the QP is detached from it, then
// the kernel leaves it (LEAVE_MCAST). Events of the group not yet taken
// with Wait are dropped. A JoinMulticast of the group still waiting for
// its event returns an error matching ErrNotJoined. Racing Close, it
// either leaves before the ID is destroyed or returns an error matching
// ErrClosed (Close left the group).
func (id *ID) LeaveMulticast(addr netip.Addr) error {
	if id.bad() {
		return errNilID
	}
	op := fmt.Sprintf("leave multicast %v", addr)
	addr = addr.Unmap()
	id.opMu.Lock()
	defer id.opMu.Unlock()
	id.mu.Lock()
	closed := id.closed
	var m *Multicast
	for _, o := range id.mcs {
		if o.Addr == addr {
			m = o
		}
	}
	id.mu.Unlock()
	if closed {
		return fmt.Errorf("cm: %s: %w", op, ErrClosed)
	}
	if m == nil {
		return fmt.Errorf("cm: %s: %w", op, ErrNotJoined)
	}
	return id.leaveLocked(m)
}

// leave is leaveLocked for a caller without opMu: ErrClosed if the ID is
// closed (its Close leaves every group).
func (id *ID) leave(m *Multicast) error {
	return id.whileOpen(func() error { return id.leaveLocked(m) })
}

// leaveLocked detaches the QP and leaves the group, once; a join waiting
// for the group's event is woken (it ends with errLeftWhileJoining).
// opMu is held.
func (id *ID) leaveLocked(m *Multicast) error {
	id.mu.Lock()
	if m.left {
		id.mu.Unlock()
		return nil
	}
	m.left = true
	for i, o := range id.mcs {
		if o == m {
			id.mcs = append(id.mcs[:i:i], id.mcs[i+1:]...)
			break
		}
	}
	q, attached := id.qp, m.attached
	m.attached = false
	removed := id.removed
	// Drop the group's events nobody took.
	kept := id.queue[:0]
	for _, ev := range id.queue {
		if ev.Multicast != m {
			kept = append(kept, ev)
		}
	}
	clear(id.queue[len(kept):])
	id.queue = kept
	id.mu.Unlock()
	id.wake()
	var errs []error
	if attached && q != nil {
		if err := q.DetachMcast(m.AH.DGID, m.MLID); err != nil {
			errs = append(errs, fmt.Errorf("cm: leave multicast %v: %w", m.Addr, err))
		}
	}
	if removed {
		// After DEVICE_REMOVAL the kernel left the group with its cm_id
		// (LEAVE_MCAST would be ENXIO; DESTROY_ID frees the entry).
		id.ch.mu.Lock()
		delete(id.ch.mcs, m.uid)
		id.ch.mu.Unlock()
	} else if err := id.leaveCommand(m); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// leaveCommand is LEAVE_MCAST; the group's uid leaves the channel's table
// (after it the kernel reports no event of it). opMu is held (the group
// handle is freed with the ID's).
func (id *ID) leaveCommand(m *Multicast) error {
	c := ioctl.UcmDestroyID{Id: m.handle}
	var r ioctl.UcmDestroyIDResp
	err := id.ch.command(ioctl.RDMA_USER_CM_CMD_LEAVE_MCAST, unsafe.Pointer(&c), ioctl.SizeofUcmDestroyID,
		int(unsafe.Offsetof(c.Response)), unsafe.Pointer(&r), ioctl.SizeofUcmDestroyIDResp, "LEAVE_MCAST")
	id.ch.mu.Lock()
	delete(id.ch.mcs, m.uid)
	id.ch.mu.Unlock()
	if err != nil {
		return fmt.Errorf("cm: leave multicast %v: %w", m.Addr, err)
	}
	return nil
}

// attachJoined attaches a new QP to the groups joined before it existed.
func (id *ID) attachJoined() error {
	return id.whileOpen(func() error {
		for _, m := range id.Multicasts() {
			if err := id.attachLocked(m); err != nil {
				return fmt.Errorf("group %v: %w", m.Addr, err)
			}
		}
		return nil
	})
}

// waitMatch waits for m's event (MULTICAST_JOIN or MULTICAST_ERROR); the
// events it passes over go back to the front of the queue, in order, for
// Wait. A DEVICE_REMOVAL ends the wait with an *EventError, a
// LeaveMulticast of m with errLeftWhileJoining.
func (id *ID) waitMatch(ctx context.Context, m *Multicast) (ev Event, err error) {
	var held []Event
	defer func() { id.requeue(held) }()
	left := func() error {
		if m.left {
			return errLeftWhileJoining
		}
		return nil
	}
	for {
		ev, err := id.next(ctx, left)
		if err != nil {
			return Event{}, err
		}
		if ev.Multicast == m {
			return ev, nil
		}
		if ev.Type == DeviceRemoval {
			return ev, &EventError{Op: fmt.Sprintf("join multicast %v", m.Addr), Event: ev}
		}
		held = append(held, ev)
	}
}
