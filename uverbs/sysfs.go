package uverbs

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// SysfsRoot is where device discovery looks; tests may point it elsewhere.
var sysfsRoot = "/sys"

// GIDType is the type of a GID table entry.
type GIDType string

// GID types as sysfs names them.
const (
	GIDTypeIB     GIDType = "IB/RoCE v1"
	GIDTypeRoCEv2 GIDType = "RoCE v2"
)

// GID is one entry of a port's GID table.
type GID struct {
	Index  int
	GID    net.IP // 16 bytes
	Type   GIDType
	Netdev string
}

// IsIPv4 reports whether the GID is an IPv4-mapped address (::ffff:a.b.c.d).
func (g GID) IsIPv4() bool { return g.GID.To4() != nil }

// PortInfo is what sysfs tells of a port.
type PortInfo struct {
	Num       int
	State     string // "ACTIVE", "DOWN", ...
	PhysState string // "LINK_UP", ...
	LinkLayer string // "Ethernet" or "InfiniBand"
	Rate      string
	GIDs      []GID
}

// DeviceInfo is what sysfs tells of an RDMA device.
type DeviceInfo struct {
	Name         string // ibdev name, e.g. "rxe0"
	Driver       string // "rxe", "siw", "mlx5_core", ...
	NodeGUID     string
	SysImageGUID string
	NodeType     string
	FWVersion    string
	Parent       string // the netdev under a software device
	Uverbs       string // "uverbs0"
	DevPath      string // "/dev/infiniband/uverbs0"
	ABIVersion   int    // the driver's uverbs ABI version
	Ports        []PortInfo
}

// Port returns the port numbered n, or nil.
func (d *DeviceInfo) Port(n int) *PortInfo {
	if d == nil {
		return nil
	}
	for i := range d.Ports {
		if d.Ports[i].Num == n {
			return &d.Ports[i]
		}
	}
	return nil
}

// ErrNoDevice is returned when no RDMA device (or none of the given name)
// exists.
var ErrNoDevice = errors.New("no such RDMA device")

func readAttr(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// stateName turns sysfs "4: ACTIVE" into "ACTIVE".
func stateName(s string) string {
	if _, after, ok := strings.Cut(s, ": "); ok {
		return after
	}
	return s
}

// List returns the RDMA devices that have a uverbs character device,
// sorted by name, with every port's GID table.
func List() ([]DeviceInfo, error) { return list(true) }

// ListWithoutGIDs is List without the GID tables (every PortInfo.GIDs is
// nil): what picking a device by name or port state needs. A GID table is
// one sysfs file per index, 1024 on rxe; once a device is open,
// Context.GIDs reads its table with one ioctl.
func ListWithoutGIDs() ([]DeviceInfo, error) { return list(false) }

func list(withGIDs bool) ([]DeviceInfo, error) {
	dir := filepath.Join(sysfsRoot, "class/infiniband_verbs")
	ents, err := os.ReadDir(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("uverbs: list devices: %w", err)
	}
	var devs []DeviceInfo
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "uverbs") {
			continue
		}
		ibdev := readAttr(filepath.Join(dir, e.Name(), "ibdev"))
		if ibdev == "" {
			continue
		}
		d, err := describe(ibdev, e.Name(), withGIDs)
		if err != nil {
			return nil, err
		}
		devs = append(devs, d)
	}
	sort.Slice(devs, func(i, j int) bool { return devs[i].Name < devs[j].Name })
	return devs, nil
}

// Lookup returns the device of the given name. It reads only that
// device's part of sysfs.
func Lookup(name string) (DeviceInfo, error) { return lookup(name, true) }

// LookupWithoutGIDs is Lookup without the GID tables, as ListWithoutGIDs.
func LookupWithoutGIDs(name string) (DeviceInfo, error) { return lookup(name, false) }

func lookup(name string, withGIDs bool) (DeviceInfo, error) {
	dir := filepath.Join(sysfsRoot, "class/infiniband_verbs")
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return DeviceInfo{}, fmt.Errorf("uverbs: list devices: %w", err)
	}
	var names []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "uverbs") {
			continue
		}
		ibdev := readAttr(filepath.Join(dir, e.Name(), "ibdev"))
		if ibdev == name && name != "" {
			return describe(ibdev, e.Name(), withGIDs)
		}
		if ibdev != "" {
			names = append(names, ibdev)
		}
	}
	if len(names) == 0 {
		return DeviceInfo{}, fmt.Errorf("uverbs: device %q: %w (this host has no RDMA device with a uverbs node)", name, ErrNoDevice)
	}
	sort.Strings(names)
	return DeviceInfo{}, fmt.Errorf("uverbs: device %q: %w (have %s)", name, ErrNoDevice, strings.Join(names, ", "))
}

func describe(ibdev, uv string, withGIDs bool) (DeviceInfo, error) {
	base := filepath.Join(sysfsRoot, "class/infiniband", ibdev)
	d := DeviceInfo{
		Name:         ibdev,
		NodeGUID:     readAttr(filepath.Join(base, "node_guid")),
		SysImageGUID: readAttr(filepath.Join(base, "sys_image_guid")),
		NodeType:     stateName(readAttr(filepath.Join(base, "node_type"))),
		FWVersion:    readAttr(filepath.Join(base, "fw_ver")),
		Parent:       readAttr(filepath.Join(base, "parent")),
		Uverbs:       uv,
		DevPath:      "/dev/infiniband/" + uv,
	}
	d.ABIVersion, _ = strconv.Atoi(readAttr(filepath.Join(sysfsRoot, "class/infiniband_verbs", uv, "abi_version")))
	d.Driver = driverName(base, ibdev, d.Parent)
	ports, _ := os.ReadDir(filepath.Join(base, "ports"))
	for _, p := range ports {
		n, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		pd := filepath.Join(base, "ports", p.Name())
		pi := PortInfo{
			Num:       n,
			State:     stateName(readAttr(filepath.Join(pd, "state"))),
			PhysState: stateName(readAttr(filepath.Join(pd, "phys_state"))),
			LinkLayer: readAttr(filepath.Join(pd, "link_layer")),
			Rate:      readAttr(filepath.Join(pd, "rate")),
		}
		if withGIDs {
			pi.GIDs = readGIDs(pd)
		}
		d.Ports = append(d.Ports, pi)
	}
	sort.Slice(d.Ports, func(i, j int) bool { return d.Ports[i].Num < d.Ports[j].Num })
	return d, nil
}

// driverName finds the kernel driver: the bound driver of the parent device
// for hardware, the software driver otherwise (rxe and siw devices have a
// netdev parent and no bus device).
func driverName(base, ibdev, parent string) string {
	if l, err := os.Readlink(filepath.Join(base, "device/driver")); err == nil {
		return filepath.Base(l)
	}
	for _, sw := range []string{"rxe", "siw"} {
		if strings.HasPrefix(ibdev, sw) {
			return sw
		}
	}
	if parent != "" {
		return "rxe"
	}
	return ""
}

var zeroGID = make(net.IP, 16)

func readGIDs(pd string) []GID {
	ents, _ := os.ReadDir(filepath.Join(pd, "gids"))
	var gids []GID
	for _, e := range ents {
		i, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ip := net.ParseIP(readAttr(filepath.Join(pd, "gids", e.Name())))
		if ip == nil || ip.Equal(zeroGID) {
			continue
		}
		gids = append(gids, GID{
			Index:  i,
			GID:    ip.To16(),
			Type:   GIDType(readAttr(filepath.Join(pd, "gid_attrs/types", e.Name()))),
			Netdev: readAttr(filepath.Join(pd, "gid_attrs/ndevs", e.Name())),
		})
	}
	sort.Slice(gids, func(a, b int) bool { return gids[a].Index < gids[b].Index })
	return gids
}
