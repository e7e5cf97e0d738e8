package uverbs

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
)

// DeviceAttr holds the device limits the kernel reports (QUERY_DEVICE).
type DeviceAttr struct {
	FWVersion       uint64
	NodeGUID        uint64
	SysImageGUID    uint64
	MaxMRSize       uint64
	PageSizeCap     uint64
	VendorID        uint32
	VendorPartID    uint32
	HWVersion       uint32
	MaxQP           uint32
	MaxQPWR         uint32
	DeviceCapFlags  uint32
	MaxSGE          uint32
	MaxSGERd        uint32
	MaxCQ           uint32
	MaxCQE          uint32
	MaxMR           uint32
	MaxMW           uint32
	MaxPD           uint32
	MaxQPRdAtom     uint32
	MaxQPInitRdAtom uint32
	MaxResRdAtom    uint32
	AtomicCap       uint32
	MaxAH           uint32
	MaxSRQ          uint32
	MaxSRQWR        uint32
	MaxSRQSGE       uint32
	MaxPKeys        uint16
	LocalCAAckDelay uint8
	PhysPortCnt     uint8
}

func (c *Context) queryDevice() (DeviceAttr, error) {
	var req ioctl.QueryDevice
	var r ioctl.QueryDeviceResp
	err := c.file.Write(&ioctl.Cmd{
		Command: ioctl.IB_USER_VERBS_CMD_QUERY_DEVICE,
		In:      unsafe.Pointer(&req), InLen: ioctl.SizeofQueryDevice,
		Out: unsafe.Pointer(&r), OutLen: ioctl.SizeofQueryDeviceResp,
	}, "QUERY_DEVICE")
	if err != nil {
		return DeviceAttr{}, err
	}
	return DeviceAttr{
		FWVersion: r.Fw_ver, NodeGUID: r.Node_guid, SysImageGUID: r.Sys_image_guid,
		MaxMRSize: r.Max_mr_size, PageSizeCap: r.Page_size_cap, VendorID: r.Vendor_id,
		VendorPartID: r.Vendor_part_id, HWVersion: r.Hw_ver, MaxQP: r.Max_qp, MaxQPWR: r.Max_qp_wr,
		DeviceCapFlags: r.Device_cap_flags, MaxSGE: r.Max_sge, MaxSGERd: r.Max_sge_rd,
		MaxCQ: r.Max_cq, MaxCQE: r.Max_cqe, MaxMR: r.Max_mr, MaxMW: r.Max_mw, MaxPD: r.Max_pd,
		MaxQPRdAtom: r.Max_qp_rd_atom, MaxQPInitRdAtom: r.Max_qp_init_rd_atom,
		MaxResRdAtom: r.Max_res_rd_atom, AtomicCap: r.Atomic_cap, MaxAH: r.Max_ah,
		MaxSRQ: r.Max_srq, MaxSRQWR: r.Max_srq_wr, MaxSRQSGE: r.Max_srq_sge,
		MaxPKeys: r.Max_pkeys, LocalCAAckDelay: r.Local_ca_ack_delay, PhysPortCnt: r.Phys_port_cnt,
	}, nil
}

// QueryDevice asks the kernel for the device attributes again.
func (c *Context) QueryDevice() (DeviceAttr, error) {
	if c.bad() {
		return DeviceAttr{}, errNilContext
	}
	if c.IsClosed() {
		return DeviceAttr{}, ErrClosed
	}
	a, err := c.queryDevice()
	if err != nil {
		return a, fmt.Errorf("uverbs: %s: query device: %w", c.info.Name, err)
	}
	return a, nil
}

// PortState is a port's logical state (IB_PORT_*).
type PortState uint8

// Port states.
const (
	PortNop PortState = iota
	PortDown
	PortInit
	PortArmed
	PortActive
	PortActiveDefer
)

func (s PortState) String() string {
	names := [...]string{"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"}
	if int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("PortState(%d)", uint8(s))
}

// MTU is an IB path MTU enum value (IB_MTU_*).
type MTU uint8

// Path MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes, or 0 for an invalid value.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

func (m MTU) String() string {
	if b := m.Bytes(); b != 0 {
		return fmt.Sprint(b)
	}
	return fmt.Sprintf("MTU(%d)", uint8(m))
}

// MTUFromBytes converts 256..4096 to the enum value.
func MTUFromBytes(n int) (MTU, error) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, nil
		}
	}
	return 0, fmt.Errorf("uverbs: MTU %d: want 256, 512, 1024, 2048 or 4096", n)
}

// PortAttr holds a port's attributes (QUERY_PORT).
type PortAttr struct {
	State        PortState
	MaxMTU       MTU
	ActiveMTU    MTU
	GIDTableLen  uint32
	PortCapFlags uint32
	MaxMsgSize   uint32
	PKeyTableLen uint16
	LID          uint16
	SMLID        uint16
	LMC          uint8
	MaxVLNum     uint8
	ActiveWidth  uint8
	ActiveSpeed  uint8
	PhysState    uint8
	LinkLayer    uint8 // IB_LINK_LAYER_*: 1 InfiniBand, 2 Ethernet
}

func (c *Context) checkPort(port int) error {
	if port < 1 || port > int(c.attr.PhysPortCnt) {
		return fmt.Errorf("uverbs: %s: port %d out of range: the device has ports 1..%d", c.info.Name, port, c.attr.PhysPortCnt)
	}
	return nil
}

// QueryPort asks the kernel for a port's attributes. Ports count from 1.
func (c *Context) QueryPort(port int) (PortAttr, error) {
	if c.bad() {
		return PortAttr{}, errNilContext
	}
	if c.IsClosed() {
		return PortAttr{}, ErrClosed
	}
	if err := c.checkPort(port); err != nil {
		return PortAttr{}, err
	}
	var r ioctl.QueryPortRespEx
	err := c.file.Either(func() error {
		var call ioctl.Call
		call.Reset(ioctl.UVERBS_OBJECT_DEVICE, ioctl.UVERBS_METHOD_QUERY_PORT, c.file.DriverID())
		call.InConst(ioctl.UVERBS_ATTR_QUERY_PORT_PORT_NUM, uint64(port))
		call.Out(ioctl.UVERBS_ATTR_QUERY_PORT_RESP, unsafe.Pointer(&r), ioctl.SizeofQueryPortRespEx, ioctl.AttrMandatory)
		return c.file.Do(&call, "QUERY_PORT")
	}, func() error {
		req := ioctl.QueryPort{Num: uint8(port)}
		return c.file.Write(&ioctl.Cmd{
			Command: ioctl.IB_USER_VERBS_CMD_QUERY_PORT,
			In:      unsafe.Pointer(&req), InLen: ioctl.SizeofQueryPort,
			Out: unsafe.Pointer(&r.Legacy_resp), OutLen: ioctl.SizeofQueryPortResp,
		}, "QUERY_PORT")
	})
	if err != nil {
		return PortAttr{}, fmt.Errorf("uverbs: %s: query port %d: %w", c.info.Name, port, err)
	}
	l := &r.Legacy_resp
	return PortAttr{
		State: PortState(l.State), MaxMTU: MTU(l.Max_mtu), ActiveMTU: MTU(l.Active_mtu),
		GIDTableLen: l.Gid_tbl_len, PortCapFlags: l.Port_cap_flags, MaxMsgSize: l.Max_msg_sz,
		PKeyTableLen: l.Pkey_tbl_len, LID: l.Lid, SMLID: l.Sm_lid, LMC: l.Lmc, MaxVLNum: l.Max_vl_num,
		ActiveWidth: l.Active_width, ActiveSpeed: l.Active_speed, PhysState: l.Phys_state, LinkLayer: l.Link_layer,
	}, nil
}

// GIDs returns the port's populated GID table entries. It asks the kernel
// (QUERY_GID_TABLE, one ioctl) and reads sysfs on kernels without that method.
func (c *Context) GIDs(port int) ([]GID, error) {
	if c.bad() {
		return nil, errNilContext
	}
	if c.IsClosed() {
		return nil, ErrClosed
	}
	if err := c.checkPort(port); err != nil {
		return nil, err
	}
	gids, err := c.queryGIDTable(port)
	if errors.Is(err, ioctl.ErrNotSupported) {
		return c.sysfsGIDs(port)
	}
	return gids, err
}

func (c *Context) queryGIDTable(port int) ([]GID, error) {
	if c.file.UsesWrite() {
		return nil, ioctl.ErrNotSupported
	}
	pa, err := c.QueryPort(port)
	if err != nil {
		return nil, err
	}
	// The method returns the entries of every port.
	max := int(pa.GIDTableLen) * int(c.attr.PhysPortCnt)
	entries := make([]ioctl.GIDEntry, max)
	var num uint64
	var call ioctl.Call
	call.Reset(ioctl.UVERBS_OBJECT_DEVICE, ioctl.UVERBS_METHOD_QUERY_GID_TABLE, c.file.DriverID())
	call.InConst(ioctl.UVERBS_ATTR_QUERY_GID_TABLE_ENTRY_SIZE, ioctl.SizeofGIDEntry)
	if max > 0 {
		call.Out(ioctl.UVERBS_ATTR_QUERY_GID_TABLE_RESP_ENTRIES, unsafe.Pointer(&entries[0]), max*ioctl.SizeofGIDEntry, ioctl.AttrMandatory)
	}
	call.Out(ioctl.UVERBS_ATTR_QUERY_GID_TABLE_RESP_NUM_ENTRIES, unsafe.Pointer(&num), 8, ioctl.AttrMandatory)
	if err := c.file.Do(&call, "QUERY_GID_TABLE"); err != nil {
		return nil, fmt.Errorf("uverbs: %s: query GID table: %w", c.info.Name, err)
	}
	var gids []GID
	for _, e := range entries[:min(int(num), max)] {
		if int(e.Port_num) != port {
			continue
		}
		ip := make(net.IP, 16)
		copy(ip, unsafe.Slice((*byte)(unsafe.Pointer(&e.Gid[0])), 16))
		g := GID{Index: int(e.Gid_index), GID: ip, Type: gidTypes[e.Gid_type]}
		if ifi, err := net.InterfaceByIndex(int(e.Netdev_ifindex)); err == nil {
			g.Netdev = ifi.Name
		}
		gids = append(gids, g)
	}
	sort.Slice(gids, func(a, b int) bool { return gids[a].Index < gids[b].Index })
	return gids, nil
}

var gidTypes = map[uint32]GIDType{
	ioctl.IB_UVERBS_GID_TYPE_IB:      GIDTypeIB,
	ioctl.IB_UVERBS_GID_TYPE_ROCE_V1: GIDTypeIB,
	ioctl.IB_UVERBS_GID_TYPE_ROCE_V2: GIDTypeRoCEv2,
}

func (c *Context) sysfsGIDs(port int) ([]GID, error) {
	base := filepath.Join(sysfsRoot, "class/infiniband", c.info.Name, "ports", strconv.Itoa(port))
	if _, err := os.Stat(base); err != nil {
		return nil, fmt.Errorf("uverbs: %s: port %d not in sysfs: %w", c.info.Name, port, err)
	}
	return readGIDs(base), nil
}

// GID returns the entry at index, failing with a clear error when the
// index is outside the table or the entry is empty.
func (c *Context) GID(port, index int) (GID, error) {
	if c.bad() {
		return GID{}, errNilContext
	}
	gids, err := c.GIDs(port)
	if err != nil {
		return GID{}, err
	}
	for _, g := range gids {
		if g.Index == index {
			return g, nil
		}
	}
	pa, err := c.QueryPort(port)
	if err != nil {
		return GID{}, err
	}
	if index < 0 || uint32(index) >= pa.GIDTableLen {
		return GID{}, fmt.Errorf("uverbs: %s port %d: GID index %d out of range 0..%d", c.info.Name, port, index, pa.GIDTableLen-1)
	}
	return GID{}, fmt.Errorf("uverbs: %s port %d: GID index %d is empty (populated: %s)", c.info.Name, port, index, gidIndexes(gids))
}

func gidIndexes(gids []GID) string {
	s := ""
	for i, g := range gids {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%d=%s", g.Index, g.GID)
	}
	if s == "" {
		return "none"
	}
	return s
}

// DefaultGID picks the GID an application most likely wants: a RoCE v2
// entry with an IPv4 address, else a RoCE v2 entry with a global IPv6
// address, else the first entry (InfiniBand). Index 0 is usually the IPv6
// link-local GID, which does not route: picking by type and address, not
// by number, avoids the most common RoCE setup mistake.
func (c *Context) DefaultGID(port int) (GID, error) {
	if c.bad() {
		return GID{}, errNilContext
	}
	gids, err := c.GIDs(port)
	if err != nil {
		return GID{}, err
	}
	return ChooseGID(gids)
}

// ChooseGID applies DefaultGID's rule to a table.
func ChooseGID(gids []GID) (GID, error) {
	for _, g := range gids {
		if g.Type == GIDTypeRoCEv2 && g.IsIPv4() {
			return g, nil
		}
	}
	for _, g := range gids {
		if g.Type == GIDTypeRoCEv2 && !g.GID.IsLinkLocalUnicast() {
			return g, nil
		}
	}
	if len(gids) > 0 {
		return gids[0], nil
	}
	return GID{}, errors.New("uverbs: the port's GID table is empty (is the netdev up and does it have an address?)")
}

// ParseGID parses a GID in IPv6 notation.
func ParseGID(s string) (net.IP, error) {
	ip := net.ParseIP(s)
	if ip == nil {
		return nil, fmt.Errorf("uverbs: bad GID %q", s)
	}
	return ip.To16(), nil
}
