package probe

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/cilium/ebpf/asm"
)

// The builders the programs are written with. Each one is a line or two
// of the C-like pseudocode in the programs' comments, so that a program
// reads as a list of steps:
//
//	seq(
//		currentPidTgid(slotPidTgid, asm.R8), // fp[-8] = bpf_get_current_pid_tgid(); r8 = tgid
//		mapLookup(mapStart, slotPidTgid),    // r0 = bpf_map_lookup_elem(&gv_start, &fp[-8])
//		asm.JNE.Imm(asm.R0, 0, "found"),
//		ret0(),                              // return 0
//		...
//	)
//
// Registers as the BPF calling convention has them: R1-R5 carry a helper's
// arguments and are clobbered by every call, R0 is a helper's result and
// the program's return value, R6-R9 survive calls (each program's comment
// says what it keeps in them), RFP is the read-only frame pointer. The
// stack is 512 bytes below RFP; every slot a program uses has a name in
// its family's slot constants (cmds.go, rxe.go, events.go), with what it
// holds.

// seq flattens instructions (asm.Instruction) and snippets
// (asm.Instructions) into one sequence.
func seq(parts ...any) asm.Instructions {
	var in asm.Instructions
	for _, p := range parts {
		switch p := p.(type) {
		case asm.Instruction:
			in = append(in, p)
		case asm.Instructions:
			in = append(in, p...)
		default:
			panic(fmt.Sprintf("probe: seq of %T", p))
		}
	}
	return in
}

// label names the first instruction of in, a jump target.
func label(name string, in asm.Instructions) asm.Instructions {
	out := slices.Clone(in)
	out[0] = out[0].WithSymbol(name)
	return out
}

// relabel prefixes every symbol and jump target of in, so that a snippet
// can be used twice in one program.
func relabel(in asm.Instructions, prefix string) asm.Instructions {
	out := make(asm.Instructions, len(in))
	for i, ins := range in {
		if s := ins.Symbol(); s != "" {
			ins = ins.WithSymbol(prefix + s)
		}
		if ins.OpCode.JumpOp() != asm.InvalidJumpOp && ins.OpCode.JumpOp() != asm.Call && ins.OpCode.JumpOp() != asm.Exit {
			if r := ins.Reference(); r != "" {
				ins = ins.WithReference(prefix + r)
			}
		}
		out[i] = ins
	}
	return out
}

// ret0 is `return 0`.
func ret0() asm.Instructions {
	return asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}
}

// fpAddr is `r = &fp[off]`, the address of a stack slot.
func fpAddr(r asm.Register, off int16) asm.Instructions {
	return asm.Instructions{asm.Mov.Reg(r, asm.RFP), asm.Add.Imm(r, int32(off))}
}

// mapPtr loads the address of the map called name into r.
func mapPtr(r asm.Register, name string) asm.Instruction {
	return asm.LoadMapPtr(r, 0).WithReference(name)
}

// mapLookup is `r0 = bpf_map_lookup_elem(&name, &fp[key])`.
func mapLookup(name string, key int16) asm.Instructions {
	return seq(mapPtr(asm.R1, name), fpAddr(asm.R2, key), asm.FnMapLookupElem.Call())
}

// Flags of bpf_map_update_elem.
const (
	bpfAny     = 0 // create or replace
	bpfNoExist = 1 // create only: a racing CPU may have inserted it
)

// mapUpdate is `bpf_map_update_elem(&name, &fp[key], &fp[val], flags)`.
func mapUpdate(name string, key, val int16, flags int32) asm.Instructions {
	return seq(
		mapPtr(asm.R1, name),
		fpAddr(asm.R2, key),
		fpAddr(asm.R3, val),
		asm.Mov.Imm(asm.R4, flags),
		asm.FnMapUpdateElem.Call(),
	)
}

// mapDelete is `bpf_map_delete_elem(&name, &fp[key])`.
func mapDelete(name string, key int16) asm.Instructions {
	return seq(mapPtr(asm.R1, name), fpAddr(asm.R2, key), asm.FnMapDeleteElem.Call())
}

// mapUpdateCounted is mapUpdate (BPF_ANY) for a map the program inserts
// keys into, counting a failure (the map is full):
//
//	if (bpf_map_update_elem(&name, &fp[key], &fp[val], BPF_ANY)) countDrop(name);
//
// On success it costs one branch more than mapUpdate. Clobbers R0-R5.
func mapUpdateCounted(name string, key, val int16) asm.Instructions {
	return seq(
		mapUpdate(name, key, val, bpfAny),
		asm.JEq.Imm(asm.R0, 0, "upd_ok"),
		countDrop(name),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("upd_ok"),
	)
}

// lookupOrInit is
//
//	r0 = bpf_map_lookup_elem(&name, &fp[key]);
//	if (!r0) {
//		fp[zero : zero+size] = 0;
//		bpf_map_update_elem(&name, &fp[key], &fp[zero], BPF_NOEXIST);
//		r0 = bpf_map_lookup_elem(&name, &fp[key]);
//		if (!r0) { countDrop(name); return 0; } // full: neither this nor a racing CPU inserted it
//	}
//
// An existing key costs nothing more than its lookup.
func lookupOrInit(name string, key, zero int16, size int) asm.Instructions {
	return seq(
		mapLookup(name, key),
		asm.JNE.Imm(asm.R0, 0, "loi_have"),
		zeroStack(zero, size),
		mapUpdate(name, key, zero, bpfNoExist),
		mapLookup(name, key),
		asm.JNE.Imm(asm.R0, 0, "loi_have"),
		countDrop(name),
		ret0(),
		asm.Mov.Reg(asm.R0, asm.R0).WithSymbol("loi_have"),
	)
}

// slotDrop is countDrop's u32 gv_drops key, below every other slot (the
// deepest, compReadEvent's zero gv_events value, ends at -416), so that
// counting a drop overwrites nothing a program still needs.
const slotDrop = -424

// countDrop counts an insert into the map called name that failed, for
// Snapshot.Dropped:
//
//	r0 = bpf_map_lookup_elem(&gv_drops, &dropIndex(name)); // fp[slotDrop]
//	if (r0) __sync_fetch_and_add((u64 *)r0, 1);
//	r0 = 0;
//
// Clobbers R0-R5.
func countDrop(name string) asm.Instructions {
	return seq(
		asm.StoreImm(asm.RFP, slotDrop, int64(dropIndex(name)), asm.Word),
		mapLookup(mapDrops, slotDrop),
		asm.JEq.Imm(asm.R0, 0, "drop_none"),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 0),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("drop_none"),
	)
}

// currentPidTgid is `fp[slot] = bpf_get_current_pid_tgid(); tgid =
// fp[slot] >> 32`.
func currentPidTgid(slot int16, tgid asm.Register) asm.Instructions {
	return asm.Instructions{
		asm.FnGetCurrentPidTgid.Call(),
		asm.StoreMem(asm.RFP, slot, asm.R0, asm.DWord),
		asm.Mov.Reg(tgid, asm.R0),
		asm.RSh.Imm(tgid, 32),
	}
}

// slotPidFilter is pidFilter's u32 map key, shared by every program that
// filters (no other slot may overlap fp[-60..-56]).
const slotPidFilter = -60

// pidFilter is
//
//	if (gv_config[0] && !gv_pids[tgid]) return 0;
//
// It keeps tgid and clobbers R0-R5.
func pidFilter(tgid asm.Register) asm.Instructions {
	return seq(
		asm.StoreImm(asm.RFP, slotPidFilter, 0, asm.Word),
		mapLookup(mapConfig, slotPidFilter),
		asm.JEq.Imm(asm.R0, 0, "pf_pass"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.JEq.Imm(asm.R1, 0, "pf_pass"),
		asm.StoreMem(asm.RFP, slotPidFilter, tgid, asm.Word),
		mapLookup(mapPids, slotPidFilter),
		asm.JNE.Imm(asm.R0, 0, "pf_pass"),
		ret0(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("pf_pass"),
	)
}

// readKernel is `r0 = bpf_probe_read_kernel(&fp[dst], size, src + off)`.
// Clobbers R1-R5.
func readKernel(dst int16, size int32, src asm.Register, off int32) asm.Instructions {
	in := fpAddr(asm.R1, dst)
	in = append(in, asm.Mov.Imm(asm.R2, size))
	if src != asm.R3 {
		in = append(in, asm.Mov.Reg(asm.R3, src))
	}
	if off != 0 {
		in = append(in, asm.Add.Imm(asm.R3, off))
	}
	return append(in, asm.FnProbeReadKernel.Call())
}

// readThrough follows one pointer: `fp[dst : dst+size] = (*(void **)(src +
// ptrOff))[off : off+size]`, the pointer read into fp[tmp] (8 bytes) on
// the way, as in `cq->device->name`. Clobbers R0-R5.
func readThrough(dst int16, size int32, tmp int16, src asm.Register, ptrOff, off int32) asm.Instructions {
	return seq(
		readKernel(tmp, 8, src, ptrOff),
		asm.LoadMem(asm.R3, asm.RFP, tmp, asm.DWord),
		readKernel(dst, size, asm.R3, off),
	)
}

// zero64 is `*(u64 *)(base + off) = 0` (asm.StoreImm refuses DWord, but
// BPF_ST|BPF_MEM|BPF_DW with a sign-extended imm is a valid insn).
func zero64(base asm.Register, off int16) asm.Instruction {
	return asm.Instruction{OpCode: asm.StoreImmOp(asm.DWord), Dst: base, Offset: off}
}

// zeroStack is `fp[off : off+size] = 0`, size a multiple of 8.
func zeroStack(off int16, size int) asm.Instructions {
	var in asm.Instructions
	for i := 0; i < size; i += 8 {
		in = append(in, zero64(asm.RFP, off+int16(i)))
	}
	return in
}

// copyWords is `memcpy(dst + dstOff, src + srcOff, 8*n)`, a u64 at a time
// through R1.
func copyWords(dst asm.Register, dstOff int16, src asm.Register, srcOff int16, n int) asm.Instructions {
	var in asm.Instructions
	for i := int16(0); i < int16(n); i++ {
		in = append(in,
			asm.LoadMem(asm.R1, src, srcOff+8*i, asm.DWord),
			asm.StoreMem(dst, dstOff+8*i, asm.R1, asm.DWord),
		)
	}
	return in
}

// log2 is `out = v <= 1 ? 0 : floor(log2(v))`, clobbering v and tmp.
func log2(v, out, tmp asm.Register) asm.Instructions {
	in := asm.Instructions{asm.Mov.Imm(out, 0)}
	for i, s := range []int32{32, 16, 8, 4, 2, 1} {
		skip := fmt.Sprintf("log2_%d", i)
		in = append(in,
			asm.Mov.Reg(tmp, v),
			asm.RSh.Imm(tmp, s),
			asm.JEq.Imm(tmp, 0, skip),
			asm.Mov.Reg(v, tmp),
			asm.Add.Imm(out, s),
			asm.Mov.Reg(v, v).WithSymbol(skip),
		)
	}
	return in
}

// histOff is the offset of the log2 histogram in a gv_cmds or gv_events
// value, after its three u64 counters.
const histOff = 24

// histAdd is `__sync_fetch_and_add(&val->hist[min(log2(ns),
// numBuckets-1)], 1)` for the gv_cmds or gv_events value at val. Clobbers
// val, ns, R1-R3.
func histAdd(val, ns asm.Register) asm.Instructions {
	return seq(
		log2(ns, asm.R2, asm.R3),
		asm.JLE.Imm(asm.R2, numBuckets-1, "inrange"),
		asm.Mov.Imm(asm.R2, numBuckets-1),
		asm.LSh.Imm(asm.R2, 3).WithSymbol("inrange"),
		asm.Add.Reg(val, asm.R2),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(val, asm.R1, asm.DWord, histOff),
	)
}

// fetchAdd64 is `src = atomic_fetch_add((u64 *)(dst + off), src)`.
//
// cilium/ebpf v0.22's Instruction.Marshal takes the immediate before it
// derives it from the atomic opcode, so asm.FetchAdd marshals with imm 0:
// a plain atomic add that leaves src unchanged. An AddAtomic instruction
// whose Constant is BPF_ADD|BPF_FETCH (1) marshals right there. Whichever
// of the two encodes the fetch (TestFetchAddEncoding checks) is used, so a
// fixed library keeps working.
func fetchAdd64(dst, src asm.Register, off int16) asm.Instruction {
	ins := asm.FetchAdd.Mem(dst, src, asm.DWord, off)
	if atomicImm(ins) == bpfAddFetch {
		return ins
	}
	ins = asm.AddAtomic.Mem(dst, src, asm.DWord, off)
	ins.Constant = bpfAddFetch
	return ins
}

const bpfAddFetch = 0x01 // BPF_ADD | BPF_FETCH

// atomicImm is the immediate ins marshals with, or -1.
func atomicImm(ins asm.Instruction) int64 {
	var b bytes.Buffer
	if _, err := ins.Marshal(&b, binary.LittleEndian); err != nil || b.Len() < 8 {
		return -1
	}
	return int64(int32(binary.LittleEndian.Uint32(b.Bytes()[4:8])))
}
