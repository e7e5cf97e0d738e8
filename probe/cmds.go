package probe

import "github.com/cilium/ebpf/asm"

// The uverbs-commands probe: every uverbs command a process issues, as
// gv_cmds[{tgid, fd, device | kind<<16, command}] += {1 call, 1 error if
// it failed, its ns, its log2(ns) bucket}. An entry program stores a
// start value (the key and a stamp) for the thread, the exit program
// counts it. Two ways to attach, whichever the kernel allows:
//
//   - on ib_uverbs_ioctl and ib_uverbs_write (uverbsCmdEnter,
//     uverbsCmdExit), fentry/fexit (the start value in task storage) or
//     kprobes (the start value in gv_start under pid_tgid); only uverbs
//     commands run them;
//   - on the sys_enter and sys_exit raw tracepoints (sysEnter, sysExit),
//     for every system call: the programs follow openat of
//     /dev/infiniband/uverbsN and close to know the uverbs fds (gv_fds),
//     and time the ioctls and writes on them.

// Stack slots of the command programs.
const (
	slotPidTgid = -8  // u64 bpf_get_current_pid_tgid()
	slotFDKey   = -16 // gv_fds key {u32 tgid; u32 fd}
	slotStart   = -40 // the start value (startSize bytes), fields below
	slotUser    = -48 // 8 bytes read from user or kernel memory
	// slotPidFilter = -60: pidFilter's key
	// tpArg2, tpArg1, tpArg0 = -88, -80, -72: the syscall's arguments (sys_enter)

	// At exit: the gv_cmds key (cmdKeySize), the start value's first 16
	// bytes, and below it a zero gv_cmds value for lookupOrInit.
	slotCmdKey  = -32
	slotCmdZero = slotCmdKey - 8*cmdValWords

	// openat and close (gv_fds upkeep).
	slotPath     = -48 // openat's path, 32 bytes (to -16)
	slotNewMinor = -52 // u32 N of the uverbsN being opened, gv_pending value
	slotMinor    = -20 // u32 N of uverbsN, gv_fds value
	slotCloseKey = -8  // gv_fds key {u32 tgid; u32 fd} (close's)
)

// The start value (gv_start, gv_tstart): its fields' offsets.
const (
	startTgid  = 0  // u32
	startFD    = 4  // u32 (-1 when the program cannot know it)
	startDev   = 8  // u32 device | kind<<16: the N of uverbsN, unknownDev, or devMinorFlag|the char device's minor
	startCmd   = 12 // u32 ioctl object<<16 | method, or write command
	startStamp = 16 // u64 bpf_ktime_get_ns() at entry; 0 in gv_tstart: none in flight
)

// The gv_cmds value: calls, errors, total ns, then the histogram at histOff.
const (
	cmdCalls  = 0
	cmdErrors = 8
	cmdNs     = 16
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

// sysEnter is the raw tracepoint program on sys_enter, for the syscalls
// enabled in which:
//
//	nr = ctx->id;
//	if (nr is not one of which) return 0;
//	bpf_probe_read_kernel(&fp[tpArg2], 24, &ctx->regs->dx); // dx, si, di
//	switch (nr) { ioctl: ioctlEnter; write: writeEnter; openat: openatEnter; close: closeEnter }
//
// Registers: R6 ctx.
func sysEnter(which map[string]bool) asm.Instructions {
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
	// jumps is `if (nr == N) goto target(name)` for each enabled syscall.
	jumps := func(target func(name string) string) asm.Instructions {
		var in asm.Instructions
		for _, s := range secs {
			if which[s.name] {
				in = append(in, asm.JEq.Imm(asm.R7, s.nr, target(s.name)))
			}
		}
		return in
	}
	in := seq(
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R7, asm.R6, 8, asm.DWord), // id
		jumps(func(string) string { return "args" }),
		ret0(),
		label("args", seq(
			asm.LoadMem(asm.R3, asm.R6, 0, asm.DWord), // regs
			readKernel(tpArg2, 24, asm.R3, sysArgRegs),
		)),
		asm.JEq.Imm(asm.R0, 0, "dispatch"),
		asm.Return(),
		asm.LoadMem(asm.R7, asm.R6, 8, asm.DWord).WithSymbol("dispatch"),
		jumps(func(name string) string { return name + "_" }),
		ret0(),
	)
	for _, s := range secs {
		if which[s.name] {
			in = append(in, label(s.name+"_", relabel(s.insns(), s.name+"_"))...)
		}
	}
	return in
}

// ioctlEnter: sys_enter of ioctl.
//
//	if ((u32)arg1 != RDMA_VERBS_IOCTL) return 0;
//	fp[slotPidTgid] = bpf_get_current_pid_tgid(); tgid = that >> 32;
//	pidFilter;
//	start = {tgid, fd = arg0, dev = gv_fds[{tgid, fd}] ?: unknownDev | kindIoctl<<16,
//	         cmd = ((struct ib_uverbs_ioctl_hdr *)arg2)->object_id<<16 | method_id};
//	storeStart;
//
// Registers: R7 cmd, then fd; R8 tgid.
func ioctlEnter() asm.Instructions {
	return seq(
		asm.LoadMem(asm.R7, asm.RFP, tpArg1, asm.DWord),
		asm.LoadImm(asm.R1, rdmaVerbsIoctl, asm.DWord),
		asm.JEq.Reg32(asm.R7, asm.R1, "is_verbs"),
		ret0(),
		label("is_verbs", currentPidTgid(slotPidTgid, asm.R8)),
		pidFilter(asm.R8),
		asm.LoadMem(asm.R7, asm.RFP, tpArg0, asm.DWord), // fd
		asm.StoreMem(asm.RFP, slotFDKey, asm.R8, asm.Word),
		asm.StoreMem(asm.RFP, slotFDKey+4, asm.R7, asm.Word),
		asm.StoreMem(asm.RFP, slotStart+startTgid, asm.R8, asm.Word),
		asm.StoreMem(asm.RFP, slotStart+startFD, asm.R7, asm.Word),
		asm.StoreImm(asm.RFP, slotStart+startDev, kindIoctl<<16|unknownDev, asm.Word),
		mapLookup(mapFDs, slotFDKey),
		asm.JEq.Imm(asm.R0, 0, "nodev"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.And.Imm(asm.R1, 0xffff),
		asm.Or.Imm(asm.R1, kindIoctl<<16),
		asm.StoreMem(asm.RFP, slotStart+startDev, asm.R1, asm.Word),
		asm.LoadMem(asm.R3, asm.RFP, tpArg2, asm.DWord).WithSymbol("nodev"),
		userCommand(true),
		storeStart(),
	)
}

// writeEnter: sys_enter of write, on an fd in gv_fds; the command is the
// first word of the buffer (struct ib_uverbs_cmd_hdr).
//
//	fp[slotPidTgid] = bpf_get_current_pid_tgid(); tgid = that >> 32;
//	dev = gv_fds[{tgid, fd = arg0}]; if (!dev) return 0;
//	pidFilter;
//	start = {tgid, fd, *dev | kindWrite<<16, cmd = *(u32 *)arg1 & writeCmdMask};
//	storeStart;
//
// Registers: R7 fd, R8 tgid, R9 device.
func writeEnter() asm.Instructions {
	return seq(
		currentPidTgid(slotPidTgid, asm.R8),
		asm.LoadMem(asm.R7, asm.RFP, tpArg0, asm.DWord),
		asm.StoreMem(asm.RFP, slotFDKey, asm.R8, asm.Word),
		asm.StoreMem(asm.RFP, slotFDKey+4, asm.R7, asm.Word),
		mapLookup(mapFDs, slotFDKey),
		asm.JNE.Imm(asm.R0, 0, "is_uverbs"),
		asm.Return(),
		asm.LoadMem(asm.R9, asm.R0, 0, asm.Word).WithSymbol("is_uverbs"),
		pidFilter(asm.R8),
		asm.StoreMem(asm.RFP, slotStart+startTgid, asm.R8, asm.Word),
		asm.StoreMem(asm.RFP, slotStart+startFD, asm.R7, asm.Word),
		asm.And.Imm(asm.R9, 0xffff),
		asm.Or.Imm(asm.R9, kindWrite<<16),
		asm.StoreMem(asm.RFP, slotStart+startDev, asm.R9, asm.Word),
		asm.LoadMem(asm.R3, asm.RFP, tpArg1, asm.DWord),
		userCommand(false),
		storeStart(),
	)
}

// userCommand sets the start value's command from the user buffer in R3:
//
//	ioctl: struct ib_uverbs_ioctl_hdr { u16 length; u16 object_id; u32 method_id; ... }
//	       start.cmd = object_id<<16 | (method_id & 0xffff);
//	write: struct ib_uverbs_cmd_hdr { u32 command; ... }
//	       start.cmd = command & writeCmdMask;
//
// The header is read to fp[slotUser]. Clobbers R0-R5.
func userCommand(ioctl bool) asm.Instructions {
	size := int32(4)
	if ioctl {
		size = 8
	}
	in := seq(
		zeroStack(slotUser, 8),
		fpAddr(asm.R1, slotUser),
		asm.Mov.Imm(asm.R2, size),
		asm.FnProbeReadUser.Call(),
	)
	if ioctl {
		in = append(in,
			asm.LoadMem(asm.R1, asm.RFP, slotUser+2, asm.Half), // object_id
			asm.LSh.Imm(asm.R1, 16),
			asm.LoadMem(asm.R2, asm.RFP, slotUser+4, asm.Word), // method_id
			asm.And.Imm(asm.R2, 0xffff),
			asm.Or.Reg(asm.R1, asm.R2),
		)
	} else {
		in = append(in,
			asm.LoadMem(asm.R1, asm.RFP, slotUser, asm.Word),
			asm.LoadImm(asm.R2, writeCmdMask, asm.DWord),
			asm.And.Reg(asm.R1, asm.R2),
		)
	}
	return append(in, asm.StoreMem(asm.RFP, slotStart+startCmd, asm.R1, asm.Word))
}

// storeStart is `start.stamp = bpf_ktime_get_ns(); gv_start[pid_tgid] =
// start (counted if full: mapUpdateCounted); return 0`.
func storeStart() asm.Instructions {
	return seq(
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(asm.RFP, slotStart+startStamp, asm.R0, asm.DWord),
		mapUpdateCounted(mapStart, slotPidTgid, slotStart),
		ret0(),
	)
}

// storeStartTask is storeStart for fentry programs, in the task's
// gv_tstart record, a task local storage (no hash update per call,
// nothing to delete):
//
//	start.stamp = bpf_ktime_get_ns();
//	*bpf_task_storage_get(&gv_tstart, current, 0, F_CREATE) = start; return 0;
func storeStartTask() asm.Instructions {
	return seq(
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(asm.RFP, slotStart+startStamp, asm.R0, asm.DWord),
		taskStart(true),
		copyWords(asm.R0, 0, asm.RFP, slotStart, startSize/8),
		ret0(),
	)
}

// taskStart is `r0 = bpf_task_storage_get(&gv_tstart,
// bpf_get_current_task_btf(), 0, create ? F_CREATE : 0); if (!r0) return
// 0`. Clobbers R1-R5.
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

// uverbsCmdEnter is the entry program (fentry or kprobe) of
// ib_uverbs_write(struct file *filp, const char __user *buf, ...) or, with
// ioctl, ib_uverbs_ioctl(struct file *filp, unsigned int cmd, unsigned long
// arg): only uverbs commands run it, not every system call.
//
//	if (ioctl && (u32)cmd != RDMA_VERBS_IOCTL) return 0;
//	fp[slotPidTgid] = bpf_get_current_pid_tgid(); tgid = that >> 32;
//	pidFilter (if Options.PIDs);
//	start = {tgid, fd = -1 (not known here), dev = unknownDev | kind<<16};
//	fentry: if (filp->f_inode) start.dev = filp->f_inode->i_rdev minor | devMinorFlag | kind<<16;
//	kprobe: start.dev = filp->private_data->device->devnum | kind<<16 (read with
//	        bpf_probe_read_kernel, each pointer checked), unless one is NULL;
//	userCommand(ioctl ? arg : buf);
//	fentry: storeStartTask; kprobe: storeStart;
//
// Registers: R6 ctx, R7 filp, R8 tgid.
func uverbsCmdEnter(u *uverbsOffsets, ioctl bool) asm.Instructions {
	kind := int32(kindWrite)
	in := asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1)}
	if ioctl {
		kind = kindIoctl
		in = seq(in,
			asm.LoadMem(asm.R1, asm.R6, u.regArg1, asm.DWord),
			asm.LoadImm(asm.R2, rdmaVerbsIoctl, asm.DWord),
			asm.JEq.Reg32(asm.R1, asm.R2, "is_verbs"),
			ret0(),
			asm.Mov.Imm(asm.R0, 0).WithSymbol("is_verbs"),
		)
	}
	in = append(in, currentPidTgid(slotPidTgid, asm.R8)...)
	if u.pids {
		in = append(in, pidFilter(asm.R8)...)
	}
	in = append(in,
		asm.StoreMem(asm.RFP, slotStart+startTgid, asm.R8, asm.Word),
		asm.StoreImm(asm.RFP, slotStart+startFD, -1, asm.Word),
		asm.StoreImm(asm.RFP, slotStart+startDev, int64(kind<<16|unknownDev), asm.Word),
		asm.LoadMem(asm.R7, asm.R6, u.regArg0, asm.DWord), // filp
	)
	if u.fexit {
		// filp is a BTF pointer: load filp->f_inode->i_rdev directly (no
		// helper calls).
		in = append(in,
			asm.LoadMem(asm.R1, asm.R7, int16(u.fileInode), asm.DWord),
			asm.JEq.Imm(asm.R1, 0, "nodev"),
			asm.LoadMem(asm.R1, asm.R1, int16(u.inodeRdev), asm.Word),
			asm.And.Imm(asm.R1, devMinorFlag-1),
			asm.Or.Imm(asm.R1, kind<<16|devMinorFlag),
			asm.StoreMem(asm.RFP, slotStart+startDev, asm.R1, asm.Word),
		)
	} else {
		// r3 = filp; for each of private_data, device, devnum:
		// fp[slotUser] = 0; if (!r3) goto nodev; read r3->field to
		// fp[slotUser]; r3 = fp[slotUser].
		in = append(in, asm.Mov.Reg(asm.R3, asm.R7))
		for i, field := range []struct {
			off  int32
			size int32
		}{{u.filePrivate, 8}, {u.ufileDevice, 8}, {u.udevDevnum, 4}} {
			if i > 0 {
				in = append(in, asm.LoadMem(asm.R3, asm.RFP, slotUser, asm.DWord))
			}
			in = append(in, seq(
				zeroStack(slotUser, 8),
				asm.JEq.Imm(asm.R3, 0, "nodev"),
				readKernel(slotUser, field.size, asm.R3, field.off),
				asm.JNE.Imm(asm.R0, 0, "nodev"),
			)...)
		}
		in = append(in,
			asm.LoadMem(asm.R1, asm.RFP, slotUser, asm.Word),
			asm.And.Imm(asm.R1, 0xffff),
			asm.Or.Imm(asm.R1, kind<<16),
			asm.StoreMem(asm.RFP, slotStart+startDev, asm.R1, asm.Word),
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
//
//	fexit:   start = bpf_task_storage_get(&gv_tstart, current, 0, 0);
//	         if (!start || !start->stamp) return 0; // filtered out, or attached in between
//	         cmdDone; start->stamp = 0; cmdCount;
//	kretprobe: start = gv_start[pid_tgid]; if (!start) return 0; syscallExit;
//
// Registers: R6 ctx, R7 the task's start value (fexit).
func uverbsCmdExit(u *uverbsOffsets, nargs int) asm.Instructions {
	if !u.fexit {
		return seq(
			startLookup(),
			asm.Return(),
			label("cmd_", relabel(syscallExit(u.ret(nargs)), "cmd_")),
		)
	}
	return seq(
		asm.Mov.Reg(asm.R6, asm.R1),
		taskStart(false),
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.LoadMem(asm.R1, asm.R0, startStamp, asm.DWord),
		asm.JNE.Imm(asm.R1, 0, "started"),
		ret0(),
		label("started", cmdDone(u.ret(nargs))),
		zero64(asm.R7, startStamp),
		cmdCount(),
	)
}

// startLookup begins an exit program (kretprobe, sys_exit):
//
//	fp[slotPidTgid] = bpf_get_current_pid_tgid();
//	r0 = gv_start[pid_tgid]; if (r0) goto cmd_;
//
// and falls through with R6 = ctx, R0 = 0.
func startLookup() asm.Instructions {
	return seq(
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.FnGetCurrentPidTgid.Call(),
		asm.StoreMem(asm.RFP, slotPidTgid, asm.R0, asm.DWord),
		mapLookup(mapStart, slotPidTgid),
		asm.JNE.Imm(asm.R0, 0, "cmd_"),
	)
}

// sysExit is the raw tracepoint program on sys_exit (ctx: struct { regs;
// long ret }):
//
//	startLookup;                   // a command sysEnter started: syscallExit
//	if (!gv_pending[pid_tgid]) return 0;
//	openatExit;                    // an openat of a uverbs device
func sysExit() asm.Instructions {
	return seq(
		startLookup(),
		mapLookup(mapPending, slotPidTgid),
		asm.JNE.Imm(asm.R0, 0, "open_"),
		asm.Return(),
		label("cmd_", relabel(syscallExit(8), "cmd_")),
		label("open_", relabel(openatExit(), "open_")),
	)
}

// syscallExit ends a command whose start value (gv_start) is in R0:
//
//	cmdDone; bpf_map_delete_elem(&gv_start, &pid_tgid); cmdCount;
//
// retOff: the offset of the return value in the context (R6).
func syscallExit(retOff int16) asm.Instructions {
	return seq(
		cmdDone(retOff),
		mapDelete(mapStart, slotPidTgid),
		cmdCount(),
	)
}

// cmdDone reads the start value in R0:
//
//	fp[slotCmdKey] = start's key (16 bytes);
//	r8 = bpf_ktime_get_ns() - start->stamp; r9 = the return value (ctx + retOff);
//
// Clobbers R0-R5.
func cmdDone(retOff int16) asm.Instructions {
	return seq(
		copyWords(asm.RFP, slotCmdKey, asm.R0, 0, cmdKeySize/8),
		asm.LoadMem(asm.R8, asm.R0, startStamp, asm.DWord),
		asm.FnKtimeGetNs.Call(),
		asm.Sub.Reg(asm.R0, asm.R8),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.LoadMem(asm.R9, asm.R6, retOff, asm.DWord),
	)
}

// cmdCount counts the command (R9: its return value, R8: its latency):
//
//	v = lookupOrInit(gv_cmds, key);
//	v->calls++; if (ret < 0) v->errors++; v->ns += ns; histAdd; return 0;
//
// Registers: R7 v.
func cmdCount() asm.Instructions {
	return seq(
		lookupOrInit(mapCmds, slotCmdKey, slotCmdZero, 8*cmdValWords),
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R7, asm.R1, asm.DWord, cmdCalls),
		asm.JSGE.Imm(asm.R9, 0, "ok"),
		asm.AddAtomic.Mem(asm.R7, asm.R1, asm.DWord, cmdErrors),
		asm.AddAtomic.Mem(asm.R7, asm.R8, asm.DWord, cmdNs).WithSymbol("ok"),
		histAdd(asm.R7, asm.R8),
		ret0(),
	)
}

// openatEnter: sys_enter of openat; remembers an openat of
// /dev/infiniband/uverbsN (N in 0..99) in gv_pending.
//
//	if (bpf_probe_read_user_str(path, 32, arg1) < 24) return 0; // "/dev/infiniband/uverbsN\0"
//	if (path[0:22] != "/dev/infiniband/uverbs") return 0;
//	n = path[22] - '0'; if (n > 9) return 0;
//	if (path[23]) { d = path[23] - '0'; if (d > 9 || path[24]) return 0; n = 10*n + d; }
//	gv_pending[bpf_get_current_pid_tgid()] = n; // mapUpdateCounted
//	return 0;
//
// Registers: R7 n.
func openatEnter() asm.Instructions {
	word := func(s string) int64 {
		var v uint64
		for i := len(s) - 1; i >= 0; i-- {
			v = v<<8 | uint64(s[i])
		}
		return int64(v)
	}
	// match returns unless the size bytes at path[off] are s.
	match := func(off int16, size asm.Size, s string) asm.Instructions {
		return asm.Instructions{
			asm.LoadMem(asm.R1, asm.RFP, slotPath+off, size),
			asm.LoadImm(asm.R2, word(s), asm.DWord),
			asm.JNE.Reg(asm.R1, asm.R2, "out"),
		}
	}
	return seq(
		fpAddr(asm.R1, slotPath),
		asm.Mov.Imm(asm.R2, 32),
		asm.LoadMem(asm.R3, asm.RFP, tpArg1, asm.DWord),
		asm.FnProbeReadUserStr.Call(),
		asm.JSLT.Imm(asm.R0, 24, "out"),
		match(0, asm.DWord, "/dev/inf"),
		match(8, asm.DWord, "iniband/"),
		match(16, asm.Word, "uver"),
		asm.LoadMem(asm.R1, asm.RFP, slotPath+20, asm.Half),
		asm.JNE.Imm(asm.R1, int32(word("bs")), "out"),
		asm.LoadMem(asm.R7, asm.RFP, slotPath+22, asm.Byte),
		asm.Sub.Imm(asm.R7, '0'),
		asm.JGT.Imm(asm.R7, 9, "out"),
		asm.LoadMem(asm.R1, asm.RFP, slotPath+23, asm.Byte),
		asm.JEq.Imm(asm.R1, 0, "num"),
		asm.Sub.Imm(asm.R1, '0'),
		asm.JGT.Imm(asm.R1, 9, "out"),
		asm.Mul.Imm(asm.R7, 10),
		asm.Add.Reg(asm.R7, asm.R1),
		asm.LoadMem(asm.R1, asm.RFP, slotPath+24, asm.Byte),
		asm.JNE.Imm(asm.R1, 0, "out"),
		asm.StoreMem(asm.RFP, slotNewMinor, asm.R7, asm.Word).WithSymbol("num"),
		asm.FnGetCurrentPidTgid.Call(),
		asm.StoreMem(asm.RFP, slotPidTgid, asm.R0, asm.DWord),
		mapUpdateCounted(mapPending, slotPidTgid, slotNewMinor),
		label("out", ret0()),
	)
}

// openatExit: sys_exit of an openat of a uverbs device (R0: its
// gv_pending value, R6: ctx, fp[slotPidTgid]: pid_tgid).
//
//	minor = *r0; bpf_map_delete_elem(&gv_pending, &pid_tgid);
//	if (ctx->ret >= 0) gv_fds[{tgid, fd = ret}] = minor; // mapUpdateCounted
//	return 0;
func openatExit() asm.Instructions {
	return seq(
		asm.LoadMem(asm.R7, asm.R0, 0, asm.Word),
		asm.StoreMem(asm.RFP, slotMinor, asm.R7, asm.Word),
		mapDelete(mapPending, slotPidTgid),
		asm.LoadMem(asm.R1, asm.R6, 8, asm.DWord), // ret
		asm.JSLT.Imm(asm.R1, 0, "out"),
		asm.StoreMem(asm.RFP, slotFDKey+4, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.RFP, slotPidTgid, asm.DWord),
		asm.RSh.Imm(asm.R1, 32),
		asm.StoreMem(asm.RFP, slotFDKey, asm.R1, asm.Word),
		mapUpdateCounted(mapFDs, slotFDKey, slotMinor),
		label("out", ret0()),
	)
}

// closeEnter: sys_enter of close.
//
//	bpf_map_delete_elem(&gv_fds, &{tgid, fd = arg0}); return 0;
func closeEnter() asm.Instructions {
	return seq(
		asm.FnGetCurrentPidTgid.Call(),
		asm.RSh.Imm(asm.R0, 32),
		asm.StoreMem(asm.RFP, slotCloseKey, asm.R0, asm.Word),
		asm.LoadMem(asm.R1, asm.RFP, tpArg0, asm.DWord),
		asm.StoreMem(asm.RFP, slotCloseKey+4, asm.R1, asm.Word),
		mapDelete(mapFDs, slotCloseKey),
		ret0(),
	)
}
