package mr

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/goverbs/goverbs/uverbs"
	"golang.org/x/sys/unix"
)

// TestMRSGELarge checks MR.SGE's range arithmetic on a region of 5 GiB
// without a device: the MR is built by hand over address space reserved
// (PROT_NONE, no memory behind it), which SGE never touches.
func TestMRSGELarge(t *testing.T) {
	buf, err := unix.Mmap(-1, 0, 5<<30, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		t.Skipf("reserving 5 GiB of address space: %v", err)
	}
	t.Cleanup(func() { unix.Munmap(buf) })
	m := &MR{pd: new(uverbs.PD), buf: buf, lkey: 0x55}
	base := m.addr()
	for _, c := range []struct{ off, n int }{
		{0, math.MaxUint32},
		{1 << 30, math.MaxUint32},
		{4 << 30, 1 << 30},
		{5<<30 - 1, 1},
		{5 << 30, 0},
	} {
		g, err := m.SGE(c.off, c.n)
		if err != nil || g.Addr != base+uint64(c.off) || g.Length != uint32(c.n) || g.LKey != 0x55 {
			t.Errorf("SGE(%d, %d) = %+v, %v", c.off, c.n, g, err)
		}
	}
	for _, c := range []struct{ off, n int }{
		{0, 4 << 30},
		{1, 4 << 30},
		{0, 5 << 30},
	} {
		want := fmt.Sprintf("SGE of %d bytes: an SGE's length is 32 bits", c.n)
		if g, err := m.SGE(c.off, c.n); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("SGE(%d, %d) = %+v, %v; want an error containing %q", c.off, c.n, g, err, want)
		}
	}
	if _, err := m.SGE(1, 5<<30); err == nil || !strings.Contains(err.Error(), "outside the 5368709120-byte region") {
		t.Errorf("SGE(1, 5 GiB) = %v, want outside the region", err)
	}
}
