package uvobj

import (
	"testing"
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
)

// destroy sends one request layout for several legacy commands; this holds
// the generated types of each command to the layout it gets.
func TestDestroyLayouts(t *testing.T) {
	withResp := unsafe.Sizeof(ioctl.DestroyCQ{})
	respOff, handleOff := unsafe.Offsetof(ioctl.DestroyCQ{}.Response), unsafe.Offsetof(ioctl.DestroyCQ{}.Handle)
	plain := unsafe.Sizeof(ioctl.DeallocPD{})
	for _, c := range []struct {
		v              *destroyVerb
		size, respSize uintptr // the command's own request and response types
		resp, handle   uintptr // offsets in its request (resp: withResp only)
	}{
		{&destroyCQ, unsafe.Sizeof(ioctl.DestroyCQ{}), unsafe.Sizeof(ioctl.DestroyCQResp{}), respOff, handleOff},
		{&destroyQP, unsafe.Sizeof(ioctl.DestroyQP{}), unsafe.Sizeof(ioctl.DestroyQPResp{}),
			unsafe.Offsetof(ioctl.DestroyQP{}.Response), unsafe.Offsetof(ioctl.DestroyQP{}.Handle)},
		{&destroySRQ, unsafe.Sizeof(ioctl.DestroySRQ{}), unsafe.Sizeof(ioctl.DestroySRQResp{}),
			unsafe.Offsetof(ioctl.DestroySRQ{}.Response), unsafe.Offsetof(ioctl.DestroySRQ{}.Handle)},
		{&deregMR, unsafe.Sizeof(ioctl.DeregMR{}), 0, 0, unsafe.Offsetof(ioctl.DeregMR{}.Handle)},
		{&deallocMW, unsafe.Sizeof(ioctl.DeallocMW{}), 0, 0, unsafe.Offsetof(ioctl.DeallocMW{}.Handle)},
		{&deallocPD, unsafe.Sizeof(ioctl.DeallocPD{}), 0, 0, unsafe.Offsetof(ioctl.DeallocPD{}.Handle)},
		{&destroyAH, unsafe.Sizeof(ioctl.DestroyAH{}), 0, 0, unsafe.Offsetof(ioctl.DestroyAH{}.Handle)},
	} {
		if c.v.respLen > 0 {
			if c.size != withResp || c.resp != respOff || c.handle != handleOff {
				t.Errorf("%s: request of %d bytes, response at %d, handle at %d; destroy sends DESTROY_CQ's (%d, %d, %d)",
					c.v.op, c.size, c.resp, c.handle, withResp, respOff, handleOff)
			}
			if uintptr(c.v.respLen) != c.respSize || c.respSize > unsafe.Sizeof(destroyResp{}) {
				t.Errorf("%s: response of %d bytes, verb says %d, room for %d", c.v.op, c.respSize, c.v.respLen, unsafe.Sizeof(destroyResp{}))
			}
			continue
		}
		if c.size != plain || c.handle != 0 {
			t.Errorf("%s: request of %d bytes, handle at %d; destroy sends DEALLOC_PD's (%d, 0)", c.v.op, c.size, c.handle, plain)
		}
	}
}
