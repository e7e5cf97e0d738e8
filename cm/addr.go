package cm

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
	"golang.org/x/sys/unix"
)

// putSockaddr encodes a as a struct sockaddr_in or sockaddr_in6 into s and
// returns its size (what rdma_addr_size gives the kernel).
func putSockaddr(s *ioctl.SockaddrStorage, a netip.AddrPort) (uint16, error) {
	b := (*[unsafe.Sizeof(ioctl.SockaddrStorage{})]byte)(unsafe.Pointer(s))
	clear(b[:])
	ip := a.Addr()
	switch {
	case !ip.IsValid():
		return 0, fmt.Errorf("invalid address")
	case ip.Is4():
		binary.NativeEndian.PutUint16(b[0:], unix.AF_INET)
		binary.BigEndian.PutUint16(b[2:], a.Port())
		v := ip.As4()
		copy(b[4:8], v[:])
		return unix.SizeofSockaddrInet4, nil
	default:
		binary.NativeEndian.PutUint16(b[0:], unix.AF_INET6)
		binary.BigEndian.PutUint16(b[2:], a.Port())
		v := ip.As16()
		copy(b[8:24], v[:])
		if z := ip.Zone(); z != "" {
			return 0, fmt.Errorf("address %v: zones are not supported", a)
		}
		return unix.SizeofSockaddrInet6, nil
	}
}

// sockaddr decodes a sockaddr_in or sockaddr_in6 from b.
func sockaddr(b []byte) netip.AddrPort {
	if len(b) < 16 {
		return netip.AddrPort{}
	}
	port := binary.BigEndian.Uint16(b[2:])
	switch binary.NativeEndian.Uint16(b[0:]) {
	case unix.AF_INET:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port)
	case unix.AF_INET6:
		if len(b) < 24 {
			return netip.AddrPort{}
		}
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])).Unmap(), port)
	}
	return netip.AddrPort{}
}
