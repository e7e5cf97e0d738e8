package rxetest

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
)

// IGMPMember reports whether netdev dev is a member of the IPv4 group g
// in /proc/net/igmp (rdma_cm joins the group there for RoCE v2, so that
// the IP layer takes the group's packets in).
func IGMPMember(t testing.TB, dev string, g netip.Addr) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/net/igmp")
	if err != nil {
		t.Fatal(err)
	}
	a := g.As4()
	want := fmt.Sprintf("%08X", binary.NativeEndian.Uint32(a[:])) // the __be32 printed as a number
	cur := ""
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if !strings.HasPrefix(l, "\t") && len(f) >= 2 {
			cur = f[1]
			continue
		}
		if cur == dev && f[0] == want {
			return true
		}
	}
	return false
}
