package cm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/uverbs"
	"golang.org/x/sys/unix"
)

// DevicePath is the ucma character device.
const DevicePath = "/dev/infiniband/rdma_cm"

// Channel is an opened rdma_cm descriptor: the event channel of the IDs
// made on it. One goroutine reads its events (waiting in Go's netpoller:
// the descriptor is non-blocking and polls readable when events are
// queued) and hands each to its ID. Safe for concurrent use.
type Channel struct {
	file *os.File
	rc   syscall.RawConn

	mu      sync.Mutex
	closed  bool
	nextUID uint64
	ids     map[uint64]*ID        // by uid, the key the kernel reports events with
	mcs     map[uint64]*Multicast // multicast joins, by their own uid
	readErr error
	done    chan struct{} // closed when the reader ends
}

// Open opens /dev/infiniband/rdma_cm (the rdma_ucm module must be loaded).
func Open() (*Channel, error) {
	fd, err := unix.Open(DevicePath, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENXIO) {
			return nil, fmt.Errorf("cm: open %s: %w (is the rdma_ucm module loaded?)", DevicePath, err)
		}
		return nil, fmt.Errorf("cm: open %s: %w", DevicePath, err)
	}
	f := os.NewFile(uintptr(fd), DevicePath)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("cm: open %s: %w", DevicePath, err)
	}
	ch := &Channel{file: f, rc: rc, ids: map[uint64]*ID{}, mcs: map[uint64]*Multicast{}, done: make(chan struct{})}
	go ch.read()
	return ch, nil
}

// Close destroys every ID still open on the channel, then closes the
// descriptor and waits for the event reader to end. Idempotent.
func (ch *Channel) Close() error {
	if ch.bad() {
		return errNilChannel
	}
	// Closed first: from here no ID joins the table (CreateIDType and a
	// connect request see it), so the IDs taken now are all there are
	// and each is closed below; a second Close waits for this one.
	ch.mu.Lock()
	if ch.closed {
		ch.mu.Unlock()
		<-ch.done
		return nil
	}
	ch.closed = true
	ids := make([]*ID, 0, len(ch.ids))
	for _, id := range ch.ids {
		ids = append(ids, id)
	}
	ch.mu.Unlock()
	var errs []error
	for _, id := range ids {
		if err := id.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := ch.file.Close(); err != nil {
		errs = append(errs, fmt.Errorf("cm: close channel: %w", err))
	}
	<-ch.done
	return errors.Join(errs...)
}

// Fd returns the descriptor (for diagnostics; the channel owns it), or -1
// once closed (and for a nil or zero Channel, which has none). It does
// not use os.File.Fd, which would make the descriptor blocking and take
// it away from the netpoller.
func (ch *Channel) Fd() int {
	if ch.bad() {
		return -1
	}
	fd := -1
	if err := ch.rc.Control(func(f uintptr) { fd = int(f) }); err != nil {
		return -1
	}
	return fd
}

// command writes one ucma command: struct rdma_ucm_cmd_hdr, then the
// command struct in (inLen bytes). When out is not nil the kernel writes
// outLen bytes of response there; respOff is the offset of the command's
// response field, which gets out's address.
func (ch *Channel) command(cmd uint32, in unsafe.Pointer, inLen int, respOff int, out unsafe.Pointer, outLen int, op string) error {
	var pin runtime.Pinner
	defer pin.Unpin()
	buf := make([]byte, ioctl.SizeofUcmCmdHdr+inLen)
	binary.NativeEndian.PutUint32(buf[0:], cmd)
	binary.NativeEndian.PutUint16(buf[4:], uint16(inLen))
	binary.NativeEndian.PutUint16(buf[6:], uint16(outLen))
	copy(buf[ioctl.SizeofUcmCmdHdr:], unsafe.Slice((*byte)(in), inLen))
	if out != nil {
		pin.Pin(out)
		binary.NativeEndian.PutUint64(buf[ioctl.SizeofUcmCmdHdr+respOff:], uint64(uintptr(out)))
	}
	var werr error
	err := ch.rc.Control(func(fd uintptr) {
		for {
			_, werr = unix.Write(int(fd), buf)
			if werr != unix.EINTR {
				return
			}
		}
	})
	if err != nil {
		// A descriptor being closed fails with the poller's "use of
		// closed file", which is not os.ErrClosed; Close marks the
		// channel closed before it closes the descriptor, so the mark
		// tells. (No caller holds ch.mu here.)
		ch.mu.Lock()
		closed := ch.closed
		ch.mu.Unlock()
		if closed || errors.Is(err, os.ErrClosed) {
			return ErrClosed
		}
		return fmt.Errorf("cm: %s: %w", op, err)
	}
	if werr != nil {
		return &ioctl.Error{Op: "rdma_cm " + op, Errno: werr.(unix.Errno)}
	}
	runtime.KeepAlive(in)
	return nil
}

// read takes events off the descriptor until it is closed.
func (ch *Channel) read() {
	defer close(ch.done)
	resp := new(ioctl.UcmEventResp)
	var pin runtime.Pinner
	pin.Pin(resp)
	defer pin.Unpin()
	var buf [ioctl.SizeofUcmCmdHdr + ioctl.SizeofUcmGetEvent]byte
	binary.NativeEndian.PutUint32(buf[0:], ioctl.RDMA_USER_CM_CMD_GET_EVENT)
	binary.NativeEndian.PutUint16(buf[4:], ioctl.SizeofUcmGetEvent)
	binary.NativeEndian.PutUint16(buf[6:], ioctl.SizeofUcmEventResp)
	binary.NativeEndian.PutUint64(buf[ioctl.SizeofUcmCmdHdr:], uint64(uintptr(unsafe.Pointer(resp))))
	for {
		var werr error
		err := ch.rc.Read(func(fd uintptr) bool {
			_, werr = unix.Write(int(fd), buf[:])
			// EAGAIN: nothing queued; the netpoller waits for POLLIN.
			return werr != unix.EAGAIN
		})
		if err == nil && werr == unix.EINTR {
			continue
		}
		if err == nil && werr != nil {
			err = &ioctl.Error{Op: "rdma_cm GET_EVENT", Errno: werr.(unix.Errno)}
		}
		if err != nil {
			ch.mu.Lock()
			if ch.closed {
				err = ErrClosed
			}
			ch.readErr = err
			ids := make([]*ID, 0, len(ch.ids))
			for _, id := range ch.ids {
				ids = append(ids, id)
			}
			ch.mu.Unlock()
			for _, id := range ids {
				id.wake()
			}
			return
		}
		ch.dispatch(resp)
	}
}

// dispatch hands an event to its ID. A connect request makes the new ID
// (its kernel handle is resp.Id) and goes to the listener (resp.Uid).
func (ch *Channel) dispatch(resp *ioctl.UcmEventResp) {
	ev := Event{Type: EventType(resp.Event), Status: int32(resp.Status)}
	p := (*ioctl.UcmConnParam)(unsafe.Pointer(&resp.Param[0]))
	ch.mu.Lock()
	owner := ch.ids[resp.Uid]
	var mc *Multicast
	if ev.Type == MulticastJoin || ev.Type == MulticastError {
		// A multicast event carries the uid its join gave, not the ID's.
		owner = nil
		if mc = ch.mcs[resp.Uid]; mc != nil {
			owner = mc.id
			ev.Multicast = mc
		}
	}
	var ud bool
	if owner != nil {
		ud = owner.ud
	}
	switch {
	case mc != nil:
		if ev.Type == MulticastJoin {
			u := (*ioctl.UcmUDParam)(unsafe.Pointer(&resp.Param[0]))
			ev.QPN, ev.QKey = u.Qp_num, u.Qkey
			ah := udAH(&u.Ah_attr)
			ev.AH = &ah
			// Only the reader writes these, before the event is queued.
			mc.AH, mc.QPN, mc.QKey, mc.MLID = ah, u.Qp_num, u.Qkey, u.Ah_attr.Dlid
		}
	case !ud:
		n := int(p.Private_data_len)
		if n > len(p.Private_data) {
			n = len(p.Private_data)
		}
		if n > 0 {
			ev.PrivateData = append([]byte(nil), p.Private_data[:n]...)
		}
		ev.QPN, ev.QKey = p.Qp_num, p.Qkey
		ev.ResponderResources, ev.InitiatorDepth = p.Responder_resources, p.Initiator_depth
		ev.RetryCount, ev.RNRRetryCount, ev.SRQ = p.Retry_count, p.Rnr_retry_count, p.Srq != 0
	default:
		u := (*ioctl.UcmUDParam)(unsafe.Pointer(&resp.Param[0]))
		n := min(int(u.Private_data_len), len(u.Private_data))
		if n > 0 {
			ev.PrivateData = append([]byte(nil), u.Private_data[:n]...)
		}
		ev.QPN, ev.QKey = u.Qp_num, u.Qkey
		if ev.Type == Established {
			ah := udAH(&u.Ah_attr)
			ev.AH = &ah
		}
	}
	if ev.Type == ConnectRequest {
		if owner == nil || ch.closed {
			ch.mu.Unlock()
			// Nobody to hand it to: destroy the kernel's new ID.
			ch.destroyHandle(resp.Id)
			return
		}
		child := ch.newIDLocked(owner.ps, owner.ud, resp.Id)
		ev.ID = child
	}
	ch.mu.Unlock()
	if owner == nil {
		return // an ID destroyed since; the kernel dropped the rest
	}
	owner.push(ev)
}

// udAH converts the kernel's struct ib_uverbs_ah_attr of a UD event.
func udAH(a *ioctl.AHAttr) uverbs.AHAttr {
	return uverbs.AHAttr{
		Port: a.Port_num, DGID: append(net.IP(nil), a.Grh.Dgid[:]...), SGIDIndex: a.Grh.Sgid_index, UseSGID: a.Is_global != 0,
		HopLimit: a.Grh.Hop_limit, TrafficClass: a.Grh.Traffic_class, FlowLabel: a.Grh.Flow_label, DLID: a.Dlid, SL: a.Sl,
	}
}

func (ch *Channel) destroyHandle(h uint32) {
	c := ioctl.UcmDestroyID{Id: h}
	var r ioctl.UcmDestroyIDResp
	_ = ch.command(ioctl.RDMA_USER_CM_CMD_DESTROY_ID, unsafe.Pointer(&c), ioctl.SizeofUcmDestroyID, 0, unsafe.Pointer(&r), ioctl.SizeofUcmDestroyIDResp, "DESTROY_ID")
}

func (ch *Channel) newIDLocked(ps PortSpace, ud bool, handle uint32) *ID {
	ch.nextUID++
	return ch.addIDLocked(ch.nextUID, ps, ud, handle)
}

// addIDLocked enters the ID of the kernel's handle, reporting its events
// with uid, in the table.
func (ch *Channel) addIDLocked(uid uint64, ps PortSpace, ud bool, handle uint32) *ID {
	id := &ID{ch: ch, uid: uid, handle: handle, ps: ps, ud: ud, notify: make(chan struct{}, 1), done: make(chan struct{})}
	ch.ids[uid] = id
	return id
}

// IDs is the number of IDs open on the channel (including connect requests
// not yet taken).
func (ch *Channel) IDs() int {
	if ch == nil {
		return 0
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return len(ch.ids)
}
