package cm

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/goverbs/goverbs/internal/sentinel"
	"github.com/goverbs/goverbs/uverbs"
	"golang.org/x/sys/unix"
)

// EventType is the kernel's enum rdma_cm_event_type (include/rdma/rdma_cm.h;
// not in the uapi headers, so listed here; librdmacm uses the same values).
type EventType uint32

// Connection manager events.
const (
	AddrResolved    EventType = 0
	AddrError       EventType = 1
	RouteResolved   EventType = 2
	RouteError      EventType = 3
	ConnectRequest  EventType = 4
	ConnectResponse EventType = 5
	ConnectError    EventType = 6
	Unreachable     EventType = 7
	Rejected        EventType = 8
	Established     EventType = 9
	Disconnected    EventType = 10
	DeviceRemoval   EventType = 11
	MulticastJoin   EventType = 12
	MulticastError  EventType = 13
	AddrChange      EventType = 14
	TimewaitExit    EventType = 15
)

var eventNames = [...]string{
	"ADDR_RESOLVED", "ADDR_ERROR", "ROUTE_RESOLVED", "ROUTE_ERROR", "CONNECT_REQUEST",
	"CONNECT_RESPONSE", "CONNECT_ERROR", "UNREACHABLE", "REJECTED", "ESTABLISHED",
	"DISCONNECTED", "DEVICE_REMOVAL", "MULTICAST_JOIN", "MULTICAST_ERROR", "ADDR_CHANGE",
	"TIMEWAIT_EXIT",
}

func (e EventType) String() string {
	if int(e) < len(eventNames) {
		return eventNames[e]
	}
	return fmt.Sprintf("EVENT_%d", uint32(e))
}

// Event is one event of an ID.
type Event struct {
	Type EventType
	// Status is 0, a negative errno (address, route, unreachable and
	// connect errors), or the InfiniBand CM reject reason (Rejected).
	Status int32
	// ID is the new connection's ID on a ConnectRequest; the receiver owns
	// it (accept or reject it, then Close it).
	ID *ID
	// PrivateData is the peer's private data (connect request, response,
	// establish, reject). InfiniBand CM messages carry no length: it is the
	// whole private data field of the message, padded with zeros.
	PrivateData []byte
	// The peer's connection parameters (connect request and response).
	QPN                uint32
	QKey               uint32
	ResponderResources uint8
	InitiatorDepth     uint8
	RetryCount         uint8
	RNRRetryCount      uint8
	SRQ                bool
	// AH is where a UD peer is (a UDP ID's ESTABLISHED, or the group of a
	// MULTICAST_JOIN): give it to uverbs.PD.CreateAH and send to QPN with
	// QKey.
	AH *uverbs.AHAttr
	// Multicast is the group of a MULTICAST_JOIN or MULTICAST_ERROR.
	Multicast *Multicast
}

func (e Event) String() string {
	s := e.Type.String()
	if e.Status != 0 {
		s += fmt.Sprintf(" (status %d)", e.Status)
	}
	return s
}

// Sentinels an *EventError matches with errors.Is.
var (
	ErrClosed       = sentinel.Closed("cm: use of closed ID or channel") // goverbs.ErrClosed for errors.Is
	ErrAddress      = errors.New("cm: address resolution failed")
	ErrRoute        = errors.New("cm: route resolution failed")
	ErrUnreachable  = errors.New("cm: peer unreachable")
	ErrRejected     = errors.New("cm: connection rejected")
	ErrConnRefused  = errors.New("cm: connection refused")
	ErrDisconnected = errors.New("cm: peer disconnected")
	ErrConnect      = errors.New("cm: connection error")
	// ErrDeviceRemoved matches an *EventError of a DEVICE_REMOVAL event,
	// and the error of a wait on an ID whose DEVICE_REMOVAL was taken
	// before: the kernel destroyed its side of the ID and reports no more
	// events for it (Close it).
	ErrDeviceRemoved = errors.New("cm: device removed")
)

// Reject reasons of the InfiniBand CM (IBTA 12.6.7.2) worth naming.
const (
	RejectNoQP             = 1
	RejectInvalidServiceID = 8 // nobody listens on that port: connection refused
	RejectStaleConn        = 10
	RejectTimeout          = 26 // rdma_cm sends it when route or address do not match
	RejectConsumerDefined  = 28 // what Reject sends
	RejectInvalidRNRRetry  = 29
	// RejectVendorOptionNotSupported is the other reason Reject may send
	// (the kernel refuses any but it and RejectConsumerDefined).
	RejectVendorOptionNotSupported = 35
)

func rejectReason(r int32) string {
	switch r {
	case RejectNoQP:
		return "no QP"
	case RejectInvalidServiceID:
		return "invalid service ID: nobody listens there"
	case RejectStaleConn:
		return "stale connection"
	case RejectTimeout:
		return "timeout"
	case RejectConsumerDefined:
		return "consumer defined: the peer rejected"
	case RejectInvalidRNRRetry:
		return "invalid RNR retry"
	}
	return "IB CM reason"
}

// EventError is a step that ended with an error event.
type EventError struct {
	Op    string // "resolve address", "connect", ...
	Event Event
}

func (e *EventError) Error() string {
	if e == nil {
		return "cm: nil EventError"
	}
	ev := e.Event
	switch ev.Type {
	case Rejected:
		s := fmt.Sprintf("cm: %s: rejected with reason %d (%s)", e.Op, ev.Status, rejectReason(ev.Status))
		if n := trimmedLen(ev.PrivateData); n > 0 {
			s += fmt.Sprintf(", private data %q", ev.PrivateData[:n])
		}
		return s
	case Disconnected:
		return fmt.Sprintf("cm: %s: peer disconnected", e.Op)
	}
	cause := ev.Type.String()
	switch ev.Type {
	case AddrError:
		cause = "address error"
	case RouteError:
		cause = "route error"
	case Unreachable:
		cause = "peer unreachable"
	case ConnectError:
		cause = "connection error"
	case MulticastError:
		cause = "multicast error"
	case DeviceRemoval:
		cause = "device removed (DEVICE_REMOVAL: the kernel reports nothing more for the ID; close it)"
	}
	if ev.Status < 0 {
		return fmt.Sprintf("cm: %s: %s: %v", e.Op, cause, unix.Errno(-ev.Status))
	}
	if ev.Status > 0 {
		return fmt.Sprintf("cm: %s: %s (status %d)", e.Op, cause, ev.Status)
	}
	return fmt.Sprintf("cm: %s: %s", e.Op, cause)
}

// Is matches the sentinel of the event's kind.
func (e *EventError) Is(target error) bool {
	if e == nil {
		return false
	}
	switch e.Event.Type {
	case AddrError:
		return target == ErrAddress
	case RouteError:
		return target == ErrRoute
	case Unreachable:
		return target == ErrUnreachable
	case Rejected:
		return target == ErrRejected || (target == ErrConnRefused && e.Event.Status == RejectInvalidServiceID)
	case Disconnected:
		return target == ErrDisconnected
	case ConnectError:
		return target == ErrConnect
	case MulticastError:
		return target == ErrMulticast
	case DeviceRemoval:
		return target == ErrDeviceRemoved
	}
	return false
}

// Unwrap returns the errno a negative status carries (ETIMEDOUT, EHOSTUNREACH, ...).
func (e *EventError) Unwrap() error {
	if e == nil {
		return nil
	}
	if e.Event.Status < 0 {
		return unix.Errno(-e.Event.Status)
	}
	return nil
}

// trimmedLen is the length of b without its trailing zeros.
func trimmedLen(b []byte) int {
	n := len(b)
	for n > 0 && b[n-1] == 0 {
		n--
	}
	return n
}

// Addresses of an ID (QUERY_ROUTE).
type Route struct {
	Src, Dst netip.AddrPort
	NodeGUID string // "xxxx:xxxx:xxxx:xxxx", as sysfs writes it
	Port     uint8
	SGID     [16]byte
	DGID     [16]byte
}
