package uverbs

import (
	"net"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestMTU(t *testing.T) {
	for _, tc := range []struct {
		m     MTU
		bytes int
		str   string
	}{
		{MTU256, 256, "256"},
		{MTU512, 512, "512"},
		{MTU1024, 1024, "1024"},
		{MTU2048, 2048, "2048"},
		{MTU4096, 4096, "4096"},
		{0, 0, "MTU(0)"},
		{6, 0, "MTU(6)"},
		{255, 0, "MTU(255)"},
	} {
		if got := tc.m.Bytes(); got != tc.bytes {
			t.Errorf("MTU(%d).Bytes() = %d, want %d", uint8(tc.m), got, tc.bytes)
		}
		if got := tc.m.String(); got != tc.str {
			t.Errorf("MTU(%d).String() = %q, want %q", uint8(tc.m), got, tc.str)
		}
		if tc.bytes == 0 {
			continue
		}
		m, err := MTUFromBytes(tc.bytes)
		if err != nil || m != tc.m {
			t.Errorf("MTUFromBytes(%d) = %v, %v; want %v", tc.bytes, m, err, tc.m)
		}
	}
	// The IB enum values are fixed by the spec (IB_MTU_256 = 1 ... 4096 = 5).
	if MTU256 != 1 || MTU4096 != 5 {
		t.Errorf("MTU enum: 256=%d 4096=%d, want 1 and 5", MTU256, MTU4096)
	}
	for _, n := range []int{0, -1, 128, 255, 257, 1000, 1500, 8192, 9000} {
		m, err := MTUFromBytes(n)
		if err == nil {
			t.Errorf("MTUFromBytes(%d) = %v, want an error", n, m)
			continue
		}
		if !strings.Contains(err.Error(), "256, 512, 1024, 2048 or 4096") {
			t.Errorf("MTUFromBytes(%d): %q does not list the valid values", n, err)
		}
	}
}

func TestPortStateString(t *testing.T) {
	for s, want := range map[PortState]string{
		PortNop: "NOP", PortDown: "DOWN", PortInit: "INIT", PortArmed: "ARMED",
		PortActive: "ACTIVE", PortActiveDefer: "ACTIVE_DEFER", 6: "PortState(6)", 200: "PortState(200)",
	} {
		if got := s.String(); got != want {
			t.Errorf("PortState(%d).String() = %q, want %q", uint8(s), got, want)
		}
	}
	if PortActive != 4 {
		t.Errorf("PortActive = %d, want 4 (IB_PORT_ACTIVE)", PortActive)
	}
}

func gid(index int, addr string, typ GIDType, netdev string) GID {
	return GID{Index: index, GID: net.ParseIP(addr).To16(), Type: typ, Netdev: netdev}
}

func TestChooseGID(t *testing.T) {
	// The real rxe table: sysfs labels every entry "RoCE v2", index 0
	// included. The IPv4-mapped entry must win over the link-local one.
	rxe := []GID{
		gid(0, "fe80::a8e6:9cff:fe4f:1b2c", GIDTypeRoCEv2, "v0"),
		gid(1, "::ffff:10.99.0.1", GIDTypeRoCEv2, "v0"),
	}
	for _, tc := range []struct {
		name    string
		table   []GID
		want    int // index; -1 for an error
		wantErr string
	}{
		{"rxe: link-local at 0, IPv4 at 1", rxe, 1, ""},
		{"IPv4 first", []GID{rxe[1], rxe[0]}, 1, ""},
		{"IPv6 global only", []GID{
			gid(0, "fe80::1", GIDTypeRoCEv2, "eth0"),
			gid(2, "2001:db8::5", GIDTypeRoCEv2, "eth0"),
		}, 2, ""},
		{"IPv4 beats IPv6 global", []GID{
			gid(0, "fe80::1", GIDTypeRoCEv2, "eth0"),
			gid(1, "2001:db8::5", GIDTypeRoCEv2, "eth0"),
			gid(3, "::ffff:192.168.1.7", GIDTypeRoCEv2, "eth0"),
		}, 3, ""},
		{"RoCE v1 IPv4 is not chosen over v2 global", []GID{
			gid(0, "::ffff:192.168.1.7", GIDTypeIB, "eth0"),
			gid(1, "2001:db8::5", GIDTypeRoCEv2, "eth0"),
		}, 1, ""},
		{"link-local only: falls back to the first", []GID{
			gid(0, "fe80::1", GIDTypeRoCEv2, "eth0"),
		}, 0, ""},
		{"InfiniBand only", []GID{
			gid(0, "fe80::248a:703:49:d4f0", GIDTypeIB, ""),
			gid(1, "fec0::248a:703:49:d4f0", GIDTypeIB, ""),
		}, 0, ""},
		{"empty", nil, -1, "GID table is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := ChooseGID(tc.table)
			if tc.want < 0 {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("ChooseGID = %v, %v; want error containing %q", g, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ChooseGID: %v", err)
			}
			if g.Index != tc.want {
				t.Errorf("ChooseGID picked index %d (%s), want %d", g.Index, g.GID, tc.want)
			}
		})
	}
}

func TestGIDIsIPv4(t *testing.T) {
	for addr, want := range map[string]bool{
		"::ffff:10.99.0.1": true,
		"fe80::1":          false,
		"2001:db8::5":      false,
	} {
		if got := gid(0, addr, GIDTypeRoCEv2, "").IsIPv4(); got != want {
			t.Errorf("IsIPv4(%s) = %v, want %v", addr, got, want)
		}
	}
}

func TestParseGID(t *testing.T) {
	ip, err := ParseGID("0000:0000:0000:0000:0000:ffff:0a63:0001")
	if err != nil {
		t.Fatal(err)
	}
	if want := net.ParseIP("::ffff:10.99.0.1").To16(); !cmp.Equal([]byte(ip), []byte(want)) || len(ip) != 16 {
		t.Errorf("ParseGID = %v (%d bytes), want %v in 16 bytes", ip, len(ip), want)
	}
	if _, err := ParseGID("not-a-gid"); err == nil || !strings.Contains(err.Error(), "not-a-gid") {
		t.Errorf("ParseGID(bad) = %v, want an error naming the input", err)
	}
}

func TestGIDIndexes(t *testing.T) {
	if got := gidIndexes(nil); got != "none" {
		t.Errorf("gidIndexes(nil) = %q", got)
	}
	got := gidIndexes([]GID{gid(0, "fe80::1", GIDTypeRoCEv2, ""), gid(1, "::ffff:10.99.0.1", GIDTypeRoCEv2, "")})
	if want := "0=fe80::1, 1=10.99.0.1"; got != want {
		t.Errorf("gidIndexes = %q, want %q", got, want)
	}
}
