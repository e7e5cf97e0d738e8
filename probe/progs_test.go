package probe

import (
	"fmt"
	"testing"

	"github.com/cilium/ebpf/asm"
)

// eachProgram builds every program of every probe in every variant
// Attach can ask for (kprobes or fentry/fexit, with and without a pid
// filter, with and without ib_uverbs' BTF), with made-up but distinct
// structure offsets.
func eachProgram(t *testing.T, f func(name string, insns asm.Instructions)) {
	t.Helper()
	o := &rxeOffsets{qpNum: 100, qpDevice: 108, devName: 116, needRetry: 124, retransTimer: 132, rnrNakTimer: 140,
		cqIsUser: 148, cqDevice: 156, skbCB: 164, pktHdr: 172, pktOpcode: 180, regArg0: 112, regArg1: 104}
	for _, fexit := range []bool{false, true} {
		for _, pids := range []bool{false, true} {
			u := &uverbsOffsets{cqDevice: 200, devName: 208, qClosed: 216, qEventList: 224, fileQueue: 232,
				filePrivate: 240, ufileDevice: 248, udevDevnum: 256, fileInode: 264, inodeRdev: 272,
				pids: pids, regArg0: 112, regArg1: 104, regArg2: 96, regRet: 80}
			oo := o
			if fexit {
				u, oo = u.tracing(), o.tracing()
			}
			for _, uu := range []*uverbsOffsets{nil, u} {
				for _, d := range probeDefs {
					for _, p := range d.progs(oo, uu) {
						f(fmt.Sprintf("%s fexit=%v pids=%v btf=%v", p.name, fexit, pids, uu != nil), p.insns)
					}
				}
			}
		}
	}
}

// TestProgramsAssemble checks, without a kernel, what the builders could
// get wrong and the verifier would only say in the guest: every jump has
// its target in the program (a snippet used twice must be relabelled),
// no label is used twice, every map a program names exists, every stack
// access is inside the 512-byte frame, and a program cannot run off its
// end.
func TestProgramsAssemble(t *testing.T) {
	specs := mapSpecs()
	n := 0
	eachProgram(t, func(name string, insns asm.Instructions) {
		n++
		if len(insns) == 0 {
			t.Errorf("%s: empty", name)
			return
		}
		labels := map[string]bool{}
		for _, ins := range insns {
			if s := ins.Symbol(); s != "" {
				if labels[s] {
					t.Errorf("%s: label %q twice", name, s)
				}
				labels[s] = true
			}
		}
		for i, ins := range insns {
			ref := ins.Reference()
			switch {
			case ins.IsLoadFromMap():
				if specs[ref] == nil {
					t.Errorf("%s: instruction %d: no map %q", name, i, ref)
				}
			case ref != "" && !labels[ref]:
				t.Errorf("%s: instruction %d (%v): no label %q", name, i, ins, ref)
			}
			fp := stackOffset(ins)
			if i+1 < len(insns) && ins.OpCode == asm.Mov.Op(asm.RegSource) && ins.Src == asm.RFP {
				// fpAddr: r = RFP; r += off
				if next := insns[i+1]; next.OpCode == asm.Add.Op(asm.ImmSource) && next.Dst == ins.Dst {
					fp = next.Constant
				}
			}
			if fp != 0 && (fp < -512 || fp > -1) {
				t.Errorf("%s: instruction %d (%v): stack offset %d outside the frame", name, i, ins, fp)
			}
		}
		last := insns[len(insns)-1].OpCode
		if last.JumpOp() != asm.Exit && last.JumpOp() != asm.Ja {
			t.Errorf("%s: ends in %v, not exit", name, insns[len(insns)-1])
		}
	})
	// Per pid filter setting: without ib_uverbs' BTF 10 programs (2
	// syscall, 8 rxe), with it 16 with kprobes (4 command, 8 rxe, 4
	// cq-events) or 15 with fentry/fexit (cq-events' read is one fexit).
	if want := 2 * (10 + 16 + 10 + 15); n != want {
		t.Errorf("%d programs built, want %d", n, want)
	}
}

// stackOffset is the frame pointer offset ins loads from or stores to,
// else 0.
func stackOffset(ins asm.Instruction) int64 {
	op := ins.OpCode
	switch op.Class() {
	case asm.LdXClass:
		if ins.Src == asm.RFP {
			return int64(ins.Offset)
		}
	case asm.StClass, asm.StXClass:
		if ins.Dst == asm.RFP {
			return int64(ins.Offset)
		}
	}
	return 0
}

// TestFailedInsertsCounted: every map a program inserts into with
// bpf_map_update_elem is one of dropMaps, and the program counts a failed
// insert of that map in gv_drops (countDrop with the map's index), so no
// full map drops counts unseen; and gv_drops has a counter per map.
func TestFailedInsertsCounted(t *testing.T) {
	specs := mapSpecs()
	if got := specs[mapDrops].MaxEntries; got != uint32(len(dropMaps)) {
		t.Errorf("%s has %d counters for %d maps", mapDrops, got, len(dropMaps))
	}
	for _, name := range dropMaps {
		if specs[name] == nil {
			t.Errorf("dropMaps: no map %q", name)
		}
	}
	inserted := map[string]bool{}
	eachProgram(t, func(name string, insns asm.Instructions) {
		updated, counted := map[string]bool{}, map[string]bool{}
		r1, drop := "", int64(-1)
		for _, ins := range insns {
			switch {
			case ins.IsLoadFromMap() && ins.Dst == asm.R1:
				r1 = ins.Reference()
				if r1 == mapDrops && drop >= 0 && drop < int64(len(dropMaps)) {
					counted[dropMaps[drop]] = true
				}
			case ins.OpCode.Class() == asm.StClass && ins.Dst == asm.RFP && ins.Offset == slotDrop:
				drop = ins.Constant
			case ins.IsBuiltinCall() && ins.Constant == int64(asm.FnMapUpdateElem):
				updated[r1] = true
			}
		}
		for m := range updated {
			inserted[m] = true
			if !counted[m] {
				t.Errorf("%s: inserts into %s without counting a failure (countDrop)", name, m)
			}
		}
	})
	// Some variant inserts into each (gv_fds and gv_pending: the raw
	// tracepoint programs).
	for _, m := range dropMaps {
		if !inserted[m] {
			t.Errorf("%s is in dropMaps, but no program inserts into it", m)
		}
	}
}
