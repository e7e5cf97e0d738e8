package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/goverbs/goverbs/uverbs"
)

func runDevices(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("goverbs devices", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var verbose bool
	var dev string
	var port int
	fs.BoolVar(&verbose, "v", false, "print all attributes, ports and GID tables (like ibv_devinfo -v)")
	fs.BoolVar(&verbose, "verbose", false, "same as -v")
	fs.StringVar(&dev, "d", "", "only this device")
	fs.StringVar(&dev, "ib-dev", "", "same as -d")
	fs.IntVar(&port, "i", 0, "with -v: only this port (default all)")
	fs.IntVar(&port, "ib-port", 0, "same as -i")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: goverbs devices [-v] [-d DEV] [-i PORT]\n\n")
		fs.PrintDefaults()
	}
	rest, err := parseGetopt(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageError("unexpected argument %q", rest[0])
	}
	if port < 0 || port > 255 {
		return usageError("-i %d: port must be 1..255 (0: all)", port)
	}
	given := givenFlags(fs)
	if (given["d"] || given["ib-dev"]) && dev == "" {
		return usageError("-d \"\": empty device name (leave -d out for all devices)")
	}
	if port != 0 && !verbose {
		return usageError("-i %d: only with -v (the table lists every port)", port)
	}
	var devs []uverbs.DeviceInfo
	if dev != "" {
		d, err := uverbs.Lookup(dev)
		if err != nil {
			return &exitError{code: 1, msg: fmt.Sprintf("IB device %s not found: %v", dev, err)}
		}
		devs = []uverbs.DeviceInfo{d}
	} else if devs, err = uverbs.List(); err != nil {
		return err
	}
	if len(devs) == 0 {
		return &exitError{code: 1, msg: "no RDMA devices found (no /sys/class/infiniband_verbs entries: is a driver such as rdma_rxe loaded and a device added?)"}
	}
	if !verbose {
		printDeviceTable(stdout, devs)
		return nil
	}
	for i, d := range devs {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		if err := printDeviceVerbose(stdout, d, port); err != nil {
			return err
		}
	}
	return nil
}

func printDeviceTable(w io.Writer, devs []uverbs.DeviceInfo) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tNODE GUID\tDRIVER\tNETDEV\tPORTS")
	for _, d := range devs {
		var ports []string
		for _, p := range d.Ports {
			ports = append(ports, fmt.Sprintf("%d:%s", p.Num, p.State))
		}
		netdev := d.Parent
		if netdev == "" {
			netdev = "-"
		}
		// ibv_devices prints the GUID as 16 hex digits without colons.
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", d.Name, strings.ReplaceAll(d.NodeGUID, ":", ""),
			d.Driver, netdev, strings.Join(ports, " "))
	}
	tw.Flush()
}

// be64 turns a __be64 the kernel copied out (and we read as a host-order
// uint64) into its value: be64toh.
func be64(v uint64) uint64 {
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], v)
	return binary.BigEndian.Uint64(b[:])
}

// guidStr is devinfo.c's guid_str.
func guidStr(v uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", v>>48&0xffff, v>>32&0xffff, v>>16&0xffff, v&0xffff)
}

var deviceCapNames = []struct {
	bit  uint32
	name string
}{
	{1, "RESIZE_MAX_WR"}, {1 << 1, "BAD_PKEY_CNTR"}, {1 << 2, "BAD_QKEY_CNTR"}, {1 << 3, "RAW_MULTI"},
	{1 << 4, "AUTO_PATH_MIG"}, {1 << 5, "CHANGE_PHY_PORT"}, {1 << 6, "UD_AV_PORT_ENFORCE"},
	{1 << 7, "CURR_QP_STATE_MOD"}, {1 << 8, "SHUTDOWN_PORT"}, {1 << 9, "INIT_TYPE"},
	{1 << 10, "PORT_ACTIVE_EVENT"}, {1 << 11, "SYS_IMAGE_GUID"}, {1 << 12, "RC_RNR_NAK_GEN"},
	{1 << 13, "SRQ_RESIZE"}, {1 << 14, "N_NOTIFY_CQ"}, {1 << 17, "MEM_WINDOW"}, {1 << 18, "UD_IP_CSUM"},
	{1 << 20, "XRC"}, {1 << 21, "MEM_MGT_EXTENSIONS"}, {1 << 23, "MEM_WINDOW_TYPE_2A"},
	{1 << 24, "MEM_WINDOW_TYPE_2B"}, {1 << 25, "RC_IP_CSUM"}, {1 << 26, "RAW_IP_CSUM"},
	{1 << 29, "MANAGED_FLOW_STEERING"},
}

func atomicCapStr(c uint32) string {
	switch c {
	case 0:
		return "ATOMIC_NONE"
	case 1:
		return "ATOMIC_HCA"
	case 2:
		return "ATOMIC_GLOB"
	}
	return "invalid atomic capability"
}

func portStateStr(s uverbs.PortState) string {
	switch s {
	case uverbs.PortDown:
		return "PORT_DOWN"
	case uverbs.PortInit:
		return "PORT_INIT"
	case uverbs.PortArmed:
		return "PORT_ARMED"
	case uverbs.PortActive:
		return "PORT_ACTIVE"
	}
	return "invalid state"
}

func mtuStr(m uverbs.MTU) string {
	if b := m.Bytes(); b != 0 {
		return fmt.Sprint(b)
	}
	return "invalid MTU"
}

func linkLayerStr(l uint8) string {
	switch l {
	case 0, 1:
		return "InfiniBand"
	case 2:
		return "Ethernet"
	}
	return "Unknown"
}

func widthStr(w uint8) string {
	switch w {
	case 1:
		return "1"
	case 2:
		return "4"
	case 4:
		return "8"
	case 8:
		return "12"
	case 16:
		return "2"
	}
	return "invalid width"
}

func speedStr(s uint8) string {
	switch s {
	case 1:
		return "2.5 Gbps"
	case 2:
		return "5.0 Gbps"
	case 4, 8:
		return "10.0 Gbps"
	case 16:
		return "14.0 Gbps"
	case 32:
		return "25.0 Gbps"
	case 64:
		return "50.0 Gbps"
	case 128:
		return "100.0 Gbps"
	}
	return "invalid speed"
}

func physStateStr(s uint8) string {
	names := []string{1: "SLEEP", 2: "POLLING", 3: "DISABLED", 4: "PORT_CONFIGURATION TRAINNING",
		5: "LINK_UP", 6: "LINK_ERROR_RECOVERY", 7: "PHY TEST"}
	if int(s) < len(names) && names[s] != "" {
		return names[s]
	}
	return "invalid physical state"
}

// printDeviceVerbose prints what ibv_devinfo -v prints, as far as the
// driver knows it (QUERY_DEVICE, QUERY_PORT, the sysfs GID table), in the
// same layout. GIDs are printed as inet_ntop does whatever their type, and
// each is followed by its netdev.
func printDeviceVerbose(w io.Writer, d uverbs.DeviceInfo, onlyPort int) error {
	ctx, err := uverbs.Open(d.Name)
	if err != nil {
		return err
	}
	defer ctx.Close()
	a, err := ctx.QueryDevice()
	if err != nil {
		return err
	}
	if onlyPort != 0 && (onlyPort < 0 || onlyPort > int(a.PhysPortCnt)) {
		return &exitError{code: 1, msg: fmt.Sprintf("%s: invalid port %d requested (the device has ports 1..%d)", d.Name, onlyPort, a.PhysPortCnt)}
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("hca_id:\t%s", d.Name)
	p("\ttransport:\t\t\tInfiniBand (0)")
	if fw := d.FWVersion; fw != "" {
		p("\tfw_ver:\t\t\t\t%s", fw)
	} else {
		// What the rxe provider of libibverbs makes of the 64-bit value.
		p("\tfw_ver:\t\t\t\t%d.%d.%d", a.FWVersion>>32, a.FWVersion>>16&0xffff, a.FWVersion&0xffff)
	}
	p("\tnode_guid:\t\t\t%s", guidStr(be64(a.NodeGUID)))
	p("\tsys_image_guid:\t\t\t%s", guidStr(be64(a.SysImageGUID)))
	p("\tvendor_id:\t\t\t0x%04x", a.VendorID)
	p("\tvendor_part_id:\t\t\t%d", a.VendorPartID)
	p("\thw_ver:\t\t\t\t0x%X", a.HWVersion)
	p("\tphys_port_cnt:\t\t\t%d", a.PhysPortCnt)
	p("\tdriver:\t\t\t\t%s", d.Driver)
	if d.Parent != "" {
		p("\tnetdev:\t\t\t\t%s", d.Parent)
	}
	p("\tuverbs:\t\t\t\t%s (ABI %d)", d.DevPath, d.ABIVersion)
	p("\tmax_mr_size:\t\t\t0x%x", a.MaxMRSize)
	p("\tpage_size_cap:\t\t\t0x%x", a.PageSizeCap)
	p("\tmax_qp:\t\t\t\t%d", a.MaxQP)
	p("\tmax_qp_wr:\t\t\t%d", a.MaxQPWR)
	p("\tdevice_cap_flags:\t\t0x%08x", a.DeviceCapFlags)
	known := uint32(0)
	for _, c := range deviceCapNames {
		known |= c.bit
		if a.DeviceCapFlags&c.bit != 0 {
			p("\t\t\t\t\t%s", c.name)
		}
	}
	if u := a.DeviceCapFlags &^ known; u != 0 {
		p("\t\t\t\t\tUnknown flags: 0x%X", u)
	}
	p("\tmax_sge:\t\t\t%d", a.MaxSGE)
	p("\tmax_sge_rd:\t\t\t%d", a.MaxSGERd)
	p("\tmax_cq:\t\t\t\t%d", a.MaxCQ)
	p("\tmax_cqe:\t\t\t%d", a.MaxCQE)
	p("\tmax_mr:\t\t\t\t%d", a.MaxMR)
	p("\tmax_pd:\t\t\t\t%d", a.MaxPD)
	p("\tmax_qp_rd_atom:\t\t\t%d", a.MaxQPRdAtom)
	p("\tmax_res_rd_atom:\t\t%d", a.MaxResRdAtom)
	p("\tmax_qp_init_rd_atom:\t\t%d", a.MaxQPInitRdAtom)
	p("\tatomic_cap:\t\t\t%s (%d)", atomicCapStr(a.AtomicCap), a.AtomicCap)
	p("\tmax_ah:\t\t\t\t%d", a.MaxAH)
	p("\tmax_srq:\t\t\t%d", a.MaxSRQ)
	if a.MaxSRQ != 0 {
		p("\tmax_srq_wr:\t\t\t%d", a.MaxSRQWR)
		p("\tmax_srq_sge:\t\t\t%d", a.MaxSRQSGE)
	}
	p("\tmax_pkeys:\t\t\t%d", a.MaxPKeys)
	p("\tlocal_ca_ack_delay:\t\t%d", a.LocalCAAckDelay)
	p("\tnum_comp_vectors:\t\t%d", ctx.NumCompVectors())
	for port := 1; port <= int(a.PhysPortCnt); port++ {
		if onlyPort != 0 && port != onlyPort {
			continue
		}
		pa, err := ctx.QueryPort(port)
		if err != nil {
			return err
		}
		p("\t\tport:\t%d", port)
		p("\t\t\tstate:\t\t\t%s (%d)", portStateStr(pa.State), pa.State)
		p("\t\t\tmax_mtu:\t\t%s (%d)", mtuStr(pa.MaxMTU), pa.MaxMTU)
		p("\t\t\tactive_mtu:\t\t%s (%d)", mtuStr(pa.ActiveMTU), pa.ActiveMTU)
		p("\t\t\tsm_lid:\t\t\t%d", pa.SMLID)
		p("\t\t\tport_lid:\t\t%d", pa.LID)
		p("\t\t\tport_lmc:\t\t0x%02x", pa.LMC)
		p("\t\t\tlink_layer:\t\t%s", linkLayerStr(pa.LinkLayer))
		p("\t\t\tmax_msg_sz:\t\t0x%x", pa.MaxMsgSize)
		p("\t\t\tport_cap_flags:\t\t0x%08x", pa.PortCapFlags)
		p("\t\t\tmax_vl_num:\t\t%d", pa.MaxVLNum)
		p("\t\t\tpkey_tbl_len:\t\t%d", pa.PKeyTableLen)
		p("\t\t\tgid_tbl_len:\t\t%d", pa.GIDTableLen)
		p("\t\t\tactive_width:\t\t%sX (%d)", widthStr(pa.ActiveWidth), pa.ActiveWidth)
		p("\t\t\tactive_speed:\t\t%s (%d)", speedStr(pa.ActiveSpeed), pa.ActiveSpeed)
		p("\t\t\tphys_state:\t\t%s (%d)", physStateStr(pa.PhysState), pa.PhysState)
		gids, err := ctx.GIDs(port)
		if err != nil {
			return err
		}
		for _, g := range gids {
			var raw [16]byte
			copy(raw[:], g.GID.To16())
			extra := ""
			if pa.LinkLayer == 2 {
				extra = ", " + string(g.Type)
			}
			if g.Netdev != "" {
				extra += ", " + g.Netdev
			}
			p("\t\t\tGID[%3d]:\t\t%s%s", g.Index, ntop(raw), extra)
		}
	}
	return nil
}
