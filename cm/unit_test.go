package cm

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
	"golang.org/x/sys/unix"
)

// Pure tests, no device: address encoding and error texts.

func TestSockaddr(t *testing.T) {
	for _, s := range []string{"10.99.0.2:7174", "[fe80::1]:1", "[::ffff:10.0.0.1]:80", "0.0.0.0:0"} {
		a := netip.MustParseAddrPort(s)
		var st ioctl.SockaddrStorage
		n, err := putSockaddr(&st, a)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		want := uint16(unix.SizeofSockaddrInet6)
		if a.Addr().Is4() {
			want = unix.SizeofSockaddrInet4
		}
		if n != want {
			t.Errorf("%s: size %d, want %d", s, n, want)
		}
		b := (*[128]byte)(unsafe.Pointer(&st))
		got := sockaddr(b[:])
		if got.Addr() != a.Addr().Unmap() || got.Port() != a.Port() {
			t.Errorf("%s: round trip gave %v", s, got)
		}
	}
	var st ioctl.SockaddrStorage
	if _, err := putSockaddr(&st, netip.AddrPort{}); err == nil {
		t.Error("the zero AddrPort encoded")
	}
	if _, err := putSockaddr(&st, netip.MustParseAddrPort("[fe80::1%eth0]:1")); err == nil {
		t.Error("an address with a zone encoded")
	}
}

func TestEventError(t *testing.T) {
	for _, c := range []struct {
		ev   Event
		is   []error
		not  []error
		text string
	}{
		{Event{Type: Rejected, Status: RejectConsumerDefined, PrivateData: append([]byte("no"), make([]byte, 50)...)},
			[]error{ErrRejected}, []error{ErrConnRefused, ErrAddress}, `connect: rejected with reason 28 (consumer defined: the peer rejected), private data "no"`},
		{Event{Type: Rejected, Status: RejectInvalidServiceID}, []error{ErrRejected, ErrConnRefused}, nil, "reason 8 (invalid service ID"},
		{Event{Type: AddrError, Status: -int32(unix.ETIMEDOUT)}, []error{ErrAddress, unix.ETIMEDOUT}, []error{ErrRoute}, "address error: connection timed out"},
		{Event{Type: RouteError, Status: -int32(unix.ETIMEDOUT)}, []error{ErrRoute}, nil, "route error"},
		{Event{Type: Unreachable, Status: -int32(unix.ETIMEDOUT)}, []error{ErrUnreachable}, nil, "peer unreachable"},
		{Event{Type: Disconnected}, []error{ErrDisconnected}, nil, "peer disconnected"},
		{Event{Type: MulticastError, Status: -int32(unix.ENETUNREACH)}, []error{ErrMulticast, unix.ENETUNREACH}, []error{ErrConnect}, "multicast error: network is unreachable"},
	} {
		err := error(&EventError{Op: "connect", Event: c.ev})
		if !strings.Contains(err.Error(), c.text) {
			t.Errorf("%v: %q, want %q in it", c.ev, err, c.text)
		}
		for _, e := range c.is {
			if !errors.Is(err, e) {
				t.Errorf("%q is not %v", err, e)
			}
		}
		for _, e := range c.not {
			if errors.Is(err, e) {
				t.Errorf("%q is %v", err, e)
			}
		}
	}
	if s := EventType(99).String(); s != "EVENT_99" {
		t.Errorf("EventType(99) = %q", s)
	}
}
