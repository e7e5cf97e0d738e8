package cm

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

// CreateQP creates the ID's QP in pd (RC on a TCP ID, UD on a UDP ID; the
// Type in cfg is set accordingly) and moves it to INIT with the attributes
// the kernel gives for the ID (INIT_QP_ATTR: port, P_Key index, access or
// Q_Key). The ID owns the QP: Close destroys it. pd must be on the ID's
// device (Device).
func (id *ID) CreateQP(pd *uverbs.PD, cfg qp.Config) (*qp.QP, error) {
	if id.bad() {
		return nil, errNilID
	}
	if pd == nil {
		return nil, errors.New("cm: create QP: nil PD")
	}
	if pd.Context() == nil {
		return nil, errors.New("cm: create QP: a zero PD (make one with Context.AllocPD)")
	}
	if pd.IsClosed() {
		return nil, fmt.Errorf("cm: create QP: PD: %w", uverbs.ErrClosed)
	}
	if err := id.check("create QP"); err != nil {
		return nil, err
	}
	id.mu.Lock()
	has := id.qp != nil
	id.mu.Unlock()
	if has {
		return nil, errors.New("cm: create QP: the ID has a QP already")
	}
	if name, _, err := id.Device(); err != nil {
		return nil, fmt.Errorf("cm: create QP: %w", err)
	} else if name != pd.Context().Name() {
		return nil, fmt.Errorf("cm: create QP: the PD is on %s, the ID on %s", pd.Context().Name(), name)
	}
	cfg.Type = qp.RC
	if id.ud {
		cfg.Type = qp.UD
	}
	q, err := qp.Create(pd, cfg)
	if err != nil {
		return nil, fmt.Errorf("cm: create QP: %w", err)
	}
	if err := id.modifyFromKernel(q, qp.Init); err != nil {
		q.Close()
		return nil, fmt.Errorf("cm: create QP: %w", err)
	}
	if cfg.Type == qp.UD {
		// A UD QP is ready once the kernel's Q_Key is in (librdmacm's
		// ucma_init_ud_qp): RTR and RTS need nothing of the peer. ToRTS
		// from INIT keeps the kernel's INIT attributes and records the
		// port's MTU, the largest datagram.
		a, _, err := id.InitQPAttr(qp.Init)
		if err == nil {
			err = q.ToRTS(qp.UDOptions{Port: a.Port, QKey: a.QKey})
		}
		if err != nil {
			q.Close()
			return nil, fmt.Errorf("cm: create QP: %w", err)
		}
	}
	id.mu.Lock()
	if id.closed {
		id.mu.Unlock()
		q.Close()
		return nil, fmt.Errorf("cm: create QP: %w", ErrClosed)
	}
	id.qp = q
	id.devAttr = pd.Context().Attr()
	id.mu.Unlock()
	// Groups joined before the QP existed take it now.
	if err := id.attachJoined(); err != nil {
		if errors.Is(err, ErrClosed) {
			// A Close since took the QP and destroyed it.
			return nil, fmt.Errorf("cm: create QP: %w", err)
		}
		return q, fmt.Errorf("cm: create QP: %w", err)
	}
	return q, nil
}

// InitQPAttr asks the kernel for the attributes that move a QP of this ID
// to state (INIT_QP_ATTR), as librdmacm's rdma_init_qp_attr.
func (id *ID) InitQPAttr(state qp.State) (qp.Attr, qp.AttrMask, error) {
	if id.bad() {
		return qp.Attr{}, 0, errNilID
	}
	if err := id.check("init QP attributes"); err != nil {
		return qp.Attr{}, 0, err
	}
	c := ioctl.UcmInitQPAttr{Id: id.handle, State: uint32(state)}
	r := new(ioctl.QPAttr)
	if err := id.command(ioctl.RDMA_USER_CM_CMD_INIT_QP_ATTR, unsafe.Pointer(&c), ioctl.SizeofUcmInitQPAttr,
		int(unsafe.Offsetof(c.Response)), unsafe.Pointer(r), ioctl.SizeofQPAttr, "INIT_QP_ATTR"); err != nil {
		return qp.Attr{}, 0, fmt.Errorf("cm: QP attributes for %v: %w", state, err)
	}
	a := qp.Attr{
		State: qp.State(r.Qp_state), CurState: qp.State(r.Cur_qp_state), PathMTU: uverbs.MTU(r.Path_mtu),
		QKey: r.Qkey, RQPSN: r.Rq_psn, SQPSN: r.Sq_psn, DestQPN: r.Dest_qp_num, Access: mr.Access(r.Qp_access_flags),
		PKeyIndex: r.Pkey_index, MaxRdAtomic: r.Max_rd_atomic, MaxDestRdAtomic: r.Max_dest_rd_atomic,
		MinRNRTimer: r.Min_rnr_timer, Port: r.Port_num, Timeout: r.Timeout, RetryCnt: r.Retry_cnt, RNRRetry: r.Rnr_retry,
		AV: qp.AV{
			DGID: append([]byte(nil), r.Ah_attr.Grh.Dgid[:]...), FlowLabel: r.Ah_attr.Grh.Flow_label,
			SGIDIndex: r.Ah_attr.Grh.Sgid_index, HopLimit: r.Ah_attr.Grh.Hop_limit, TrafficClass: r.Ah_attr.Grh.Traffic_class,
			DLID: r.Ah_attr.Dlid, SL: r.Ah_attr.Sl, Port: r.Ah_attr.Port_num, IsGlobal: r.Ah_attr.Is_global != 0,
		},
	}
	return a, qp.AttrMask(r.Qp_attr_mask), nil
}

func (id *ID) modifyFromKernel(q *qp.QP, state qp.State) error {
	return id.modifyFromKernelAck(q, state, 0)
}

// modifyFromKernelAck is modifyFromKernel with the local ACK timeout
// replaced by ack (0: the kernel's) when moving to RTS.
func (id *ID) modifyFromKernelAck(q *qp.QP, state qp.State, ack uint8) error {
	a, mask, err := id.InitQPAttr(state)
	if err != nil {
		return err
	}
	a.State = state
	if ack != 0 && state == qp.RTS && mask&qp.MaskTimeout != 0 {
		a.Timeout = ack
	}
	if err := q.Modify(&a, mask); err != nil {
		return fmt.Errorf("modify to %v with the kernel's attributes (mask %#x): %w", state, uint32(mask), err)
	}
	return nil
}

// toRTS moves the QP through INIT (again: the kernel's values may have
// changed since CreateQP), RTR and RTS, as librdmacm does.
func (id *ID) toRTS(q *qp.QP, ack uint8) error {
	for _, s := range []qp.State{qp.Init, qp.RTR, qp.RTS} {
		if err := id.modifyFromKernelAck(q, s, ack); err != nil {
			return err
		}
	}
	return nil
}

// ConnParam holds what a connect or accept sends.
type ConnParam struct {
	PrivateData []byte
	// ResponderResources: RDMA reads/atomics the peer may have in flight
	// to us; InitiatorDepth: those we may have in flight. 0 takes the
	// device's limit (as librdmacm without a parameter).
	ResponderResources uint8
	InitiatorDepth     uint8
	// RetryCount and RNRRetryCount (0..7); 0 means 7, librdmacm's default.
	RetryCount    uint8
	RNRRetryCount uint8
	// ACKTimeout, when not 0, is the QP's local ACK timeout (4.096 us <<
	// ACKTimeout) instead of the one the kernel derives from the route
	// (19, about 2.1 s, on rxe), as librdmacm's RDMA_OPTION_ID_ACK_TIMEOUT.
	ACKTimeout uint8
	// QPN is used when the ID has no QP of its own (the caller moves its
	// QP with InitQPAttr); ignored otherwise. Such an ID must name one
	// (1..0xFFFFFF) to connect or accept, except in a SIDR request.
	QPN uint32
	// QKey of a UD QP (accept on a UDP ID): 0 or 0x01234567. On IP
	// addresses the kernel answers with the Q_Key of the port space
	// (0x01234567, the one it gave a QP made by CreateQP) and ignores
	// any other, so another is refused.
	QKey uint32
}

// maxQPN is the largest QP number (24 bits).
const maxQPN = 1<<24 - 1

// ipQKey is the Q_Key the kernel gives UD IDs on IP addresses
// (RDMA_UDP_QKEY), in the UDP and IB port spaces.
const ipQKey = 0x01234567

func (id *ID) connParam(p ConnParam, op string, maxData int) (ioctl.UcmConnParam, error) {
	var c ioctl.UcmConnParam
	if len(p.PrivateData) > maxData {
		return c, fmt.Errorf("cm: %s: %d bytes of private data, at most %d fit (%v port space)", op, len(p.PrivateData), maxData, id.ps)
	}
	if p.RetryCount > 7 || p.RNRRetryCount > 7 {
		return c, fmt.Errorf("cm: %s: retry count %d / RNR retry count %d: at most 7", op, p.RetryCount, p.RNRRetryCount)
	}
	if p.QPN > maxQPN {
		// The kernel keeps the low 24 bits: the peer would be given
		// another QP.
		return c, fmt.Errorf("cm: %s: QPN %#x does not fit in 24 bits", op, p.QPN)
	}
	if p.QKey != 0 && p.QKey != ipQKey {
		// ucma passes the Q_Key on only for AF_IB addresses; on the IP
		// addresses this package gives, the kernel answers with its own.
		return c, fmt.Errorf("cm: %s: Q_Key %#x: on IP addresses the kernel uses the port space's Q_Key, %#x, and ignores another", op, p.QKey, ipQKey)
	}
	id.mu.Lock()
	q := id.qp
	id.mu.Unlock()
	// An RC connect or accept, and a SIDR reply, name a QP to the peer:
	// without one of the ID's own, ConnParam.QPN is it (QP 0 is the
	// subnet management QP, never the user's).
	if q == nil && p.QPN == 0 && (!id.ud || op == "accept") {
		return c, fmt.Errorf("cm: %s: the ID has no QP (CreateQP) and ConnParam.QPN is 0: name the QP the peer is to use", op)
	}
	c.Qp_num = p.QPN
	resp, init := p.ResponderResources, p.InitiatorDepth
	if q == nil {
		resp, init = max(resp, 1), max(init, 1)
	} else {
		c.Qp_num = q.QPN()
		a := id.devAttr
		if resp == 0 {
			resp = uint8(min(a.MaxQPRdAtom, 255))
		}
		if init == 0 {
			init = uint8(min(a.MaxQPInitRdAtom, 255))
		}
	}
	c.Qkey = p.QKey
	c.Private_data_len = uint8(copy(c.Private_data[:], p.PrivateData))
	c.Responder_resources, c.Initiator_depth = resp, init
	c.Retry_count, c.Rnr_retry_count = p.RetryCount, p.RNRRetryCount
	if c.Retry_count == 0 {
		c.Retry_count = 7
	}
	if c.Rnr_retry_count == 0 {
		c.Rnr_retry_count = 7
	}
	c.Valid = 1
	return c, nil
}

// Connect sends a connect request (after ResolveRoute) and waits for the
// answer. On a UDP ID it is a SIDR request: the Established event carries
// the peer's QPN, Q_Key and address handle attributes (Event.AH). With a QP (CreateQP) it then moves the QP to RTR and RTS with the
// kernel's attributes and completes the handshake (RTU); the event returned
// carries the peer's private data. A reject is an *EventError with the
// reason and the peer's private data.
func (id *ID) Connect(ctx context.Context, p ConnParam) (Event, error) {
	if id.bad() {
		return Event{}, errNilID
	}
	if ctx == nil {
		return Event{}, errors.New("cm: connect: nil context")
	}
	if err := id.check("connect"); err != nil {
		return Event{}, err
	}
	max := MaxConnectData
	if id.ud {
		// A SIDR request: the answer is ESTABLISHED with the peer's QPN,
		// Q_Key and address (Event.AH), or REJECTED / UNREACHABLE.
		max = MaxUDConnectData
	}
	cp, err := id.connParam(p, "connect", max)
	if err != nil {
		return Event{}, err
	}
	if err := ctx.Err(); err != nil {
		// Nothing sent: a request the peer would answer is not made for
		// a step already given up.
		return Event{}, fmt.Errorf("cm: connect: %w", err)
	}
	c := ioctl.UcmConnect{Param: cp, Id: id.handle}
	if err := id.command(ioctl.RDMA_USER_CM_CMD_CONNECT, unsafe.Pointer(&c), ioctl.SizeofUcmConnect, 0, nil, 0, "CONNECT"); err != nil {
		return Event{}, fmt.Errorf("cm: connect: %w", err)
	}
	ev, err := id.waitFor(ctx, "connect", ConnectResponse, Established)
	if err != nil || ev.Type == Established {
		return ev, err
	}
	id.mu.Lock()
	q := id.qp
	id.mu.Unlock()
	if q != nil {
		if err := id.toRTS(q, p.ACKTimeout); err != nil {
			q.ToError()
			id.Reject(nil, 0)
			return ev, fmt.Errorf("cm: connect: %w", err)
		}
	}
	// ACCEPT on the active side sends the RTU.
	a := ioctl.UcmAccept{Id: id.handle}
	if err := id.command(ioctl.RDMA_USER_CM_CMD_ACCEPT, unsafe.Pointer(&a), ioctl.SizeofUcmAccept, 0, nil, 0, "ACCEPT (RTU)"); err != nil {
		if q != nil {
			q.ToError()
		}
		return ev, fmt.Errorf("cm: connect: establish: %w", err)
	}
	ev.Type = Established
	return ev, nil
}

// Accept accepts a connect request (an Event.ID from GetRequest): with a
// QP it moves the QP to RTR and RTS first, then answers and waits for
// ESTABLISHED.
func (id *ID) Accept(ctx context.Context, p ConnParam) (Event, error) {
	if id.bad() {
		return Event{}, errNilID
	}
	if ctx == nil {
		return Event{}, errors.New("cm: accept: nil context")
	}
	if err := id.check("accept"); err != nil {
		return Event{}, err
	}
	max := MaxAcceptData
	if id.ud {
		max = MaxUDAcceptData
	}
	cp, err := id.connParam(p, "accept", max)
	if err != nil {
		return Event{}, err
	}
	if err := ctx.Err(); err != nil {
		// Nothing sent: the peer must not see an accept this side
		// reports as failed.
		return Event{}, fmt.Errorf("cm: accept: %w", err)
	}
	id.mu.Lock()
	q := id.qp
	id.mu.Unlock()
	if q != nil && !id.ud {
		if err := id.toRTS(q, p.ACKTimeout); err != nil {
			return Event{}, fmt.Errorf("cm: accept: %w", err)
		}
	}
	c := ioctl.UcmAccept{Uid: id.uid, Param: cp, Id: id.handle}
	if err := id.command(ioctl.RDMA_USER_CM_CMD_ACCEPT, unsafe.Pointer(&c), ioctl.SizeofUcmAccept, 0, nil, 0, "ACCEPT"); err != nil {
		if q != nil {
			q.ToError()
		}
		return Event{}, fmt.Errorf("cm: accept: %w", err)
	}
	if id.ud {
		return Event{Type: Established}, nil
	}
	return id.waitFor(ctx, "accept", Established)
}

// Reject rejects a connect request with private data (at most
// MaxRejectData bytes; MaxUDAcceptData on a UD ID) and a reason: 0 (the
// kernel's default, RejectConsumerDefined) or RejectVendorOptionNotSupported;
// the kernel sends no other.
func (id *ID) Reject(data []byte, reason uint8) error {
	if id.bad() {
		return errNilID
	}
	if err := id.check("reject"); err != nil {
		return err
	}
	max := MaxRejectData
	if id.ud {
		max = MaxUDAcceptData // a SIDR reply with a reject status
	}
	if len(data) > max {
		return fmt.Errorf("cm: reject: %d bytes of private data, at most %d fit (%v port space)", len(data), max, id.ps)
	}
	switch reason {
	case 0, RejectConsumerDefined, RejectVendorOptionNotSupported:
	default:
		return fmt.Errorf("cm: reject: reason %d: the kernel sends only %d (consumer defined, what 0 gives) or %d (vendor option not supported)",
			reason, RejectConsumerDefined, RejectVendorOptionNotSupported)
	}
	c := ioctl.UcmReject{Id: id.handle, Reason: reason}
	c.Data_len = uint8(copy(c.Data[:], data))
	if err := id.command(ioctl.RDMA_USER_CM_CMD_REJECT, unsafe.Pointer(&c), ioctl.SizeofUcmReject, 0, nil, 0, "REJECT"); err != nil {
		return fmt.Errorf("cm: reject: %w", err)
	}
	return nil
}

// Disconnect moves the QP to the error state (its pending work completes
// with flush errors) and sends a disconnect request; the peer gets
// DISCONNECTED, and so does this ID once the peer answered (WaitDisconnect).
func (id *ID) Disconnect() error {
	if id.bad() {
		return errNilID
	}
	if err := id.check("disconnect"); err != nil {
		return err
	}
	id.mu.Lock()
	q := id.qp
	id.mu.Unlock()
	if q != nil {
		if err := q.ToError(); err != nil {
			return fmt.Errorf("cm: disconnect: %w", err)
		}
	}
	c := ioctl.UcmDisconnect{Id: id.handle}
	if err := id.command(ioctl.RDMA_USER_CM_CMD_DISCONNECT, unsafe.Pointer(&c), ioctl.SizeofUcmDisconnect, 0, nil, 0, "DISCONNECT"); err != nil {
		return fmt.Errorf("cm: disconnect: %w", err)
	}
	return nil
}

// WaitDisconnect waits for the end of the connection: DISCONNECTED (the
// peer disconnected: answer with Disconnect, which sends the reply the
// peer waits for; or the peer answered our Disconnect, or did not within
// the CM's timeout) or TIMEWAIT_EXIT (the connection's last event, when its
// DISCONNECTED was taken by Wait before) return nil. An event after which
// no DISCONNECTED comes ends it with an *EventError: DEVICE_REMOVAL
// (ErrDeviceRemoved: the kernel destroyed its side of the ID), REJECTED,
// CONNECT_ERROR or UNREACHABLE (the connection failed). So does the ID's
// Close (ErrClosed), the channel's failure, and the context.
func (id *ID) WaitDisconnect(ctx context.Context) error {
	if id.bad() {
		return errNilID
	}
	if ctx == nil {
		return errors.New("cm: wait for disconnect: nil context")
	}
	for {
		ev, err := id.Wait(ctx)
		if err != nil {
			return fmt.Errorf("cm: wait for disconnect: %w", err)
		}
		switch ev.Type {
		case Disconnected, TimewaitExit:
			return nil
		case DeviceRemoval, Rejected, ConnectError, Unreachable:
			return &EventError{Op: "wait for disconnect", Event: ev}
		}
		// Anything else (ESTABLISHED, ADDR_CHANGE, a group's event) is
		// not the end.
	}
}
