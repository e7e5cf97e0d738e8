package uverbs

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeSysfs builds, under a temporary directory, the part of sysfs that
// discovery reads, and points sysfsRoot at it for the test. Class entries
// are symlinks into devices/, as in the real sysfs.
type fakeSysfs struct {
	t    *testing.T
	root string
}

func newFakeSysfs(t *testing.T) *fakeSysfs {
	t.Helper()
	root := t.TempDir()
	old := sysfsRoot
	sysfsRoot = root
	t.Cleanup(func() { sysfsRoot = old })
	return &fakeSysfs{t: t, root: root}
}

func (f *fakeSysfs) file(path, content string) {
	f.t.Helper()
	p := filepath.Join(f.root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content+"\n"), 0o444); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeSysfs) symlink(target, path string) {
	f.t.Helper()
	p := filepath.Join(f.root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		f.t.Fatal(err)
	}
}

const zeroGIDText = "0000:0000:0000:0000:0000:0000:0000:0000"

type fakePort struct {
	num                          string
	state, phys, linkLayer, rate string
	gids                         []string // by index; zeroGIDText for empty entries
	types, ndevs                 []string
}

// device adds an RDMA device named ibdev with a uverbs node uv. Its device
// directory lives under devices/virtual/infiniband (software devices) and
// class/infiniband/<ibdev> links to it.
func (f *fakeSysfs) device(ibdev, uv, abi, nodeGUID, nodeType, fw, parent string, ports ...fakePort) string {
	devDir := filepath.Join("devices/virtual/infiniband", ibdev)
	f.symlink(filepath.Join("../../", devDir), filepath.Join("class/infiniband", ibdev))
	f.file(filepath.Join(devDir, "node_guid"), nodeGUID)
	f.file(filepath.Join(devDir, "sys_image_guid"), nodeGUID)
	f.file(filepath.Join(devDir, "node_type"), nodeType)
	f.file(filepath.Join(devDir, "fw_ver"), fw)
	if parent != "" {
		f.file(filepath.Join(devDir, "parent"), parent)
	}
	f.file(filepath.Join(devDir, "node_desc"), ibdev)
	for _, p := range ports {
		pd := filepath.Join(devDir, "ports", p.num)
		f.file(filepath.Join(pd, "state"), p.state)
		f.file(filepath.Join(pd, "phys_state"), p.phys)
		f.file(filepath.Join(pd, "link_layer"), p.linkLayer)
		f.file(filepath.Join(pd, "rate"), p.rate)
		f.file(filepath.Join(pd, "lid"), "0x0")
		for i, g := range p.gids {
			n := strconv.Itoa(i)
			f.file(filepath.Join(pd, "gids", n), g)
			if i < len(p.types) {
				f.file(filepath.Join(pd, "gid_attrs/types", n), p.types[i])
			}
			if i < len(p.ndevs) {
				f.file(filepath.Join(pd, "gid_attrs/ndevs", n), p.ndevs[i])
			}
		}
		f.file(filepath.Join(pd, "pkeys/0"), "0xffff")
	}
	uvDir := filepath.Join("devices/virtual/infiniband_verbs", uv)
	f.symlink(filepath.Join("../../", uvDir), filepath.Join("class/infiniband_verbs", uv))
	f.file(filepath.Join(uvDir, "ibdev"), ibdev)
	f.file(filepath.Join(uvDir, "abi_version"), abi)
	f.file(filepath.Join(uvDir, "dev"), "231:"+strings.TrimPrefix(uv, "uverbs"))
	return devDir
}

// rxePort is port 1 of a Soft-RoCE device on netdev nd with IPv4 address
// ipHex (as sysfs prints it), like rxe0 on the test VM: index 0 the
// link-local GID, index 1 the IPv4-mapped one, both labelled "RoCE v2",
// the rest of the table empty.
func rxePort(nd, linkLocal, ipHex string) fakePort {
	return fakePort{
		num: "1", state: "4: ACTIVE", phys: "5: LinkUp", linkLayer: "Ethernet", rate: "10 Gb/sec (1X QDR)",
		gids:  []string{linkLocal, "0000:0000:0000:0000:0000:ffff:" + ipHex, zeroGIDText, zeroGIDText, zeroGIDText, zeroGIDText, zeroGIDText, zeroGIDText, zeroGIDText, zeroGIDText, zeroGIDText},
		types: []string{"RoCE v2", "RoCE v2"},
		ndevs: []string{nd, nd},
	}
}

func buildRealistic(t *testing.T) *fakeSysfs {
	f := newFakeSysfs(t)
	f.file("class/infiniband_verbs/abi_version", "6")
	f.device("rxe1", "uverbs1", "2", "a8e6:9cff:fe4f:1b2d", "1: CA", "", "v1",
		rxePort("v1", "fe80:0000:0000:0000:a8e6:9cff:fe4f:1b2d", "0a63:0002"))
	f.device("rxe0", "uverbs0", "2", "a8e6:9cff:fe4f:1b2c", "1: CA", "", "v0",
		rxePort("v0", "fe80:0000:0000:0000:a8e6:9cff:fe4f:1b2c", "0a63:0001"))
	// A hardware InfiniBand HCA: the driver comes from device/driver.
	ib := fakePort{
		num: "1", state: "4: ACTIVE", phys: "5: LinkUp", linkLayer: "InfiniBand", rate: "100 Gb/sec (4X EDR)",
		gids:  []string{"fe80:0000:0000:0000:248a:0703:0049:d4f0", zeroGIDText},
		types: []string{"IB/RoCE v1"},
	}
	down := fakePort{num: "2", state: "1: DOWN", phys: "3: Disabled", linkLayer: "InfiniBand", rate: "10 Gb/sec (4X SDR)",
		gids: []string{zeroGIDText}}
	dir := f.device("mlx5_0", "uverbs2", "1", "248a:0703:0049:d4f0", "1: CA", "16.35.2000", "", down, ib)
	f.file("devices/pci0000:00/0000:00:02.0/0000:03:00.0/vendor", "0x15b3")
	f.file("bus/pci/drivers/mlx5_core/module/refcnt", "1")
	f.symlink("../../../../devices/pci0000:00/0000:00:02.0/0000:03:00.0", filepath.Join(dir, "device"))
	f.symlink("../../../../bus/pci/drivers/mlx5_core", "devices/pci0000:00/0000:00:02.0/0000:03:00.0/driver")
	if _, err := os.Stat(filepath.Join(f.root, "class/infiniband/mlx5_0/device/driver/module/refcnt")); err != nil {
		t.Fatalf("fake sysfs links do not resolve: %v", err)
	}
	// A uverbs node whose ibdev is unreadable (device going away) is skipped.
	if err := os.MkdirAll(filepath.Join(f.root, "class/infiniband_verbs/uverbs7"), 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

func ip(s string) net.IP { return net.ParseIP(s).To16() }

func wantRxe(n int) DeviceInfo {
	nd := "v" + strconv.Itoa(n)
	guid := "a8e6:9cff:fe4f:1b2" + string(rune('c'+n))
	return DeviceInfo{
		Name: "rxe" + strconv.Itoa(n), Driver: "rxe", NodeGUID: guid, SysImageGUID: guid, NodeType: "CA",
		Parent: nd, Uverbs: "uverbs" + strconv.Itoa(n), DevPath: "/dev/infiniband/uverbs" + strconv.Itoa(n), ABIVersion: 2,
		Ports: []PortInfo{{
			Num: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: "Ethernet", Rate: "10 Gb/sec (1X QDR)",
			GIDs: []GID{
				{Index: 0, GID: ip("fe80::a8e6:9cff:fe4f:1b2" + string(rune('c'+n))), Type: GIDTypeRoCEv2, Netdev: nd},
				{Index: 1, GID: ip("::ffff:10.99.0." + strconv.Itoa(n+1)), Type: GIDTypeRoCEv2, Netdev: nd},
			},
		}},
	}
}

func TestListRealistic(t *testing.T) {
	buildRealistic(t)
	devs, err := List()
	if err != nil {
		t.Fatal(err)
	}
	want := []DeviceInfo{
		{
			Name: "mlx5_0", Driver: "mlx5_core", NodeGUID: "248a:0703:0049:d4f0", SysImageGUID: "248a:0703:0049:d4f0",
			NodeType: "CA", FWVersion: "16.35.2000", Uverbs: "uverbs2", DevPath: "/dev/infiniband/uverbs2", ABIVersion: 1,
			Ports: []PortInfo{
				{Num: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: "InfiniBand", Rate: "100 Gb/sec (4X EDR)",
					GIDs: []GID{{Index: 0, GID: ip("fe80::248a:703:49:d4f0"), Type: GIDTypeIB}}},
				{Num: 2, State: "DOWN", PhysState: "Disabled", LinkLayer: "InfiniBand", Rate: "10 Gb/sec (4X SDR)"},
			},
		},
		wantRxe(0),
		wantRxe(1),
	}
	if diff := cmp.Diff(want, devs); diff != "" {
		t.Errorf("List() mismatch (-want +got):\n%s", diff)
	}
	for _, d := range devs {
		for _, p := range d.Ports {
			for _, g := range p.GIDs {
				if g.GID.Equal(net.IPv6unspecified) {
					t.Errorf("%s port %d: zero GID at index %d not skipped", d.Name, p.Num, g.Index)
				}
				if len(g.GID) != 16 {
					t.Errorf("%s port %d index %d: GID of %d bytes, want 16", d.Name, p.Num, g.Index, len(g.GID))
				}
			}
		}
	}
}

func TestLookup(t *testing.T) {
	buildRealistic(t)
	d, err := Lookup("rxe0")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantRxe(0), d); diff != "" {
		t.Errorf("Lookup(rxe0) mismatch (-want +got):\n%s", diff)
	}
	if p := d.Port(1); p == nil || p.Num != 1 {
		t.Errorf("Port(1) = %v", p)
	}
	if p := d.Port(2); p != nil {
		t.Errorf("Port(2) = %v, want nil", p)
	}
	// The chosen GID of the real rxe table is the IPv4 one at index 1.
	g, err := ChooseGID(d.Port(1).GIDs)
	if err != nil || g.Index != 1 || !g.GID.Equal(net.ParseIP("10.99.0.1")) {
		t.Errorf("ChooseGID(rxe0 port 1) = %+v, %v; want index 1 (::ffff:10.99.0.1)", g, err)
	}

	_, err = Lookup("mlx9_9")
	if !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Lookup(unknown) = %v, want ErrNoDevice", err)
	}
	if want := `uverbs: device "mlx9_9": no such RDMA device (have mlx5_0, rxe0, rxe1)`; err.Error() != want {
		t.Errorf("Lookup(unknown) error:\n got %q\nwant %q", err, want)
	}
}

// TestWithoutGIDs: ListWithoutGIDs and LookupWithoutGIDs give what List
// and Lookup give, with every port's GIDs nil (the fake tables are
// populated, so a GID read shows as a difference).
func TestWithoutGIDs(t *testing.T) {
	buildRealistic(t)
	full, err := List()
	if err != nil {
		t.Fatal(err)
	}
	if len(full) != 3 || len(full[2].Ports[0].GIDs) == 0 {
		t.Fatalf("the fake sysfs should have 3 devices with GIDs: %+v", full)
	}
	for i := range full {
		for k := range full[i].Ports {
			full[i].Ports[k].GIDs = nil
		}
	}
	brief, err := ListWithoutGIDs()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(full, brief); diff != "" {
		t.Errorf("ListWithoutGIDs() mismatch (-List without GIDs +got):\n%s", diff)
	}
	d, err := LookupWithoutGIDs("rxe1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(full[2], d); diff != "" {
		t.Errorf("LookupWithoutGIDs(rxe1) mismatch (-want +got):\n%s", diff)
	}
	if _, err := LookupWithoutGIDs("mlx9_9"); !errors.Is(err, ErrNoDevice) {
		t.Errorf("LookupWithoutGIDs(unknown) = %v, want ErrNoDevice", err)
	}
}

func TestListNoRDMA(t *testing.T) {
	newFakeSysfs(t) // an empty /sys: no class/infiniband_verbs at all
	devs, err := List()
	if err != nil || len(devs) != 0 {
		t.Errorf("List() on a host without RDMA = %v, %v; want none and no error", devs, err)
	}
	_, err = Lookup("rxe0")
	if !errors.Is(err, ErrNoDevice) || !strings.Contains(err.Error(), "no RDMA device with a uverbs node") {
		t.Errorf("Lookup on a host without RDMA = %v", err)
	}
}

func TestListUnreadable(t *testing.T) {
	f := newFakeSysfs(t)
	// class/infiniband_verbs is a file, not a directory: an error, not "no devices".
	f.file("class/infiniband_verbs", "")
	if _, err := List(); err == nil || !strings.Contains(err.Error(), "list devices") {
		t.Errorf("List() with an unreadable class dir = %v, want an error", err)
	}
}

func TestStateName(t *testing.T) {
	for in, want := range map[string]string{
		"4: ACTIVE": "ACTIVE", "1: DOWN": "DOWN", "5: LinkUp": "LinkUp", "1: CA": "CA", "ACTIVE": "ACTIVE", "": "",
	} {
		if got := stateName(in); got != want {
			t.Errorf("stateName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDriverName(t *testing.T) {
	f := newFakeSysfs(t)
	for _, tc := range []struct{ ibdev, parent, want string }{
		{"rxe0", "v0", "rxe"},
		{"siw0", "eth0", "siw"},
		{"roce_a", "eth0", "rxe"}, // a renamed software device with a netdev parent
		{"mystery0", "", ""},
	} {
		if got := driverName(filepath.Join(f.root, "class/infiniband", tc.ibdev), tc.ibdev, tc.parent); got != tc.want {
			t.Errorf("driverName(%s, parent %q) = %q, want %q", tc.ibdev, tc.parent, got, tc.want)
		}
	}
}
