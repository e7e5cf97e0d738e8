package cm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
	"golang.org/x/sys/unix"
)

// PortSpace is the rdma_cm port space of an ID (enum rdma_ucm_port_space).
type PortSpace uint16

// Port spaces: TCP gives RC connections, UDP gives UD (IP-addressed); IB
// takes either, chosen when the ID is made (CreateIDType; CreateID(IB)
// makes an RC ID), as librdmacm's rdma_create_id2 does.
const (
	TCP PortSpace = ioctl.RDMA_PS_TCP
	UDP PortSpace = ioctl.RDMA_PS_UDP
	IB  PortSpace = ioctl.RDMA_PS_IB
)

func (p PortSpace) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case IB:
		return "IB"
	}
	return fmt.Sprintf("PortSpace(%#x)", uint16(p))
}

// Private data limits: the InfiniBand CM message's private data field, less
// the 36-byte rdma_cm header the kernel puts in front of a connect request
// on the IP port spaces (REQ 92, REP 196, REJ 148, SIDR REQ 216, SIDR REP 136).
const (
	MaxConnectData   = 92 - 36
	MaxAcceptData    = 196
	MaxRejectData    = 148
	MaxUDConnectData = 216 - 36
	MaxUDAcceptData  = 136
)

// DefaultResolveTimeout is used when the context given to a resolve step has
// no deadline (librdmacm's tools use 2000 ms).
const DefaultResolveTimeout = 2 * time.Second

// ID is an rdma_cm ID: one endpoint (a listener, or one side of a
// connection). Close destroys it (and its QP). Its methods may be called
// from several goroutines, but one waiting step at a time.
type ID struct {
	ch     *Channel
	uid    uint64
	handle uint32
	ps     PortSpace

	// opMu serializes the commands on the ID's handle, on its groups'
	// handles and the QP's group attachments with Close: a command runs
	// only if the ID is not closed, and Close's leaves, QP destroy and
	// DESTROY_ID wait for one in flight. The kernel gives a freed ID or
	// group number to the next one made (on this channel too), so a
	// command after DESTROY_ID could act on another ID or group.
	opMu sync.Mutex

	mu      sync.Mutex
	queue   []Event
	notify  chan struct{} // one token when queue grew
	done    chan struct{} // closed by Close
	closed  bool
	removed bool // a DEVICE_REMOVAL came: the kernel reports nothing more
	ud      bool // a UD ID (UDP, or IB made for qp.UD): SIDR, no connection
	qp      *qp.QP
	devAttr uverbs.DeviceAttr
	mcs     []*Multicast // joined or joining
}

// CreateID makes an ID in port space ps: an RC ID in TCP and IB, a UD ID
// in UDP.
func (ch *Channel) CreateID(ps PortSpace) (*ID, error) {
	if ch.bad() {
		return nil, errNilChannel
	}
	t := qp.RC
	if ps == UDP {
		t = qp.UD
	}
	return ch.CreateIDType(ps, t)
}

// CreateIDType makes an ID in port space ps for QPs of type t: TCP takes
// qp.RC, UDP qp.UD, IB either. The type decides how the ID connects (a
// connection, or a SIDR exchange for UD) and the QP CreateQP makes.
func (ch *Channel) CreateIDType(ps PortSpace, t qp.Type) (*ID, error) {
	if ch.bad() {
		return nil, errNilChannel
	}
	switch {
	case ps != TCP && ps != UDP && ps != IB:
		return nil, fmt.Errorf("cm: create ID: port space %v not supported (TCP, UDP or IB)", ps)
	case t != qp.RC && t != qp.UD, ps == TCP && t != qp.RC, ps == UDP && t != qp.UD:
		return nil, fmt.Errorf("cm: create ID: QP type %v not possible in the %v port space (TCP: RC, UDP: UD, IB: RC or UD)", t, ps)
	}
	// The uid is taken now, the ID enters the table once the kernel made
	// it: an ID in the table always has its handle (a Close of the
	// channel in between must not destroy handle 0, someone else's), and
	// no event of the uid can come before a command on the handle.
	ch.mu.Lock()
	if ch.closed {
		ch.mu.Unlock()
		return nil, ErrClosed
	}
	ch.nextUID++
	uid := ch.nextUID
	ch.mu.Unlock()
	c := ioctl.UcmCreateID{Uid: uid, Ps: uint16(ps), Type: uint8(t)}
	var r ioctl.UcmCreateIDResp
	if err := ch.command(ioctl.RDMA_USER_CM_CMD_CREATE_ID, unsafe.Pointer(&c), ioctl.SizeofUcmCreateID,
		int(unsafe.Offsetof(c.Response)), unsafe.Pointer(&r), ioctl.SizeofUcmCreateIDResp, "CREATE_ID"); err != nil {
		return nil, fmt.Errorf("cm: create ID: %w", err)
	}
	ch.mu.Lock()
	if ch.closed {
		// The channel's Close took its IDs while the kernel made this
		// one: destroy it (if the descriptor is closed already, its
		// release did).
		ch.mu.Unlock()
		ch.destroyHandle(r.Id)
		return nil, fmt.Errorf("cm: create ID: %w", ErrClosed)
	}
	id := ch.addIDLocked(uid, ps, t == qp.UD, r.Id)
	ch.mu.Unlock()
	return id, nil
}

// PortSpace returns the ID's port space.
func (id *ID) PortSpace() PortSpace {
	if id == nil {
		return 0
	}
	return id.ps
}

// QPType returns the type of the QPs the ID connects: qp.UD for a UDP ID
// and an IB ID made for UD, else qp.RC.
func (id *ID) QPType() qp.Type {
	if id == nil {
		return 0
	}
	if id.ud {
		return qp.UD
	}
	return qp.RC
}

// Handle is the kernel's number of the ID.
func (id *ID) Handle() uint32 {
	if id == nil {
		return 0
	}
	return id.handle
}

// QP returns the QP made by CreateQP, or nil.
func (id *ID) QP() *qp.QP {
	if id == nil {
		return nil
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.qp
}

func (id *ID) push(ev Event) {
	id.mu.Lock()
	if id.closed {
		id.mu.Unlock()
		if ev.ID != nil {
			ev.ID.Close()
		}
		return
	}
	if ev.Type == DeviceRemoval {
		id.removed = true
	}
	id.queue = append(id.queue, ev)
	id.mu.Unlock()
	id.wake()
}

func (id *ID) wake() {
	select {
	case id.notify <- struct{}{}:
	default:
	}
}

// Wait returns the ID's next event. A connect request's Event.ID belongs
// to the caller from then on. Events that a step's wait (ResolveAddr,
// ResolveRoute, GetRequest, Connect, Accept, JoinMulticast) passed over,
// not being its own, stay queued for Wait, in the order they came. After
// a DEVICE_REMOVAL was returned, the kernel reports nothing more for the
// ID: Wait then returns an error matching ErrDeviceRemoved at once.
func (id *ID) Wait(ctx context.Context) (Event, error) {
	if id.bad() {
		return Event{}, errNilID
	}
	if ctx == nil {
		return Event{}, errors.New("cm: wait: nil context")
	}
	return id.next(ctx, nil)
}

// errRemoved is the error of a wait after the ID's DEVICE_REMOVAL.
var errRemoved = fmt.Errorf("%w: the ID's DEVICE_REMOVAL was reported, no event comes after it (close the ID)", ErrDeviceRemoved)

// next is Wait; stop, if not nil, is called with id.mu held when no event
// is queued, and a non-nil error from it ends the wait (id.wake makes a
// waiter call it again).
func (id *ID) next(ctx context.Context, stop func() error) (Event, error) {
	for {
		id.mu.Lock()
		if id.closed {
			id.mu.Unlock()
			return Event{}, ErrClosed
		}
		if len(id.queue) > 0 {
			ev := id.queue[0]
			id.queue[0] = Event{}
			id.queue = id.queue[1:]
			id.mu.Unlock()
			return ev, nil
		}
		if stop != nil {
			if err := stop(); err != nil {
				id.mu.Unlock()
				return Event{}, err
			}
		}
		removed := id.removed
		id.mu.Unlock()
		if removed {
			return Event{}, errRemoved
		}
		id.ch.mu.Lock()
		rerr := id.ch.readErr
		id.ch.mu.Unlock()
		if rerr != nil {
			return Event{}, fmt.Errorf("cm: event channel: %w", rerr)
		}
		select {
		case <-id.notify:
		case <-id.done:
			return Event{}, ErrClosed
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// waitFor waits for want; an error event (ADDR_ERROR, ROUTE_ERROR,
// CONNECT_ERROR, UNREACHABLE, REJECTED, DISCONNECTED, DEVICE_REMOVAL)
// ends the step with an *EventError. The events it passes over (a group's
// MULTICAST_ERROR after its join, ADDR_CHANGE, TIMEWAIT_EXIT) go back to
// the front of the queue, in order, for Wait: they were dropped, and Wait
// never saw them.
func (id *ID) waitFor(ctx context.Context, op string, want ...EventType) (Event, error) {
	var held []Event
	defer func() { id.requeue(held) }()
	for {
		ev, err := id.Wait(ctx)
		if err != nil {
			return Event{}, fmt.Errorf("cm: %s: %w", op, err)
		}
		for _, w := range want {
			if ev.Type == w {
				return ev, nil
			}
		}
		switch ev.Type {
		case AddrError, RouteError, ConnectError, Unreachable, Rejected, Disconnected, DeviceRemoval:
			return ev, &EventError{Op: op, Event: ev}
		}
		held = append(held, ev) // not this step's
	}
}

// requeue puts the events a step passed over (held, in the order they
// came) back at the front of the queue, ahead of any that came since; on
// a closed ID it closes the IDs of connect requests among them (Close
// took only what was queued), as push does.
func (id *ID) requeue(held []Event) {
	if len(held) == 0 {
		return
	}
	id.mu.Lock()
	closed := id.closed
	if !closed {
		id.queue = append(held, id.queue...)
	}
	id.mu.Unlock()
	if closed {
		for _, ev := range held {
			if ev.ID != nil {
				ev.ID.Close()
			}
		}
	}
	id.wake()
}

func (id *ID) check(op string) error {
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.closed {
		return fmt.Errorf("cm: %s: %w", op, ErrClosed)
	}
	return nil
}

// command issues a command on the ID's handle (ch.command's arguments)
// unless the ID is closed (ErrClosed), serialized with Close (opMu).
func (id *ID) command(cmd uint32, in unsafe.Pointer, inLen int, respOff int, out unsafe.Pointer, outLen int, op string) error {
	return id.whileOpen(func() error { return id.ch.command(cmd, in, inLen, respOff, out, outLen, op) })
}

// whileOpen runs fn under opMu, so that Close waits for it, or returns
// ErrClosed without running it if the ID is closed.
func (id *ID) whileOpen(fn func() error) error {
	id.opMu.Lock()
	defer id.opMu.Unlock()
	id.mu.Lock()
	closed := id.closed
	id.mu.Unlock()
	if closed {
		return ErrClosed
	}
	return fn()
}

// Bind binds the ID to a local address (an unspecified address binds every
// device; port 0 picks one).
func (id *ID) Bind(addr netip.AddrPort) error {
	if id.bad() {
		return errNilID
	}
	if err := id.check("bind"); err != nil {
		return err
	}
	c := ioctl.UcmBind{Id: id.handle}
	n, err := putSockaddr(&c.Addr, addr)
	if err != nil {
		return fmt.Errorf("cm: bind %v: %w", addr, err)
	}
	c.Size = n
	if err := id.command(ioctl.RDMA_USER_CM_CMD_BIND, unsafe.Pointer(&c), ioctl.SizeofUcmBind, 0, nil, 0, "BIND"); err != nil {
		return fmt.Errorf("cm: bind %v: %w", addr, err)
	}
	return nil
}

func timeoutMS(ctx context.Context) uint32 {
	d := DefaultResolveTimeout
	if dl, ok := ctx.Deadline(); ok {
		d = time.Until(dl)
	}
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	if ms > 1<<31 {
		ms = 1 << 31
	}
	return uint32(ms)
}

// resolveAttempt bounds one RESOLVE_ADDR. The kernel checks the neighbour
// again when a neighbour update arrives or when the request's timeout
// expires; in the guest's veth setup the update did not always wake it (a
// first resolution took 20 s of a 30 s timeout, where rping's 2 s timeout
// succeeded at its expiry), so a long wait is made of short attempts.
const resolveAttempt = 500 * time.Millisecond

// ResolveAddr resolves dst (and binds to src unless src is the zero Addr)
// and waits for ADDR_RESOLVED. It gives up at the context's deadline
// (after DefaultResolveTimeout without one), with the kernel's last address
// error (ETIMEDOUT when no neighbour answered) or the context's error.
// src and dst must be of one address family (an IPv4-mapped IPv6 address
// is IPv6 here).
func (id *ID) ResolveAddr(ctx context.Context, src netip.Addr, dst netip.AddrPort) error {
	if id.bad() {
		return errNilID
	}
	if ctx == nil {
		return errors.New("cm: resolve address: nil context")
	}
	if err := id.check("resolve address"); err != nil {
		return err
	}
	c := ioctl.UcmResolveAddr{Id: id.handle}
	if src.IsValid() {
		n, err := putSockaddr(&c.Src_addr, netip.AddrPortFrom(src, 0))
		if err != nil {
			return fmt.Errorf("cm: resolve address: source %v: %w", src, err)
		}
		c.Src_size = n
	}
	n, err := putSockaddr(&c.Dst_addr, dst)
	if err != nil {
		return fmt.Errorf("cm: resolve address: destination %v: %w", dst, err)
	}
	c.Dst_size = n
	if dst.Port() == 0 && !dst.Addr().IsMulticast() {
		return fmt.Errorf("cm: resolve address: destination %v has port 0", dst)
	}
	if c.Src_size != 0 && c.Src_size != c.Dst_size {
		// rdma_resolve_addr refuses it with a bare EINVAL.
		return fmt.Errorf("cm: resolve address: source %v and destination %v are of different address families (an IPv4-mapped IPv6 address is IPv6 here)", src, dst)
	}
	if err := ctx.Err(); err != nil {
		// Nothing started: a resolution given up leaves no late event.
		return fmt.Errorf("cm: resolve address %v: %w", dst, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultResolveTimeout)
		defer cancel()
	}
	op := fmt.Sprintf("resolve address %v", dst)
	dl, _ := ctx.Deadline()
	for {
		// The last attempt ends a little before the deadline, so that the
		// kernel's answer (an address error), not the context, is reported.
		left := time.Until(dl) - 50*time.Millisecond
		c.Timeout_ms = uint32(max(min(left, resolveAttempt), time.Millisecond).Milliseconds())
		if err := id.command(ioctl.RDMA_USER_CM_CMD_RESOLVE_ADDR, unsafe.Pointer(&c), ioctl.SizeofUcmResolveAddr, 0, nil, 0, "RESOLVE_ADDR"); err != nil {
			return fmt.Errorf("cm: %s: %w", op, err)
		}
		ev, err := id.waitFor(ctx, op, AddrResolved)
		if err == nil {
			return nil
		}
		// Only a timed-out attempt is tried again, while the context lasts.
		if ev.Type != AddrError || ev.Status != -int32(unix.ETIMEDOUT) || ctx.Err() != nil {
			return err
		}
		if time.Until(dl) < 60*time.Millisecond {
			return err
		}
	}
}

// ResolveRoute resolves the route to the resolved address and waits for
// ROUTE_RESOLVED.
func (id *ID) ResolveRoute(ctx context.Context) error {
	if id.bad() {
		return errNilID
	}
	if ctx == nil {
		return errors.New("cm: resolve route: nil context")
	}
	if err := id.check("resolve route"); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("cm: resolve route: %w", err)
	}
	c := ioctl.UcmResolveRoute{Id: id.handle, Ms: timeoutMS(ctx)}
	if err := id.command(ioctl.RDMA_USER_CM_CMD_RESOLVE_ROUTE, unsafe.Pointer(&c), ioctl.SizeofUcmResolveRoute, 0, nil, 0, "RESOLVE_ROUTE"); err != nil {
		return fmt.Errorf("cm: resolve route: %w", err)
	}
	_, err := id.waitFor(ctx, "resolve route", RouteResolved)
	return err
}

// Listen makes a bound ID a listener with room for backlog pending requests.
func (id *ID) Listen(backlog int) error {
	if id.bad() {
		return errNilID
	}
	if err := id.check("listen"); err != nil {
		return err
	}
	if backlog <= 0 || backlog > 1<<16 {
		return fmt.Errorf("cm: listen: backlog %d out of range (1..65536)", backlog)
	}
	c := ioctl.UcmListen{Id: id.handle, Backlog: uint32(backlog)}
	if err := id.command(ioctl.RDMA_USER_CM_CMD_LISTEN, unsafe.Pointer(&c), ioctl.SizeofUcmListen, 0, nil, 0, "LISTEN"); err != nil {
		return fmt.Errorf("cm: listen: %w", err)
	}
	return nil
}

// GetRequest waits for the next connect request on a listener and returns
// it; the request's ID (ev.ID) is the caller's to accept or reject and to
// Close.
func (id *ID) GetRequest(ctx context.Context) (Event, error) {
	if id.bad() {
		return Event{}, errNilID
	}
	ev, err := id.waitFor(ctx, "get request", ConnectRequest)
	if err != nil {
		return ev, err
	}
	return ev, nil
}

// Query returns the ID's addresses, device and GIDs (QUERY_ROUTE).
func (id *ID) Query() (Route, error) {
	if id.bad() {
		return Route{}, errNilID
	}
	if err := id.check("query"); err != nil {
		return Route{}, err
	}
	c := ioctl.UcmQuery{Id: id.handle}
	r := new(ioctl.UcmQueryRouteResp)
	if err := id.command(ioctl.RDMA_USER_CM_CMD_QUERY_ROUTE, unsafe.Pointer(&c), ioctl.SizeofUcmQuery,
		int(unsafe.Offsetof(c.Response)), unsafe.Pointer(r), ioctl.SizeofUcmQueryRouteResp, "QUERY_ROUTE"); err != nil {
		return Route{}, fmt.Errorf("cm: query: %w", err)
	}
	src := (*[ioctl.SizeofSockaddrIn6]byte)(unsafe.Pointer(&r.Src_addr))
	dst := (*[ioctl.SizeofSockaddrIn6]byte)(unsafe.Pointer(&r.Dst_addr))
	rt := Route{Src: sockaddr(src[:]), Dst: sockaddr(dst[:]), Port: r.Port_num, SGID: r.Ib_route[0].Sgid, DGID: r.Ib_route[0].Dgid}
	if r.Node_guid != 0 {
		var g [8]byte
		binary.NativeEndian.PutUint64(g[:], r.Node_guid) // the kernel's __be64, as stored
		rt.NodeGUID = fmt.Sprintf("%02x%02x:%02x%02x:%02x%02x:%02x%02x", g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7])
	}
	return rt, nil
}

// Device returns the name of the uverbs device (for uverbs.Open) and the
// port the ID is bound to, found by the node GUID the kernel reports. It
// needs a resolved address, a bound address on one device, or a
// connect request's ID.
func (id *ID) Device() (string, uint8, error) {
	if id.bad() {
		return "", 0, errNilID
	}
	rt, err := id.Query()
	if err != nil {
		return "", 0, err
	}
	if rt.NodeGUID == "" {
		return "", 0, errors.New("cm: device: the ID has no device yet (resolve an address or bind to a device's address first)")
	}
	devs, err := uverbs.ListWithoutGIDs()
	if err != nil {
		return "", 0, fmt.Errorf("cm: device: %w", err)
	}
	for _, d := range devs {
		if strings.EqualFold(d.NodeGUID, rt.NodeGUID) {
			return d.Name, rt.Port, nil
		}
	}
	return "", 0, fmt.Errorf("cm: device: no uverbs device has node GUID %s", rt.NodeGUID)
}

// Close destroys the ID's QP (if CreateQP made one) and the kernel ID,
// after leaving the groups it joined. A listener's connect requests not
// yet taken are destroyed too. A command on the ID in flight (a join, a
// leave, ...) completes before the destroy; one that comes after Close
// returns an error matching ErrClosed. Idempotent.
func (id *ID) Close() error {
	if id.bad() {
		return errNilID
	}
	id.mu.Lock()
	if id.closed {
		id.mu.Unlock()
		return nil
	}
	id.closed = true
	pending := id.queue
	id.queue = nil
	close(id.done)
	id.mu.Unlock()

	// From here no command starts; wait for one in flight, then take
	// the groups and the QP as it left them.
	id.opMu.Lock()
	id.mu.Lock()
	q := id.qp
	mcs := append([]*Multicast(nil), id.mcs...)
	id.mu.Unlock()
	var errs []error
	// Leave the groups first: the kernel refuses to destroy a QP that is
	// still attached to a group (EBUSY).
	for i := len(mcs) - 1; i >= 0; i-- {
		if err := id.leaveLocked(mcs[i]); err != nil {
			errs = append(errs, fmt.Errorf("cm: close: %w", err))
		}
	}
	id.mu.Lock()
	id.qp = nil
	id.mu.Unlock()
	if q != nil {
		if err := q.Close(); err != nil {
			errs = append(errs, fmt.Errorf("cm: close: QP: %w", err))
		}
	}
	c := ioctl.UcmDestroyID{Id: id.handle}
	var r ioctl.UcmDestroyIDResp
	if err := id.ch.command(ioctl.RDMA_USER_CM_CMD_DESTROY_ID, unsafe.Pointer(&c), ioctl.SizeofUcmDestroyID,
		int(unsafe.Offsetof(c.Response)), unsafe.Pointer(&r), ioctl.SizeofUcmDestroyIDResp, "DESTROY_ID"); err != nil && !errors.Is(err, ErrClosed) {
		errs = append(errs, fmt.Errorf("cm: close: %w", err))
	}
	id.opMu.Unlock()
	// The kernel dropped the events it had not reported; those it reported
	// are values here, so there is nothing to acknowledge. After DESTROY_ID
	// no event of this uid can come, so the ID leaves the table now.
	id.ch.mu.Lock()
	delete(id.ch.ids, id.uid)
	id.ch.mu.Unlock()
	for _, ev := range pending {
		if ev.ID != nil {
			if err := ev.ID.Close(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
