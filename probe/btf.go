package probe

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/cilium/ebpf/btf"
)

// loadRxeOffsets reads the layout of struct rxe_qp, rxe_cq and ib_device
// from /sys/kernel/btf/rdma_rxe (split BTF on top of vmlinux), so that the
// kprobe programs read the right fields of this kernel's build.
func loadRxeOffsets() (*rxeOffsets, error) {
	o := &rxeOffsets{}
	switch runtime.GOARCH {
	case "amd64": // struct pt_regs: di at 112, si at 104
		o.regArg0, o.regArg1 = 112, 104
	case "arm64": // struct user_pt_regs: regs[0], regs[1]
		o.regArg0, o.regArg1 = 0, 8
	default:
		return nil, fmt.Errorf("kprobe argument registers unknown on %s", runtime.GOARCH)
	}
	if _, err := os.Stat("/sys/kernel/btf/rdma_rxe"); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, errors.New("no BTF for rdma_rxe (/sys/kernel/btf/rdma_rxe missing: module not loaded, or kernel without CONFIG_DEBUG_INFO_BTF_MODULES)")
		}
		return nil, err
	}
	// A module's split BTF holds only the types it added; the ones it
	// shares (struct ib_device is in vmlinux's BTF on Debian) are found in
	// the base, and ib_core's BTF is a last resort.
	cache := btf.NewCache()
	rxe, err := cache.Module("rdma_rxe")
	if err != nil {
		return nil, fmt.Errorf("load rdma_rxe BTF: %w", err)
	}
	specs := []*btf.Spec{rxe}
	if k, err := cache.Kernel(); err == nil {
		specs = append(specs, k)
	}
	if c, err := cache.Module("ib_core"); err == nil {
		specs = append(specs, c)
	}
	var errs []error
	off := func(typ, path string) int32 {
		var err error
		for _, spec := range specs {
			var n uint32
			if n, err = fieldOffset(spec, typ, path); err == nil {
				return int32(n)
			}
		}
		errs = append(errs, err)
		return 0
	}
	o.qpNum = off("rxe_qp", "ibqp.qp_num")
	o.qpDevice = off("rxe_qp", "ibqp.device")
	o.devName = off("ib_device", "name")
	o.needRetry = off("rxe_qp", "req.need_retry")
	o.retransTimer = off("rxe_qp", "retrans_timer")
	o.rnrNakTimer = off("rxe_qp", "rnr_nak_timer")
	o.cqIsUser = off("rxe_cq", "is_user")
	o.cqDevice = off("rxe_cq", "ibcq.device")
	if err := errors.Join(errs...); err != nil {
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
