package probe

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// The programs are written with cilium/ebpf's asm package, so building
// goverbs needs no C toolchain and nothing is generated: they are small
// counters (hash maps of counters and log2 histograms) and the offsets of
// rxe's structures are read from the running kernel's BTF at load time and
// baked in as constants.

// Map names. They are also the names the kernel shows (bpftool map).
const (
	mapConfig  = "gv_config"  // array[1] u32: 1 = count only the pids in gv_pids
	mapPids    = "gv_pids"    // hash tgid -> u8
	mapFDs     = "gv_fds"     // hash {tgid, fd} -> u32 uverbs minor index (the N in uverbsN)
	mapPending = "gv_pending" // hash pid_tgid -> u32: openat of uverbsN in flight
	mapStart   = "gv_start"   // hash pid_tgid -> startVal: a uverbs syscall in flight
	mapTStart  = "gv_tstart"  // task storage -> startVal (stamp 0: none in flight), for fentry/fexit
	mapCmds    = "gv_cmds"    // hash cmdKey -> cmdVal
	mapQPs     = "gv_qps"     // hash qpKey -> qpVal
	// cq-events: see compHandler, compReadEnter, compReadExit.
	mapEvQueues = "gv_evq"    // LRU hash ev_queue pointer -> {raised, consumed, name[16], stamps[evRing]}
	mapEvRead   = "gv_evread" // hash pid_tgid -> ev_queue: a completion channel read in flight
	mapEvents   = "gv_events" // hash evKey {name[16], tgid, pad} -> evVal
	mapRaised   = "gv_raised" // hash device name[16] -> u64 events raised
	mapEvInfl   = "gv_evinfl" // array[1] s64: ib_uverbs_comp_handler calls in flight
	maxEntries  = 16384
	cmdKeySize  = 16
	startSize   = 24
	qpKeySize   = 24
	qpNameLen   = 16
	numBuckets  = 40 // log2(ns) buckets: bucket i counts [2^i, 2^(i+1)) ns
	cmdValWords = 3 + numBuckets
	qpValWords  = numQPCounters
	evKeySize   = 24
	evValWords  = 3 + numBuckets // matched reads, unmatched reads, total ns, histogram
)

// ioctl commands and write() command headers.
const (
	rdmaVerbsIoctl = 0xc0181b01 // _IOWR(0x1b, 1, struct ib_uverbs_ioctl_hdr)
	kindIoctl      = 1
	kindWrite      = 2
	unknownDev     = 0xffff
	// devMinorFlag marks a device field that holds the uverbs char
	// device's minor (i_rdev, from the fentry programs) rather than the
	// N of uverbsN.
	devMinorFlag = 0x8000
	writeCmdMask = 0x800000ff // IB_USER_VERBS_CMD_FLAG_EXTENDED | IB_USER_VERBS_CMD_COMMAND_MASK
)

// Per-QP counters, in the order of the u64 words of a gv_qps value.
const (
	qpSent = iota
	qpRecv
	qpRetries
	qpTimeouts
	qpRNRTimers
	qpErrors
	qpSendCompletions
	qpRecvCompletions
	qpErrorCompletions
	qpSeqNaks // NAK PSN sequence error received
	qpRNRNaks // RNR NAK received
	numQPCounters
)

// The syscall programs are raw tracepoint programs on sys_enter and
// sys_exit (no tracefs needed): ctx is {struct pt_regs *regs; long id} on
// entry and {regs; long ret} on exit. sysEnter copies the first three
// arguments (amd64: dx, si, di, adjacent in pt_regs) to the stack slots
// below.
const (
	tpArg0 = -72
	tpArg1 = -80
	tpArg2 = -88
)

func mapSpecs() map[string]*ebpf.MapSpec {
	return map[string]*ebpf.MapSpec{
		mapConfig:   {Name: mapConfig, Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1},
		mapPids:     {Name: mapPids, Type: ebpf.Hash, KeySize: 4, ValueSize: 1, MaxEntries: 1024},
		mapFDs:      {Name: mapFDs, Type: ebpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: maxEntries},
		mapPending:  {Name: mapPending, Type: ebpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: 1024},
		mapStart:    {Name: mapStart, Type: ebpf.Hash, KeySize: 8, ValueSize: startSize, MaxEntries: maxEntries},
		mapCmds:     {Name: mapCmds, Type: ebpf.Hash, KeySize: cmdKeySize, ValueSize: 8 * cmdValWords, MaxEntries: maxEntries},
		mapQPs:      {Name: mapQPs, Type: ebpf.Hash, KeySize: qpKeySize, ValueSize: 8 * qpValWords, MaxEntries: maxEntries},
		mapEvQueues: {Name: mapEvQueues, Type: ebpf.LRUHash, KeySize: 8, ValueSize: evqSize, MaxEntries: 4096},
		mapEvRead:   {Name: mapEvRead, Type: ebpf.Hash, KeySize: 8, ValueSize: 8, MaxEntries: 1024},
		mapEvents:   {Name: mapEvents, Type: ebpf.Hash, KeySize: evKeySize, ValueSize: 8 * evValWords, MaxEntries: maxEntries},
		mapRaised:   {Name: mapRaised, Type: ebpf.Hash, KeySize: qpNameLen, ValueSize: 8, MaxEntries: 1024},
		mapEvInfl:   {Name: mapEvInfl, Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1},
		// Local storage maps need BTF: an int key, here a u64[3] value.
		mapTStart: {Name: mapTStart, Type: ebpf.TaskStorage, KeySize: 4, ValueSize: startSize, Flags: unix.BPF_F_NO_PREALLOC,
			Key:   &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed},
			Value: &btf.Array{Index: &btf.Int{Name: "u32", Size: 4}, Type: &btf.Int{Name: "u64", Size: 8}, Nelems: startSize / 8}},
	}
}

func mapPtr(r asm.Register, name string) asm.Instruction {
	return asm.LoadMapPtr(r, 0).WithReference(name)
}

// pidFilter exits unless gv_config[0] is 0 or the current tgid (in tgid)
// is in gv_pids. It keeps tgid and clobbers R0-R5. Stack: fp-60 (scratch).
func pidFilter(tgid asm.Register) asm.Instructions {
	return asm.Instructions{
		asm.StoreImm(asm.RFP, -60, 0, asm.Word),
		mapPtr(asm.R1, mapConfig),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -60),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pf_pass"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.JEq.Imm(asm.R1, 0, "pf_pass"),
		asm.StoreMem(asm.RFP, -60, tgid, asm.Word),
		mapPtr(asm.R1, mapPids),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -60),
		asm.FnMapLookupElem.Call(),
		asm.JNE.Imm(asm.R0, 0, "pf_pass"),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("pf_pass"),
	}
}

// lookupOrInit looks key (at fp+keyOff) up in mapName and inserts a zero
// value (zeroed on the stack at fp+zeroOff, size bytes) when it is missing;
// the value pointer is in R0 afterwards, or the program exits.
func lookupOrInit(mapName string, keyOff, zeroOff int16, size int) asm.Instructions {
	var in asm.Instructions
	in = append(in,
		mapPtr(asm.R1, mapName),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, int32(keyOff)),
		asm.FnMapLookupElem.Call(),
		asm.JNE.Imm(asm.R0, 0, "loi_have"),
	)
	for off := 0; off < size; off += 8 {
		in = append(in, stZero64(zeroOff+int16(off)))
	}
	in = append(in,
		mapPtr(asm.R1, mapName),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, int32(keyOff)),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, int32(zeroOff)),
		asm.Mov.Imm(asm.R4, 1), // BPF_NOEXIST: a racing CPU may have inserted it
		asm.FnMapUpdateElem.Call(),
		mapPtr(asm.R1, mapName),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, int32(keyOff)),
		asm.FnMapLookupElem.Call(),
		asm.JNE.Imm(asm.R0, 0, "loi_have"),
		asm.Return(), // R0 == 0
		asm.Mov.Reg(asm.R0, asm.R0).WithSymbol("loi_have"),
	)
	return in
}

// ioctlEnter: sys_enter_ioctl with cmd == RDMA_VERBS_IOCTL. It records
// {tgid, fd, dev|kind<<16, object<<16|method} and the time in gv_start.
//
// Stack: fp-8 pid_tgid, fp-16 {tgid, fd}, fp-40 start value, fp-48 scratch.
func ioctlEnter() asm.Instructions {
	in := asm.Instructions{
		asm.LoadMem(asm.R7, asm.RFP, tpArg1, asm.DWord),
		asm.LoadImm(asm.R1, rdmaVerbsIoctl, asm.DWord),
		asm.JEq.Reg32(asm.R7, asm.R1, "is_verbs"),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
		asm.FnGetCurrentPidTgid.Call().WithSymbol("is_verbs"),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.RSh.Imm(asm.R8, 32),
	}
	in = append(in, pidFilter(asm.R8)...)
	in = append(in,
		asm.LoadMem(asm.R7, asm.RFP, tpArg0, asm.DWord), // fd
		asm.StoreMem(asm.RFP, -16, asm.R8, asm.Word),
		asm.StoreMem(asm.RFP, -12, asm.R7, asm.Word),
		asm.StoreMem(asm.RFP, -40, asm.R8, asm.Word),
		asm.StoreMem(asm.RFP, -36, asm.R7, asm.Word),
		asm.StoreImm(asm.RFP, -32, kindIoctl<<16|unknownDev, asm.Word),
		mapPtr(asm.R1, mapFDs),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -16),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "nodev"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.And.Imm(asm.R1, 0xffff),
		asm.Or.Imm(asm.R1, kindIoctl<<16),
		asm.StoreMem(asm.RFP, -32, asm.R1, asm.Word),
		asm.LoadMem(asm.R3, asm.RFP, tpArg2, asm.DWord).WithSymbol("nodev"),
	)
	in = append(in, userCommand(true)...)
	return append(in, storeStart()...)
}

// writeEnter: sys_enter_write on an fd in gv_fds; the command is the first
// word of the buffer (struct ib_uverbs_cmd_hdr).
func writeEnter() asm.Instructions {
	in := asm.Instructions{
		asm.FnGetCurrentPidTgid.Call(),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.RSh.Imm(asm.R8, 32),
		asm.LoadMem(asm.R7, asm.RFP, tpArg0, asm.DWord),
		asm.StoreMem(asm.RFP, -16, asm.R8, asm.Word),
		asm.StoreMem(asm.RFP, -12, asm.R7, asm.Word),
		mapPtr(asm.R1, mapFDs),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -16),
		asm.FnMapLookupElem.Call(),
		asm.JNE.Imm(asm.R0, 0, "is_uverbs"),
		asm.Return(),
		asm.LoadMem(asm.R9, asm.R0, 0, asm.Word).WithSymbol("is_uverbs"),
	}
	in = append(in, pidFilter(asm.R8)...)
	in = append(in,
		asm.StoreMem(asm.RFP, -40, asm.R8, asm.Word),
		asm.StoreMem(asm.RFP, -36, asm.R7, asm.Word),
		asm.And.Imm(asm.R9, 0xffff),
		asm.Or.Imm(asm.R9, kindWrite<<16),
		asm.StoreMem(asm.RFP, -32, asm.R9, asm.Word),
		asm.LoadMem(asm.R3, asm.RFP, tpArg1, asm.DWord),
	)
	in = append(in, userCommand(false)...)
	return append(in, storeStart()...)
}

// userCommand reads the command of an ioctl (struct ib_uverbs_ioctl_hdr
// { u16 length; u16 object_id; u32 method_id; ... }: object<<16|method)
// or a write (struct ib_uverbs_cmd_hdr { u32 command; ... }, masked) from
// the user buffer in R3 into the start value's command word at fp-28.
// Stack: fp-48 scratch. Clobbers R0-R5.
func userCommand(ioctl bool) asm.Instructions {
	size := int32(4)
	if ioctl {
		size = 8
	}
	in := asm.Instructions{
		stZero64(-48),
		asm.Mov.Reg(asm.R1, asm.RFP),
		asm.Add.Imm(asm.R1, -48),
		asm.Mov.Imm(asm.R2, size),
		asm.FnProbeReadUser.Call(),
	}
	if ioctl {
		in = append(in,
			asm.LoadMem(asm.R1, asm.RFP, -46, asm.Half),
			asm.LSh.Imm(asm.R1, 16),
			asm.LoadMem(asm.R2, asm.RFP, -44, asm.Word),
			asm.And.Imm(asm.R2, 0xffff),
			asm.Or.Reg(asm.R1, asm.R2),
		)
	} else {
		in = append(in,
			asm.LoadMem(asm.R1, asm.RFP, -48, asm.Word),
			asm.LoadImm(asm.R2, writeCmdMask, asm.DWord),
			asm.And.Reg(asm.R1, asm.R2),
		)
	}
	return append(in, asm.StoreMem(asm.RFP, -28, asm.R1, asm.Word))
}

// storeStart stamps the start value at fp-40 and stores it under pid_tgid
// (fp-8).
func storeStart() asm.Instructions {
	return asm.Instructions{
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(asm.RFP, -24, asm.R0, asm.DWord),
		mapPtr(asm.R1, mapStart),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -40),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnMapUpdateElem.Call(),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	}
}

// syscallExit: the exit of an ioctl or write that an entry program
// recorded (R0: its start value, fp-8: pid_tgid, R6: the context, whose
// word at retOff is the return value). Adds one call, its error, its
// latency and its log2 bucket to gv_cmds.
//
// Stack: fp-8 pid_tgid, fp-32 key (16), fp-32-8*cmdValWords zero value.
func syscallExit(retOff int16) asm.Instructions {
	in := append(cmdDone(retOff),
		mapPtr(asm.R1, mapStart),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapDeleteElem.Call(),
	)
	return append(in, cmdCount()...)
}

// cmdDone reads the start record in R0 (key, stamp): the key to fp-32,
// R8 = the latency, R9 = the return value (the word at retOff of the
// context in R6). Clobbers R0-R5.
func cmdDone(retOff int16) asm.Instructions {
	return asm.Instructions{
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.StoreMem(asm.RFP, -32, asm.R1, asm.DWord),
		asm.LoadMem(asm.R1, asm.R0, 8, asm.DWord),
		asm.StoreMem(asm.RFP, -24, asm.R1, asm.DWord),
		asm.LoadMem(asm.R8, asm.R0, 16, asm.DWord),
		asm.FnKtimeGetNs.Call(),
		asm.Sub.Reg(asm.R0, asm.R8),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.LoadMem(asm.R9, asm.R6, retOff, asm.DWord),
	}
}

// cmdCount adds one call (R9: its return value, R8: its latency) to
// gv_cmds[key at fp-32].
func cmdCount() asm.Instructions {
	in := lookupOrInit(mapCmds, -32, int16(-32-8*cmdValWords), 8*cmdValWords)
	in = append(in,
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R7, asm.R1, asm.DWord, 0),
		asm.JSGE.Imm(asm.R9, 0, "ok"),
		asm.AddAtomic.Mem(asm.R7, asm.R1, asm.DWord, 8),
		asm.AddAtomic.Mem(asm.R7, asm.R8, asm.DWord, 16).WithSymbol("ok"),
	)
	in = append(in, log2(asm.R8, asm.R2, asm.R3)...)
	in = append(in,
		asm.JLE.Imm(asm.R2, numBuckets-1, "inrange"),
		asm.Mov.Imm(asm.R2, numBuckets-1),
		asm.LSh.Imm(asm.R2, 3).WithSymbol("inrange"),
		asm.Add.Reg(asm.R7, asm.R2),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R7, asm.R1, asm.DWord, 24),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	)
	return in
}

// taskStart returns in R0 this task's gv_tstart record (created if
// missing, with create), or exits. Clobbers R1-R5.
func taskStart(create bool) asm.Instructions {
	flags := int32(0)
	if create {
		flags = 1 // BPF_LOCAL_STORAGE_GET_F_CREATE
	}
	return asm.Instructions{
		asm.FnGetCurrentTaskBtf.Call(),
		asm.Mov.Reg(asm.R2, asm.R0),
		mapPtr(asm.R1, mapTStart),
		asm.Mov.Imm(asm.R3, 0),
		asm.Mov.Imm(asm.R4, flags),
		asm.FnTaskStorageGet.Call(),
		asm.JNE.Imm(asm.R0, 0, "have_task"),
		asm.Return(),
		asm.Mov.Reg(asm.R0, asm.R0).WithSymbol("have_task"),
	}
}

// storeStartTask is storeStart for fentry programs: the start value at
// fp-40 (key) is stamped and copied into the task's gv_tstart record, a
// task local storage (no hash update per call, nothing to delete).
func storeStartTask() asm.Instructions {
	in := asm.Instructions{
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(asm.RFP, -24, asm.R0, asm.DWord),
	}
	in = append(in, taskStart(true)...)
	for off := int16(0); off < startSize; off += 8 {
		in = append(in,
			asm.LoadMem(asm.R1, asm.RFP, -40+off, asm.DWord),
			asm.StoreMem(asm.R0, off, asm.R1, asm.DWord),
		)
	}
	return append(in, asm.Mov.Imm(asm.R0, 0), asm.Return())
}

// uverbsCmdEnter is the entry program (fentry or kprobe) of
// ib_uverbs_write(struct file *filp, const char __user *buf, ...) or, with
// ioctl, ib_uverbs_ioctl(struct file *filp, unsigned int cmd, unsigned long
// arg): only uverbs commands run it, not every system call. It records the
// start value {tgid, fd = unknown, dev|kind<<16, command} (in task
// storage for fentry, else under pid_tgid), the device being, for fentry,
// the char device minor of filp->f_inode->i_rdev, else
// filp->private_data (struct ib_uverbs_file)->device->devnum, the N of
// uverbsN.
//
// Stack: fp-8 pid_tgid, fp-40 start value, fp-48 scratch.
func uverbsCmdEnter(u *uverbsOffsets, ioctl bool) asm.Instructions {
	kind := int32(kindWrite)
	in := asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1)}
	if ioctl {
		kind = kindIoctl
		in = append(in,
			asm.LoadMem(asm.R1, asm.R6, u.regArg1, asm.DWord),
			asm.LoadImm(asm.R2, rdmaVerbsIoctl, asm.DWord),
			asm.JEq.Reg32(asm.R1, asm.R2, "is_verbs"),
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
			asm.Mov.Imm(asm.R0, 0).WithSymbol("is_verbs"),
		)
	}
	in = append(in,
		asm.FnGetCurrentPidTgid.Call(),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.RSh.Imm(asm.R8, 32),
	)
	if u.pids {
		in = append(in, pidFilter(asm.R8)...)
	}
	in = append(in,
		asm.StoreMem(asm.RFP, -40, asm.R8, asm.Word),
		asm.StoreImm(asm.RFP, -36, -1, asm.Word), // the fd is not known here
		asm.StoreImm(asm.RFP, -32, int64(kind<<16|unknownDev), asm.Word),
		asm.LoadMem(asm.R7, asm.R6, u.regArg0, asm.DWord), // filp
	)
	if u.fexit {
		// filp is a BTF pointer: load filp->f_inode->i_rdev directly (no
		// helper calls); the device is its char-dev minor (devMinorFlag).
		in = append(in,
			asm.LoadMem(asm.R1, asm.R7, int16(u.fileInode), asm.DWord),
			asm.JEq.Imm(asm.R1, 0, "nodev"),
			asm.LoadMem(asm.R1, asm.R1, int16(u.inodeRdev), asm.Word),
			asm.And.Imm(asm.R1, devMinorFlag-1),
			asm.Or.Imm(asm.R1, kind<<16|devMinorFlag),
			asm.StoreMem(asm.RFP, -32, asm.R1, asm.Word),
		)
	} else {
		// ufile = filp->private_data; udev = ufile->device; minor =
		// udev->devnum, read with helpers.
		in = append(in, asm.Mov.Reg(asm.R3, asm.R7))
		for i, step := range []struct {
			off  int32
			size int32
		}{{u.filePrivate, 8}, {u.ufileDevice, 8}, {u.udevDevnum, 4}} {
			if i > 0 {
				in = append(in, asm.LoadMem(asm.R3, asm.RFP, -48, asm.DWord))
			}
			in = append(in, stZero64(-48), asm.JEq.Imm(asm.R3, 0, "nodev"))
			in = append(in, readKernel(-48, step.size, asm.R3, step.off)...)
			in = append(in, asm.JNE.Imm(asm.R0, 0, "nodev"))
		}
		in = append(in,
			asm.LoadMem(asm.R1, asm.RFP, -48, asm.Word),
			asm.And.Imm(asm.R1, 0xffff),
			asm.Or.Imm(asm.R1, kind<<16),
			asm.StoreMem(asm.RFP, -32, asm.R1, asm.Word),
		)
	}
	// The command from the user buffer: ioctl's arg, write's buf.
	buf := u.regArg1
	if ioctl {
		buf = u.regArg2
	}
	in = append(in, asm.LoadMem(asm.R3, asm.R6, buf, asm.DWord).WithSymbol("nodev"))
	in = append(in, userCommand(ioctl)...)
	if u.fexit {
		return append(in, storeStartTask()...)
	}
	return append(in, storeStart()...)
}

// uverbsCmdExit is the exit program (fexit or kretprobe) of the function
// uverbsCmdEnter entered, which has nargs arguments.
func uverbsCmdExit(u *uverbsOffsets, nargs int) asm.Instructions {
	if u.fexit {
		// The task's record; a zero stamp: no entry recorded (filtered
		// out, or attached in between).
		in := asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1)}
		in = append(in, taskStart(false)...)
		in = append(in,
			asm.Mov.Reg(asm.R7, asm.R0),
			asm.LoadMem(asm.R1, asm.R0, 16, asm.DWord),
			asm.JNE.Imm(asm.R1, 0, "started"),
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
		)
		done := cmdDone(u.ret(nargs))
		done[0] = done[0].WithSymbol("started")
		in = append(in, done...)
		in = append(in, asm.Instruction{OpCode: asm.StoreImmOp(asm.DWord), Dst: asm.R7, Offset: 16}) // stamp = 0
		return append(in, cmdCount()...)
	}
	in := append(startLookup(), asm.Return())
	cmd := relabel(syscallExit(u.ret(nargs)), "cmd_")
	cmd[0] = cmd[0].WithSymbol("cmd_")
	return append(in, cmd...)
}

// readKernel copies size bytes of kernel memory at src+off to the stack
// at fp+dst with bpf_probe_read_kernel (R0: its result). Clobbers R1-R5.
func readKernel(dst int16, size int32, src asm.Register, off int32) asm.Instructions {
	in := asm.Instructions{
		asm.Mov.Reg(asm.R1, asm.RFP),
		asm.Add.Imm(asm.R1, int32(dst)),
		asm.Mov.Imm(asm.R2, size),
	}
	if src != asm.R3 {
		in = append(in, asm.Mov.Reg(asm.R3, src))
	}
	if off != 0 {
		in = append(in, asm.Add.Imm(asm.R3, off))
	}
	return append(in, asm.FnProbeReadKernel.Call())
}

// log2 sets out = floor(log2(v)) (0 for v <= 1), clobbering v and tmp.
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

// openatEnter: remember an openat of /dev/infiniband/uverbsN (N in 0..99)
// in gv_pending. Stack: fp-8 pid_tgid, fp-48 path (32 bytes), fp-52 value.
func openatEnter() asm.Instructions {
	word := func(s string) int64 {
		var v uint64
		for i := len(s) - 1; i >= 0; i-- {
			v = v<<8 | uint64(s[i])
		}
		return int64(v)
	}
	return asm.Instructions{
		asm.Mov.Reg(asm.R1, asm.RFP),
		asm.Add.Imm(asm.R1, -48),
		asm.Mov.Imm(asm.R2, 32),
		asm.LoadMem(asm.R3, asm.RFP, tpArg1, asm.DWord),
		asm.FnProbeReadUserStr.Call(),
		asm.JSLT.Imm(asm.R0, 24, "out"), // "/dev/infiniband/uverbsN\0" is 24 bytes
		asm.LoadMem(asm.R1, asm.RFP, -48, asm.DWord),
		asm.LoadImm(asm.R2, word("/dev/inf"), asm.DWord),
		asm.JNE.Reg(asm.R1, asm.R2, "out"),
		asm.LoadMem(asm.R1, asm.RFP, -40, asm.DWord),
		asm.LoadImm(asm.R2, word("iniband/"), asm.DWord),
		asm.JNE.Reg(asm.R1, asm.R2, "out"),
		asm.LoadMem(asm.R1, asm.RFP, -32, asm.Word),
		asm.LoadImm(asm.R2, word("uver"), asm.DWord),
		asm.JNE.Reg(asm.R1, asm.R2, "out"),
		asm.LoadMem(asm.R1, asm.RFP, -28, asm.Half),
		asm.JNE.Imm(asm.R1, int32(word("bs")), "out"),
		asm.LoadMem(asm.R7, asm.RFP, -26, asm.Byte),
		asm.Sub.Imm(asm.R7, '0'),
		asm.JGT.Imm(asm.R7, 9, "out"),
		asm.LoadMem(asm.R1, asm.RFP, -25, asm.Byte),
		asm.JEq.Imm(asm.R1, 0, "num"),
		asm.Sub.Imm(asm.R1, '0'),
		asm.JGT.Imm(asm.R1, 9, "out"),
		asm.Mul.Imm(asm.R7, 10),
		asm.Add.Reg(asm.R7, asm.R1),
		asm.LoadMem(asm.R1, asm.RFP, -24, asm.Byte),
		asm.JNE.Imm(asm.R1, 0, "out"),
		asm.StoreMem(asm.RFP, -52, asm.R7, asm.Word).WithSymbol("num"),
		asm.FnGetCurrentPidTgid.Call(),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
		mapPtr(asm.R1, mapPending),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -52),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnMapUpdateElem.Call(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	}
}

// openatExit: the exit of an openat of a uverbs device (R0: its pending
// value, fp-8: pid_tgid); on success {tgid, fd} goes into gv_fds. Stack: fp-8 pid_tgid, fp-16 {tgid, fd}, fp-20 minor.
func openatExit() asm.Instructions {
	return asm.Instructions{
		asm.LoadMem(asm.R7, asm.R0, 0, asm.Word),
		asm.StoreMem(asm.RFP, -20, asm.R7, asm.Word),
		mapPtr(asm.R1, mapPending),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapDeleteElem.Call(),
		asm.LoadMem(asm.R1, asm.R6, 8, asm.DWord),
		asm.JSLT.Imm(asm.R1, 0, "out"),
		asm.StoreMem(asm.RFP, -12, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.RFP, -8, asm.DWord),
		asm.RSh.Imm(asm.R1, 32),
		asm.StoreMem(asm.RFP, -16, asm.R1, asm.Word),
		mapPtr(asm.R1, mapFDs),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -16),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -20),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnMapUpdateElem.Call(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	}
}

// closeEnter forgets {tgid, fd} in gv_fds.
func closeEnter() asm.Instructions {
	return asm.Instructions{
		asm.FnGetCurrentPidTgid.Call(),
		asm.RSh.Imm(asm.R0, 32),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.Word),
		asm.LoadMem(asm.R1, asm.RFP, tpArg0, asm.DWord),
		asm.StoreMem(asm.RFP, -4, asm.R1, asm.Word),
		mapPtr(asm.R1, mapFDs),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapDeleteElem.Call(),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	}
}

// rxeOffsets are byte offsets into rdma_rxe's and ib_core's structures,
// read from the kernel's BTF.
type rxeOffsets struct {
	qpNum            int32 // rxe_qp.ibqp.qp_num (u32)
	qpDevice         int32 // rxe_qp.ibqp.device (struct ib_device *)
	devName          int32 // ib_device.name (char[64])
	needRetry        int32 // rxe_qp.req.need_retry (int)
	retransTimer     int32 // rxe_qp.retrans_timer (struct timer_list)
	rnrNakTimer      int32 // rxe_qp.rnr_nak_timer
	cqIsUser         int32 // rxe_cq.is_user (bool)
	cqDevice         int32 // rxe_cq.ibcq.device
	skbCB            int32 // sk_buff.cb: rxe keeps its struct rxe_pkt_info there
	pktHdr           int32 // rxe_pkt_info.hdr (u8 *, the BTH)
	pktOpcode        int32 // rxe_pkt_info.opcode (u8)
	regArg0, regArg1 int16
}

// qpCount adds 1 to counter idx of the QP whose struct rxe_qp * is in R6.
// Stack: fp-24 key {name[16], qpn, pad}, fp-32 scratch, below: zero value.
func qpCount(o *rxeOffsets, idx int) asm.Instructions {
	return append(qpKey(o), qpAdd(idx)...)
}

// qpKey builds the gv_qps key of the QP whose struct rxe_qp * is in R6:
// its number at fp-8 and its device's name at fp-24. Stack: fp-32
// scratch. Clobbers R1-R5, R7.
func qpKey(o *rxeOffsets) asm.Instructions {
	in := append(asm.Instructions{stZero64(-8)}, readKernel(-8, 4, asm.R6, o.qpNum)...)
	in = append(in,
		asm.Mov.Reg(asm.R7, asm.R6),
		asm.Add.Imm(asm.R7, o.qpDevice),
	)
	return append(in, devName(o)...)
}

// devName reads ((struct ib_device *)*R7)->name into fp-24 (16 bytes).
func devName(o *rxeOffsets) asm.Instructions {
	in := readKernel(-32, 8, asm.R7, 0)
	in = append(in, asm.LoadMem(asm.R3, asm.RFP, -32, asm.DWord))
	return append(in, readKernel(-24, qpNameLen, asm.R3, o.devName)...)
}

// qpAdd adds 1 to word idx of gv_qps[key at fp-24].
func qpAdd(idx int) asm.Instructions {
	in := lookupOrInit(mapQPs, -24, int16(-32-8*qpValWords), 8*qpValWords)
	return append(in,
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, int16(8*idx)),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	)
}

// kprobeQP counts idx for a function whose first argument, minus sub, is a
// struct rxe_qp *.
func kprobeQP(o *rxeOffsets, idx int, sub int32) asm.Instructions {
	in := asm.Instructions{asm.LoadMem(asm.R6, asm.R1, o.regArg0, asm.DWord)}
	if sub != 0 {
		in = append(in, asm.Sub.Imm(asm.R6, sub))
	}
	return append(in, qpCount(o, idx)...)
}

// compQueue: rxe_comp_queue_pkt(struct rxe_qp *qp, struct sk_buff *skb)
// hands a response packet to the QP's completer. It counts the packet
// and, for an RC ACKNOWLEDGE whose AETH syndrome (the byte after the
// 12-byte BTH) is a NAK PSN sequence error (0x60) or an RNR NAK (0x2x),
// that NAK, per QP.
func compQueue(o *rxeOffsets) asm.Instructions {
	in := asm.Instructions{
		asm.LoadMem(asm.R6, asm.R1, o.regArg0, asm.DWord), // qp
		asm.LoadMem(asm.R8, asm.R1, o.regArg1, asm.DWord), // skb
		asm.Mov.Imm(asm.R9, 0),                            // 0: no NAK, else the counter's byte offset
		stZero64(-16),
	}
	in = append(in, readKernel(-16, 1, asm.R8, o.skbCB+o.pktOpcode)...)
	in = append(in,
		asm.LoadMem(asm.R1, asm.RFP, -16, asm.Byte),
		asm.JNE.Imm(asm.R1, 0x11, "count"), // IB_OPCODE_RC_ACKNOWLEDGE
	)
	in = append(in, readKernel(-16, 8, asm.R8, o.skbCB+o.pktHdr)...)
	in = append(in, asm.LoadMem(asm.R3, asm.RFP, -16, asm.DWord))
	in = append(in, readKernel(-16, 1, asm.R3, 12)...) // AETH syndrome
	in = append(in,
		asm.LoadMem(asm.R1, asm.RFP, -16, asm.Byte),
		asm.JNE.Imm(asm.R1, 0x60, "not_seq"),
		asm.Mov.Imm(asm.R9, 8*qpSeqNaks),
		asm.Ja.Label("count"),
		asm.And.Imm(asm.R1, 0xe0).WithSymbol("not_seq"),
		asm.JNE.Imm(asm.R1, 0x20, "count"),
		asm.Mov.Imm(asm.R9, 8*qpRNRNaks),
	)
	key := qpKey(o)
	key[0] = key[0].WithSymbol("count")
	in = append(in, key...)
	in = append(in, lookupOrInit(mapQPs, -24, int16(-32-8*qpValWords), 8*qpValWords)...)
	return append(in,
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 8*qpRecv),
		asm.JEq.Imm(asm.R9, 8*qpSeqNaks, "seq"),
		asm.JEq.Imm(asm.R9, 8*qpRNRNaks, "rnr"),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 8*qpSeqNaks).WithSymbol("seq"),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 8*qpRNRNaks).WithSymbol("rnr"),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	)
}

// requesterEntry counts a retry pass of rxe_requester: it runs req_retry
// (go back to the oldest unacknowledged PSN and resend) when need_retry is
// set on entry.
func requesterEntry(o *rxeOffsets) asm.Instructions {
	in := asm.Instructions{
		asm.LoadMem(asm.R6, asm.R1, o.regArg0, asm.DWord),
		stZero64(-8),
	}
	in = append(in, readKernel(-8, 4, asm.R6, o.needRetry)...)
	in = append(in,
		asm.LoadMem(asm.R1, asm.RFP, -8, asm.Word),
		asm.JNE.Imm(asm.R1, 0, "retry"),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("retry"),
	)
	return append(in, qpCount(o, qpRetries)...)
}

// cqPost counts a completion rxe_cq_post writes to a user CQ: the CQE is a
// struct ib_uverbs_wc { u64 wr_id; u32 status; u32 opcode; u32 vendor_err;
// u32 byte_len; u32 imm; u32 qp_num; ... }; opcode & 0x80 is a receive.
func cqPost(o *rxeOffsets) asm.Instructions {
	in := asm.Instructions{
		asm.LoadMem(asm.R6, asm.R1, o.regArg0, asm.DWord), // cq
		asm.LoadMem(asm.R8, asm.R1, o.regArg1, asm.DWord), // cqe
		stZero64(-8),
	}
	in = append(in, readKernel(-8, 1, asm.R6, o.cqIsUser)...)
	in = append(in,
		asm.LoadMem(asm.R1, asm.RFP, -8, asm.Byte),
		asm.JNE.Imm(asm.R1, 0, "user"),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	)
	// status, opcode at fp-48, fp-44; qp_num at fp-8
	user := readKernel(-48, 8, asm.R8, 8)
	user[0] = user[0].WithSymbol("user")
	in = append(in, user...)
	in = append(in, readKernel(-8, 4, asm.R8, 28)...)
	in = append(in,
		asm.LoadMem(asm.R8, asm.RFP, -48, asm.Word), // status
		asm.LoadMem(asm.R9, asm.RFP, -44, asm.Word), // opcode
		asm.Mov.Reg(asm.R7, asm.R6),
		asm.Add.Imm(asm.R7, o.cqDevice),
	)
	// devName clobbers R1-R5 only.
	in = append(in, devName(o)...)
	in = append(in, asm.JEq.Imm(asm.R8, 0, "status_ok"))
	in = append(in, qpAdd(qpErrorCompletions)...)
	in = append(in,
		asm.Mov.Reg(asm.R9, asm.R9).WithSymbol("status_ok"),
		asm.JSet.Imm(asm.R9, 0x80, "recv"),
	)
	in = append(in, relabel(qpAdd(qpSendCompletions), "s_")...)
	in = append(in, asm.Mov.Reg(asm.R9, asm.R9).WithSymbol("recv"))
	return append(in, relabel(qpAdd(qpRecvCompletions), "r_")...)
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

// uverbsOffsets are byte offsets into ib_uverbs' and the kernel's
// structures for the cq-events probe, read from the kernel's BTF.
type uverbsOffsets struct {
	cqDevice    int32 // ib_cq.device (struct ib_device *)
	devName     int32 // ib_device.name (char[64])
	qClosed     int32 // ib_uverbs_event_queue.is_closed (int)
	qEventList  int32 // ib_uverbs_event_queue.event_list (struct list_head)
	fileQueue   int32 // ib_uverbs_completion_event_file.ev_queue
	filePrivate int32 // file.private_data
	ufileDevice int32 // ib_uverbs_file.device (struct ib_uverbs_device *)
	udevDevnum  int32 // ib_uverbs_device.devnum (u32: the N of uverbsN)
	fileInode   int32 // file.f_inode (struct inode *)
	inodeRdev   int32 // inode.i_rdev (dev_t)
	pids        bool  // a pid filter is configured (Options.PIDs)
	regArg0     int16
	regArg1     int16
	regArg2     int16
	regRet      int16 // a kretprobe's return value; see ret
	fexit       bool  // offsets for fentry/fexit programs (tracing)
}

// The cq-events probe pairs each completion event the kernel raises with
// the read() that hands it to the process. ib_uverbs_comp_handler(cq,
// ev_queue) appends an event to the channel's queue (a FIFO, one event per
// armed CQ's next completion) and wakes the readers;
// ib_uverbs_comp_event_read(filp, ...) takes the oldest event off. So the
// handler numbers the events of each queue 1, 2, 3, ... and stamps them in
// the queue's ring of evRing stamps (gv_evq: no map update per event), and
// each successful read takes the next number. Events raised before Attach,
// or more than evRing events behind, or of a queue the LRU map dropped, are
// counted as unmatched reads, with no latency. Whenever a read leaves the
// kernel's queue empty while no handler is running (gv_evinfl: the
// handler's entry program counts up, its exit program down; the handler is
// stamped on entry, before it queues the event), every event raised before
// the read looked has been read, and the numbering is resynchronised
// (consumed = raised): a miscount (an event dropped by the kernel, a
// backlog from before Attach) does not outlive one burst of events.
//
// gv_evq value: raised u64, consumed u64, device name[16], stamps[evRing].
const (
	evRing   = 16
	evqName  = 16
	evqStamp = 32
	evqSize  = evqStamp + 8*evRing
)

// compHandler: entry of ib_uverbs_comp_handler(struct ib_cq *cq, void
// *cq_context); cq_context is the channel's struct ib_uverbs_event_queue
// (NULL for a CQ without a channel). A queue seen for the first time gets
// its gv_evq record with the device's name.
//
// Stack: fp-32 gv_raised key (name), fp-48 q (gv_evq key), fp-72 scratch,
// fp-80 zero u64, fp-256 a new gv_evq value.
func compHandler(u *uverbsOffsets) asm.Instructions {
	in := asm.Instructions{
		asm.LoadMem(asm.R7, asm.R1, u.regArg1, asm.DWord), // ev_queue
		asm.LoadMem(asm.R6, asm.R1, u.regArg0, asm.DWord), // cq
	}
	in = append(in, inflightAdd(1)...)
	in = append(in,
		asm.JNE.Imm(asm.R7, 0, "have_q"),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
		stZero64(-72).WithSymbol("have_q"),
	)
	in = append(in, readKernel(-72, 4, asm.R7, u.qClosed)...)
	in = append(in,
		asm.LoadMem(asm.R1, asm.RFP, -72, asm.Word),
		asm.JEq.Imm(asm.R1, 0, "open"),
		asm.Mov.Imm(asm.R0, 0), // the handler drops the event
		asm.Return(),
		asm.StoreMem(asm.RFP, -48, asm.R7, asm.DWord).WithSymbol("open"),
		mapPtr(asm.R1, mapEvQueues),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -48),
		asm.FnMapLookupElem.Call(),
		asm.JNE.Imm(asm.R0, 0, "have_rec"),
	)
	// A new queue: its record, named cq->device->name.
	for off := int16(0); off < evqSize; off += 8 {
		in = append(in, stZero64(-256+off))
	}
	in = append(in, readKernel(-72, 8, asm.R6, u.cqDevice)...)
	in = append(in, asm.LoadMem(asm.R3, asm.RFP, -72, asm.DWord))
	in = append(in, readKernel(-256+evqName, qpNameLen, asm.R3, u.devName)...)
	in = append(in,
		mapPtr(asm.R1, mapEvQueues),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -48),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -256),
		asm.Mov.Imm(asm.R4, 1), // BPF_NOEXIST: another CPU may have made it
		asm.FnMapUpdateElem.Call(),
		mapPtr(asm.R1, mapEvQueues),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -48),
		asm.FnMapLookupElem.Call(),
		asm.JNE.Imm(asm.R0, 0, "have_rec"),
		asm.Return(), // R0 == 0
		// seq = ++raised; stamps[seq % evRing] = now
		asm.Mov.Reg(asm.R8, asm.R0).WithSymbol("have_rec"),
		asm.Mov.Imm(asm.R1, 1),
		fetchAdd64(asm.R8, asm.R1, 0), // R1 = events raised before this one
		asm.Add.Imm(asm.R1, 1),
		asm.And.Imm(asm.R1, evRing-1),
		asm.LSh.Imm(asm.R1, 3),
		asm.Mov.Reg(asm.R6, asm.R8),
		asm.Add.Reg(asm.R6, asm.R1),
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(asm.R6, evqStamp, asm.R0, asm.DWord),
		asm.LoadMem(asm.R1, asm.R8, evqName, asm.DWord),
		asm.StoreMem(asm.RFP, -32, asm.R1, asm.DWord),
		asm.LoadMem(asm.R1, asm.R8, evqName+8, asm.DWord),
		asm.StoreMem(asm.RFP, -24, asm.R1, asm.DWord),
	)
	in = append(in, relabel(lookupOrInit(mapRaised, -32, -80, 8), "r_")...)
	return append(in,
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 0),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	)
}

// inflightAdd adds d to gv_evinfl[0]. Stack: fp-4; clobbers R0-R5.
func inflightAdd(d int32) asm.Instructions {
	return asm.Instructions{
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		mapPtr(asm.R1, mapEvInfl),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "infl_done"),
		asm.Mov.Imm(asm.R1, d),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 0),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("infl_done"),
	}
}

// compHandlerExit: kretprobe on ib_uverbs_comp_handler: the event is
// queued (or dropped).
func compHandlerExit() asm.Instructions {
	return append(inflightAdd(-1), asm.Return())
}

// compReadEnter: kprobe on ib_uverbs_comp_event_read(struct file *filp,
// ...): remember the channel's event queue (filp->private_data is the
// struct ib_uverbs_completion_event_file) under pid_tgid, for processes
// that pass the pid filter.
//
// Stack: fp-8 pid_tgid, fp-16 ev_queue.
func compReadEnter(u *uverbsOffsets) asm.Instructions {
	in := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.FnGetCurrentPidTgid.Call(),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.RSh.Imm(asm.R8, 32),
	}
	in = append(in, pidFilter(asm.R8)...)
	in = append(in, asm.LoadMem(asm.R7, asm.R6, u.regArg0, asm.DWord))
	in = append(in, eventQueue(u, asm.R7, asm.R1)...)
	return append(in,
		asm.StoreMem(asm.RFP, -16, asm.R1, asm.DWord),
		mapPtr(asm.R1, mapEvRead),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -16),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnMapUpdateElem.Call(),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	)
}

// compReadExit: kretprobe on ib_uverbs_comp_event_read. A read that
// returned an event (> 0 bytes) takes the queue's next event number; its
// latency (now - the handler's stamp) goes into gv_events under {device,
// tgid}.
//
// Registers: R6 ctx, R7 ev_queue, R8 gv_evq value, R9 now. Stack: fp-8
// pid_tgid, then the pend key's seq; fp-16 pend key q; fp-24 scratch; fp-32
// the raised count when the read looked; fp-48
// latency (-1: unmatched); fp-72 gv_events key {name[16], tgid, pad}; below
// it the zero gv_events value.
func compReadExit(u *uverbsOffsets) asm.Instructions {
	in := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.FnGetCurrentPidTgid.Call(),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
		stZero64(-72),
		stZero64(-64),
		stZero64(-56),
		asm.RSh.Imm(asm.R0, 32),
		asm.StoreMem(asm.RFP, -56, asm.R0, asm.Word),
		mapPtr(asm.R1, mapEvRead),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapLookupElem.Call(),
		asm.JNE.Imm(asm.R0, 0, "reading"),
		asm.Return(), // R0 == 0
		asm.LoadMem(asm.R7, asm.R0, 0, asm.DWord).WithSymbol("reading"),
		mapPtr(asm.R1, mapEvRead),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapDeleteElem.Call(),
		asm.LoadMem(asm.R1, asm.R6, u.regRet, asm.DWord),
		asm.JSGT.Imm(asm.R1, 0, "got_event"),
		asm.Mov.Imm(asm.R0, 0), // EAGAIN (the fd is non-blocking), EINTR, ...
		asm.Return(),
	}
	return append(in, compReadEvent(u)...)
}

// compReadFexit: fexit of ib_uverbs_comp_event_read(struct file *filp,
// char __user *buf, size_t count, loff_t *pos), which sees the arguments
// and the return value in one program: compReadEnter and compReadExit
// together, and a read that found no event (EAGAIN: goverbs' channel fds
// are non-blocking) returns at once. Registers and stack as in
// compReadExit.
func compReadFexit(u *uverbsOffsets) asm.Instructions {
	in := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R1, asm.R6, u.ret(4), asm.DWord),
		asm.JSGT.Imm(asm.R1, 0, "read_one"),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
		asm.FnGetCurrentPidTgid.Call().WithSymbol("read_one"),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.RSh.Imm(asm.R8, 32),
	}
	if u.pids {
		in = append(in, pidFilter(asm.R8)...)
	}
	in = append(in,
		stZero64(-72),
		stZero64(-64),
		stZero64(-56),
		asm.StoreMem(asm.RFP, -56, asm.R8, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, u.regArg0, asm.DWord),
	)
	in = append(in, eventQueue(u, asm.R3, asm.R7)...)
	in = append(in, asm.Mov.Imm(asm.R0, 0))
	return append(in, compReadEvent(u)...)
}

// eventQueue sets dst to the completion channel's event queue of the
// struct file * in filp: &((struct ib_uverbs_completion_event_file
// *)filp->private_data)->ev_queue; it exits if there is none. Stack:
// fp-16. Clobbers R0-R5.
func eventQueue(u *uverbsOffsets, filp, dst asm.Register) asm.Instructions {
	in := append(asm.Instructions{stZero64(-16)}, readKernel(-16, 8, filp, u.filePrivate)...)
	return append(in,
		asm.LoadMem(dst, asm.RFP, -16, asm.DWord),
		asm.JNE.Imm(dst, 0, "have_file"),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
		asm.Add.Imm(dst, u.fileQueue).WithSymbol("have_file"),
	)
}

// compReadEvent is the common part of compReadExit and compReadFexit: a
// read of the queue in R7 returned an event.
func compReadEvent(u *uverbsOffsets) asm.Instructions {
	in := asm.Instructions{
		asm.FnKtimeGetNs.Call().WithSymbol("got_event"),
		asm.Mov.Reg(asm.R9, asm.R0),
		asm.Mov.Imm(asm.R1, -1),
		asm.StoreMem(asm.RFP, -48, asm.R1, asm.DWord),
		asm.StoreMem(asm.RFP, -16, asm.R7, asm.DWord),
		mapPtr(asm.R1, mapEvQueues),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -16),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "stats"), // no event of this queue was seen raised
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.LoadMem(asm.R1, asm.R8, evqName, asm.DWord),
		asm.StoreMem(asm.RFP, -72, asm.R1, asm.DWord),
		asm.LoadMem(asm.R1, asm.R8, evqName+8, asm.DWord),
		asm.StoreMem(asm.RFP, -64, asm.R1, asm.DWord),
		asm.LoadMem(asm.R1, asm.R8, 0, asm.DWord), // raised
		asm.StoreMem(asm.RFP, -32, asm.R1, asm.DWord),
		asm.LoadMem(asm.R2, asm.R8, 8, asm.DWord), // consumed
		asm.JGE.Reg(asm.R2, asm.R1, "sync"),
		asm.Add.Imm(asm.R2, 1),
		asm.StoreMem(asm.RFP, -8, asm.R2, asm.DWord),
		asm.Mov.Reg(asm.R3, asm.R1),
		asm.Sub.Reg(asm.R3, asm.R2),
		asm.JGE.Imm(asm.R3, evRing, "consume"), // its stamp was overwritten: unmatched
		asm.And.Imm(asm.R2, evRing-1),
		asm.LSh.Imm(asm.R2, 3),
		asm.Add.Reg(asm.R2, asm.R8),
		asm.LoadMem(asm.R1, asm.R2, evqStamp, asm.DWord),
		asm.JGT.Reg(asm.R1, asm.R9, "sync"), // raised after this read began: an older event was read
		asm.Mov.Reg(asm.R2, asm.R9),
		asm.Sub.Reg(asm.R2, asm.R1),
		asm.StoreMem(asm.RFP, -48, asm.R2, asm.DWord),
		asm.LoadMem(asm.R1, asm.RFP, -8, asm.DWord).WithSymbol("consume"),
		asm.StoreMem(asm.R8, 8, asm.R1, asm.DWord),
		// The kernel queue empty, then no handler running: every event
		// raised before the count was read (fp-32) has been read.
		stZero64(-24).WithSymbol("sync"),
	}
	in = append(in, readKernel(-24, 8, asm.R7, u.qEventList)...)
	in = append(in,
		asm.LoadMem(asm.R1, asm.RFP, -24, asm.DWord),
		asm.Mov.Reg(asm.R2, asm.R7),
		asm.Add.Imm(asm.R2, u.qEventList),
		asm.JNE.Reg(asm.R1, asm.R2, "stats"),
		asm.StoreImm(asm.RFP, -24, 0, asm.Word),
		mapPtr(asm.R1, mapEvInfl),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -24),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "stats"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.JSGT.Imm(asm.R1, 0, "stats"),
		asm.LoadMem(asm.R1, asm.RFP, -32, asm.DWord),
		asm.StoreMem(asm.R8, 8, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("stats"),
	)
	in = append(in, lookupOrInit(mapEvents, -72, int16(-72-8*evValWords), 8*evValWords)...)
	in = append(in,
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.LoadMem(asm.R8, asm.RFP, -48, asm.DWord),
		asm.Mov.Imm(asm.R1, 1),
		asm.JNE.Imm(asm.R8, -1, "matched"),
		asm.AddAtomic.Mem(asm.R7, asm.R1, asm.DWord, 8),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
		asm.AddAtomic.Mem(asm.R7, asm.R1, asm.DWord, 0).WithSymbol("matched"),
		asm.AddAtomic.Mem(asm.R7, asm.R8, asm.DWord, 16),
	)
	in = append(in, log2(asm.R8, asm.R2, asm.R3)...)
	return append(in,
		asm.JLE.Imm(asm.R2, numBuckets-1, "inrange"),
		asm.Mov.Imm(asm.R2, numBuckets-1),
		asm.LSh.Imm(asm.R2, 3).WithSymbol("inrange"),
		asm.Add.Reg(asm.R7, asm.R2),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R7, asm.R1, asm.DWord, 24),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	)
}

// Syscall numbers (amd64).
const (
	nrWrite  = 1
	nrClose  = 3
	nrIoctl  = 16
	nrOpenat = 257
	// sysArgRegs is the offset of dx in struct pt_regs: dx, si, di are the
	// third, second and first syscall arguments.
	sysArgRegs = 96
)

// sysEnter is the raw tracepoint program on sys_enter: it dispatches on
// the syscall number to the uverbs fd tracking (openat, close) and the
// command probes (ioctl, write) enabled in which.
func sysEnter(which map[string]bool) asm.Instructions {
	in := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R7, asm.R6, 8, asm.DWord),
	}
	type sec struct {
		nr    int32
		name  string
		insns func() asm.Instructions
	}
	secs := []sec{
		{nrIoctl, "ioctl", ioctlEnter},
		{nrWrite, "write", writeEnter},
		{nrOpenat, "openat", openatEnter},
		{nrClose, "close", closeEnter},
	}
	for _, s := range secs {
		if which[s.name] {
			in = append(in, asm.JEq.Imm(asm.R7, s.nr, "args"))
		}
	}
	in = append(in,
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
		// Copy dx, si, di to fp-88, fp-80, fp-72.
		asm.LoadMem(asm.R3, asm.R6, 0, asm.DWord).WithSymbol("args"),
	)
	in = append(in, readKernel(tpArg2, 24, asm.R3, sysArgRegs)...)
	in = append(in,
		asm.JEq.Imm(asm.R0, 0, "dispatch"),
		asm.Return(),
		asm.LoadMem(asm.R7, asm.R6, 8, asm.DWord).WithSymbol("dispatch"),
	)
	for _, s := range secs {
		if which[s.name] {
			in = append(in, asm.JEq.Imm(asm.R7, s.nr, s.name+"_"))
		}
	}
	in = append(in, asm.Mov.Imm(asm.R0, 0), asm.Return())
	for _, s := range secs {
		if !which[s.name] {
			continue
		}
		body := relabel(s.insns(), s.name+"_")
		body[0] = body[0].WithSymbol(s.name + "_")
		in = append(in, body...)
	}
	return in
}

// startLookup begins an exit program (kretprobe, sys_exit): R6 = ctx,
// fp-8 = pid_tgid, and on to "cmd_" with R0 = the gv_start record of a
// command in flight; else falls through (R0 = 0).
func startLookup() asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.FnGetCurrentPidTgid.Call(),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
		mapPtr(asm.R1, mapStart),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapLookupElem.Call(),
		asm.JNE.Imm(asm.R0, 0, "cmd_"),
	}
}

// sysExit is the raw tracepoint program on sys_exit: it finishes a command
// sysEnter started, or an openat of a uverbs device.
func sysExit() asm.Instructions {
	in := append(startLookup(),
		mapPtr(asm.R1, mapPending),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapLookupElem.Call(),
		asm.JNE.Imm(asm.R0, 0, "open_"),
		asm.Return(),
	)
	cmd := relabel(syscallExit(8), "cmd_") // struct { regs; long ret }
	cmd[0] = cmd[0].WithSymbol("cmd_")
	open := relabel(openatExit(), "open_")
	open[0] = open[0].WithSymbol("open_")
	in = append(in, cmd...)
	return append(in, open...)
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

// stZero64 stores a zero u64 on the stack (asm.StoreImm refuses DWord,
// but BPF_ST|BPF_MEM|BPF_DW with a sign-extended imm is a valid insn).
func stZero64(off int16) asm.Instruction {
	return asm.Instruction{OpCode: asm.StoreImmOp(asm.DWord), Dst: asm.RFP, Offset: off}
}
