package uverbs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/goverbs/goverbs/ioctl"
	"golang.org/x/sys/unix"
)

// EventType is an asynchronous event's type (the verbs' IB_EVENT_*; the
// same numbers as rdma-core's IBV_EVENT_*).
type EventType uint32

// Asynchronous event types.
const (
	EventCQErr            EventType = 0
	EventQPFatal          EventType = 1
	EventQPReqErr         EventType = 2
	EventQPAccessErr      EventType = 3
	EventCommEst          EventType = 4
	EventSQDrained        EventType = 5
	EventPathMig          EventType = 6
	EventPathMigErr       EventType = 7
	EventDeviceFatal      EventType = 8
	EventPortActive       EventType = 9
	EventPortErr          EventType = 10
	EventLIDChange        EventType = 11
	EventPKeyChange       EventType = 12
	EventSMChange         EventType = 13
	EventSRQErr           EventType = 14
	EventSRQLimitReached  EventType = 15
	EventQPLastWQEReached EventType = 16
	EventClientReregister EventType = 17
	EventGIDChange        EventType = 18
	EventWQFatal          EventType = 19
)

var eventNames = [...]string{
	"CQ_ERR", "QP_FATAL", "QP_REQ_ERR", "QP_ACCESS_ERR", "COMM_EST", "SQ_DRAINED", "PATH_MIG",
	"PATH_MIG_ERR", "DEVICE_FATAL", "PORT_ACTIVE", "PORT_ERR", "LID_CHANGE", "PKEY_CHANGE",
	"SM_CHANGE", "SRQ_ERR", "SRQ_LIMIT_REACHED", "QP_LAST_WQE_REACHED", "CLIENT_REREGISTER",
	"GID_CHANGE", "WQ_FATAL",
}

func (e EventType) String() string {
	if int(e) < len(eventNames) {
		return eventNames[e]
	}
	return fmt.Sprintf("EventType(%d)", uint32(e))
}

// Kind tells what an event is about.
func (e EventType) Kind() string {
	switch e {
	case EventCQErr:
		return "cq"
	case EventSRQErr, EventSRQLimitReached:
		return "srq"
	case EventDeviceFatal:
		return "device"
	case EventPortActive, EventPortErr, EventLIDChange, EventPKeyChange, EventSMChange,
		EventClientReregister, EventGIDChange:
		return "port"
	case EventWQFatal:
		return "wq"
	}
	return "qp"
}

// AsyncEvent is an event the device reports outside the data path: a port
// going down or up, a QP or CQ in error, an SRQ below its limit.
type AsyncEvent struct {
	Type EventType
	// Port is the port number of port events.
	Port int
	// Object is the *qp.QP, *cq.CQ or *qp.SRQ the event is about (nil for
	// port and device events).
	Object any
}

func (e AsyncEvent) String() string {
	switch e.Type.Kind() {
	case "port":
		return fmt.Sprintf("%v on port %d", e.Type, e.Port)
	case "device":
		return e.Type.String()
	}
	if s, ok := e.Object.(fmt.Stringer); ok {
		return fmt.Sprintf("%v on %v", e.Type, s)
	}
	return fmt.Sprintf("%v on %T", e.Type, e.Object)
}

// asyncEvents reads the context's async event file.
type asyncEvents struct {
	once    sync.Once
	file    *os.File
	ch      chan AsyncEvent
	done    chan struct{}
	dropped atomic.Uint64
	err     error
}

// allocAsyncFD gives the context its default async event file, so that the
// objects created afterwards report their events there. The legacy
// GET_CONTEXT made one already.
func (c *Context) allocAsyncFD() error {
	if c.asyncFD >= 0 {
		return nil
	}
	var call ioctl.Call
	call.Reset(ioctl.UVERBS_OBJECT_ASYNC_EVENT, ioctl.UVERBS_METHOD_ASYNC_EVENT_ALLOC, c.file.DriverID())
	h := call.NewIDR(ioctl.UVERBS_ATTR_ASYNC_EVENT_ALLOC_FD_HANDLE)
	if err := c.file.Do(&call, "ASYNC_EVENT_ALLOC"); err != nil {
		if errors.Is(err, ioctl.ErrNotSupported) {
			return nil // an old kernel: GET_CONTEXT by write() made the file
		}
		return err
	}
	c.asyncFD = int(int32(call.Data(h)))
	return nil
}

// Events returns the channel on which the device's asynchronous events
// arrive, starting a reader the first time. Events are values: there is
// nothing to acknowledge. rdma-core makes its users acknowledge each event
// because C objects are freed on destroy; here an event holds a reference
// to its object, which reports ErrClosed once closed, and events that the
// kernel reports about an object closed before they are delivered are
// dropped (Close destroys the kernel object, and the kernel discards its
// queued events, first). Read the channel promptly: while it is full the
// kernel queues further events.
func (c *Context) Events() (<-chan AsyncEvent, error) {
	if c.bad() {
		return nil, errNilContext
	}
	if c.IsClosed() {
		return nil, ErrClosed
	}
	a := &c.async
	var err error
	a.once.Do(func() {
		if c.asyncFD < 0 {
			err = errors.New("uverbs: this kernel gave the context no async event file")
			return
		}
		var f *os.File
		if f, err = pollable(c.asyncFD, "uverbs-async"); err != nil {
			return
		}
		a.file = f
		a.ch = make(chan AsyncEvent, 64)
		a.done = make(chan struct{})
		go c.readEvents(a)
	})
	if err != nil {
		a.err = err
	}
	if a.ch == nil {
		if a.err != nil {
			return nil, a.err
		}
		if c.IsClosed() {
			return nil, ErrClosed // Close ran first (closeAsync)
		}
		return nil, errors.New("uverbs: async events unavailable")
	}
	return a.ch, nil
}

// DroppedEvents counts events about objects closed before delivery.
func (c *Context) DroppedEvents() uint64 { return c.orZero().async.dropped.Load() }

func (c *Context) readEvents(a *asyncEvents) {
	defer close(a.done)
	defer close(a.ch)
	var buf [ioctl.SizeofAsyncEventDesc]byte
	for {
		n, err := a.file.Read(buf[:])
		if err != nil {
			if !errors.Is(err, os.ErrClosed) && !errors.Is(err, io.EOF) {
				a.err = fmt.Errorf("uverbs: %s: async event read: %w", c.info.Name, err)
			}
			return
		}
		if n != len(buf) {
			continue
		}
		elem := binary.NativeEndian.Uint64(buf[0:8])
		ev := AsyncEvent{Type: EventType(binary.NativeEndian.Uint32(buf[8:12]))}
		switch ev.Type.Kind() {
		case "port":
			ev.Port = int(elem)
		case "device":
		default:
			obj, ok := c.tab.ObjectOf(elem)
			if !ok || obj == nil {
				a.dropped.Add(1)
				continue
			}
			if cl, ok := obj.(interface{ IsClosed() bool }); ok && cl.IsClosed() {
				a.dropped.Add(1)
				continue
			}
			ev.Object = obj
		}
		a.ch <- ev
	}
}

// closeAsync closes the async event file (and so stops the reader).
func (c *Context) closeAsync() error {
	// An Events that passed its IsClosed check before Close began either
	// finishes starting the reader first (Once.Do waits for it), which is
	// then stopped below, or never starts one: its once is spent here.
	// Without this it could start a reader on the descriptor just closed,
	// or on another file that took its number, which nothing stops.
	c.async.once.Do(func() {})
	if c.asyncFD < 0 {
		return nil
	}
	var err error
	if f := c.async.file; f != nil {
		err = f.Close()
		// The reader may be blocked handing over an event nobody reads.
		for range c.async.ch {
		}
		<-c.async.done
	} else {
		err = unix.Close(c.asyncFD)
	}
	c.asyncFD = -1
	return err
}
