package probe

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/cilium/ebpf/btf"
)

// kprobeRegs returns the offsets in the kprobe context (struct pt_regs)
// of the first two arguments and of the return value.
func kprobeRegs() (arg0, arg1, ret int16, err error) {
	switch runtime.GOARCH {
	case "amd64": // struct pt_regs: di at 112, si at 104, ax at 80
		return 112, 104, 80, nil
	case "arm64": // struct user_pt_regs: regs[0], regs[1]
		return 0, 8, 0, nil
	}
	return 0, 0, 0, fmt.Errorf("kprobe argument registers unknown on %s", runtime.GOARCH)
}

// kprobeArg2 is the offset in struct pt_regs of the third argument.
func kprobeArg2() int16 {
	if runtime.GOARCH == "arm64" {
		return 16 // regs[2]
	}
	return 96 // dx
}

// tracing returns a copy of o for fentry/fexit programs, whose context is
// the function's arguments as an array of u64 (the return value follows
// them in fexit).
func (o rxeOffsets) tracing() *rxeOffsets {
	o.regArg0, o.regArg1 = 0, 8
	return &o
}

// tracing returns a copy of u for fentry/fexit programs (see
// rxeOffsets.tracing).
func (u uverbsOffsets) tracing() *uverbsOffsets {
	u.regArg0, u.regArg1, u.regArg2, u.fexit = 0, 8, 16, true
	return &u
}

// ret is the offset of the return value of a function of nargs arguments
// in an exit program's context.
func (u *uverbsOffsets) ret(nargs int) int16 {
	if u.fexit {
		return int16(8 * nargs)
	}
	return u.regRet
}

// btfSpecs loads a module's split BTF (its own types) and, behind it, the
// kernel's and ib_core's, where the types modules share are found.
func btfSpecs(cache *btf.Cache, module string) ([]*btf.Spec, error) {
	if _, err := os.Stat("/sys/kernel/btf/" + module); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("no BTF for %s (/sys/kernel/btf/%s missing: module not loaded, or kernel without CONFIG_DEBUG_INFO_BTF_MODULES)", module, module)
		}
		return nil, err
	}
	m, err := cache.Module(module)
	if err != nil {
		return nil, fmt.Errorf("load %s BTF: %w", module, err)
	}
	specs := []*btf.Spec{m}
	if k, err := cache.Kernel(); err == nil {
		specs = append(specs, k)
	}
	if module != "ib_core" {
		if c, err := cache.Module("ib_core"); err == nil {
			specs = append(specs, c)
		}
	}
	return specs, nil
}

// offsetReader looks dotted member paths up in specs, in order, and
// collects the failures.
type offsetReader struct {
	specs []*btf.Spec
	errs  []error
}

func (r *offsetReader) off(typ, path string) int32 {
	var err error
	for _, spec := range r.specs {
		var n uint32
		if n, err = fieldOffset(spec, typ, path); err == nil {
			return int32(n)
		}
	}
	r.errs = append(r.errs, err)
	return 0
}

// loadRxeOffsets reads the layout of struct rxe_qp, rxe_cq and ib_device
// from /sys/kernel/btf/rdma_rxe (split BTF on top of vmlinux), so that the
// kprobe programs read the right fields of this kernel's build.
func loadRxeOffsets(cache *btf.Cache) (*rxeOffsets, error) {
	o := &rxeOffsets{}
	var err error
	if o.regArg0, o.regArg1, _, err = kprobeRegs(); err != nil {
		return nil, err
	}
	// A module's split BTF holds only the types it added; the ones it
	// shares (struct ib_device is in vmlinux's BTF on Debian) are found in
	// the base, and ib_core's BTF is a last resort.
	specs, err := btfSpecs(cache, "rdma_rxe")
	if err != nil {
		return nil, err
	}
	r := &offsetReader{specs: specs}
	o.qpNum = r.off("rxe_qp", "ibqp.qp_num")
	o.qpDevice = r.off("rxe_qp", "ibqp.device")
	o.devName = r.off("ib_device", "name")
	o.needRetry = r.off("rxe_qp", "req.need_retry")
	o.retransTimer = r.off("rxe_qp", "retrans_timer")
	o.rnrNakTimer = r.off("rxe_qp", "rnr_nak_timer")
	o.cqIsUser = r.off("rxe_cq", "is_user")
	o.cqDevice = r.off("rxe_cq", "ibcq.device")
	o.skbCB = r.off("sk_buff", "cb")
	o.pktHdr = r.off("rxe_pkt_info", "hdr")
	o.pktOpcode = r.off("rxe_pkt_info", "opcode")
	if err := errors.Join(r.errs...); err != nil {
		return nil, err
	}
	return o, nil
}

// loadUverbsOffsets reads the layout of ib_uverbs' completion event queue
// (struct ib_uverbs_completion_event_file, ib_uverbs_event_queue) and of
// its per-file and per-device structs (ib_uverbs_file, ib_uverbs_device)
// from /sys/kernel/btf/ib_uverbs, and of struct file, ib_cq and ib_device
// from vmlinux (or ib_core), for the cq-events and uverbs-commands
// probes. It does not need rxe: every driver's commands go through
// ib_uverbs_write and ib_uverbs_ioctl, its completion events through
// ib_uverbs_comp_handler.
func loadUverbsOffsets(cache *btf.Cache) (*uverbsOffsets, error) {
	o := &uverbsOffsets{}
	var err error
	if o.regArg0, o.regArg1, o.regRet, err = kprobeRegs(); err != nil {
		return nil, err
	}
	o.regArg2 = kprobeArg2()
	specs, err := btfSpecs(cache, "ib_uverbs")
	if err != nil {
		return nil, err
	}
	r := &offsetReader{specs: specs}
	o.cqDevice = r.off("ib_cq", "device")
	o.devName = r.off("ib_device", "name")
	o.qClosed = r.off("ib_uverbs_event_queue", "is_closed")
	o.qEventList = r.off("ib_uverbs_event_queue", "event_list")
	o.fileQueue = r.off("ib_uverbs_completion_event_file", "ev_queue")
	o.filePrivate = r.off("file", "private_data")
	o.ufileDevice = r.off("ib_uverbs_file", "device")
	o.udevDevnum = r.off("ib_uverbs_device", "devnum")
	o.fileInode = r.off("file", "f_inode")
	o.inodeRdev = r.off("inode", "i_rdev")
	if err := errors.Join(r.errs...); err != nil {
		return nil, err
	}
	return o, nil
}

// fieldOffset returns the byte offset of a dotted member path in struct
// typ, looking through anonymous structs and unions.
func fieldOffset(spec *btf.Spec, typ, path string) (uint32, error) {
	var s *btf.Struct
	if err := spec.TypeByName(typ, &s); err != nil {
		return 0, fmt.Errorf("BTF: struct %s: %w", typ, err)
	}
	var t btf.Type = s
	var total uint32
	for _, name := range strings.Split(path, ".") {
		off, mt, ok := findMember(t, name)
		if !ok {
			return 0, fmt.Errorf("BTF: %s has no member %s", typ, path)
		}
		total += off
		t = mt
	}
	return total, nil
}

func findMember(t btf.Type, name string) (uint32, btf.Type, bool) {
	var members []btf.Member
	switch u := btf.UnderlyingType(t).(type) {
	case *btf.Struct:
		members = u.Members
	case *btf.Union:
		members = u.Members
	default:
		return 0, nil, false
	}
	for _, m := range members {
		if m.Name == name {
			return m.Offset.Bytes(), m.Type, true
		}
		if m.Name == "" {
			if off, mt, ok := findMember(m.Type, name); ok {
				return m.Offset.Bytes() + off, mt, true
			}
		}
	}
	return 0, nil, false
}
