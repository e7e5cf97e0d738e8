package probe

import "github.com/cilium/ebpf/asm"

// uverbsOffsets are byte offsets into ib_uverbs' and the kernel's
// structures for the uverbs-commands and cq-events probes, read from the
// kernel's BTF.
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
// gv_evq value: struct { u64 raised; u64 consumed; char name[16]; u64
// stamps[evRing]; }.
const (
	evqRaised   = 0
	evqConsumed = 8
	evqName     = 16
	evqStamp    = 32
	evRing      = 16
	evqSize     = evqStamp + 8*evRing
)

// The gv_events value: matched reads, unmatched reads, total ns of the
// matched, then the histogram at histOff.
const (
	evMatched   = 0
	evUnmatched = 8
	evNs        = 16
)

// Stack slots of compHandler.
const (
	slotInfl       = -4   // u32 gv_evinfl key 0 (inflightAdd)
	slotRaisedKey  = -32  // gv_raised key: the device's name[16]
	slotQueueKey   = -48  // gv_evq key: the struct ib_uverbs_event_queue *
	slotHTmp       = -72  // 8 bytes read from the kernel
	slotRaisedZero = -80  // a zero gv_raised value
	slotNewQueue   = -256 // a new gv_evq value (evqSize)
)

// Stack slots of the read programs (compReadEnter, compReadExit,
// compReadFexit, compReadEvent).
const (
	slotSeq       = -8  // pid_tgid, then the number of the event read
	slotReadQueue = -16 // the queue: gv_evread value, gv_evq key
	slotRTmp      = -24 // 8 bytes read from the kernel, the gv_evinfl key
	slotRaisedNow = -32 // u64 the queue's raised count when the read looked
	slotLatency   = -48 // u64 ns from raise to read; -1: unmatched
	slotEvKey     = -72 // gv_events key (evKeySize): {char name[16]; u32 tgid; u32 pad}
	slotEvTgid    = slotEvKey + 16
	slotEvZero    = slotEvKey - 8*evValWords
)

// compHandler: entry of ib_uverbs_comp_handler(struct ib_cq *cq, void
// *cq_context); cq_context is the channel's struct ib_uverbs_event_queue
// (NULL for a CQ without a channel).
//
//	inflightAdd(1);
//	q = cq_context; if (!q || q->is_closed) return 0; // the handler drops the event
//	rec = gv_evq[q];
//	if (!rec) {                                       // a queue seen for the first time
//		new = {.name = cq->device->name};
//		bpf_map_update_elem(&gv_evq, &q, &new, BPF_NOEXIST);
//		rec = gv_evq[q]; if (!rec) { countDrop(gv_evq); return 0; }
//	}
//	seq = atomic_fetch_add(&rec->raised, 1) + 1;
//	rec->stamps[seq % evRing] = bpf_ktime_get_ns();
//	lookupOrInit(gv_raised, rec->name)++; return 0;
//
// Registers: R6 cq, then &rec->stamps[seq % evRing] - evqStamp; R7 q; R8 rec.
func compHandler(u *uverbsOffsets) asm.Instructions {
	return seq(
		asm.LoadMem(asm.R7, asm.R1, u.regArg1, asm.DWord), // ev_queue
		asm.LoadMem(asm.R6, asm.R1, u.regArg0, asm.DWord), // cq
		inflightAdd(1),
		asm.JNE.Imm(asm.R7, 0, "have_q"),
		ret0(),
		label("have_q", zeroStack(slotHTmp, 8)),
		readKernel(slotHTmp, 4, asm.R7, u.qClosed),
		asm.LoadMem(asm.R1, asm.RFP, slotHTmp, asm.Word),
		asm.JEq.Imm(asm.R1, 0, "open"),
		ret0(),
		asm.StoreMem(asm.RFP, slotQueueKey, asm.R7, asm.DWord).WithSymbol("open"),
		mapLookup(mapEvQueues, slotQueueKey),
		asm.JNE.Imm(asm.R0, 0, "have_rec"),
		zeroStack(slotNewQueue, evqSize),
		readThrough(slotNewQueue+evqName, qpNameLen, slotHTmp, asm.R6, u.cqDevice, u.devName),
		mapUpdate(mapEvQueues, slotQueueKey, slotNewQueue, bpfNoExist),
		mapLookup(mapEvQueues, slotQueueKey),
		asm.JNE.Imm(asm.R0, 0, "have_rec"),
		countDrop(mapEvQueues),
		ret0(),
		asm.Mov.Reg(asm.R8, asm.R0).WithSymbol("have_rec"),
		asm.Mov.Imm(asm.R1, 1),
		fetchAdd64(asm.R8, asm.R1, evqRaised), // r1 = events raised before this one
		asm.Add.Imm(asm.R1, 1),
		asm.And.Imm(asm.R1, evRing-1),
		asm.LSh.Imm(asm.R1, 3),
		asm.Mov.Reg(asm.R6, asm.R8),
		asm.Add.Reg(asm.R6, asm.R1),
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(asm.R6, evqStamp, asm.R0, asm.DWord),
		copyWords(asm.RFP, slotRaisedKey, asm.R8, evqName, 2),
		relabel(lookupOrInit(mapRaised, slotRaisedKey, slotRaisedZero, 8), "r_"),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 0),
		ret0(),
	)
}

// inflightAdd is `r0 = gv_evinfl[0]; if (r0) *r0 += d;`. Clobbers R0-R5.
func inflightAdd(d int32) asm.Instructions {
	return seq(
		asm.StoreImm(asm.RFP, slotInfl, 0, asm.Word),
		mapLookup(mapEvInfl, slotInfl),
		asm.JEq.Imm(asm.R0, 0, "infl_done"),
		asm.Mov.Imm(asm.R1, d),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 0),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("infl_done"),
	)
}

// compHandlerExit: exit of ib_uverbs_comp_handler: the event is queued (or
// dropped). `inflightAdd(-1); return 0`.
func compHandlerExit() asm.Instructions {
	return append(inflightAdd(-1), asm.Return())
}

// compReadEnter: kprobe on ib_uverbs_comp_event_read(struct file *filp,
// ...): remember the channel's event queue under pid_tgid, for processes
// that pass the pid filter.
//
//	fp[slotSeq] = bpf_get_current_pid_tgid(); tgid = that >> 32; pidFilter;
//	gv_evread[pid_tgid] = eventQueue(filp); // mapUpdateCounted
//	return 0;
//
// Registers: R6 ctx, R7 filp, R8 tgid.
func compReadEnter(u *uverbsOffsets) asm.Instructions {
	return seq(
		asm.Mov.Reg(asm.R6, asm.R1),
		currentPidTgid(slotSeq, asm.R8),
		pidFilter(asm.R8),
		asm.LoadMem(asm.R7, asm.R6, u.regArg0, asm.DWord),
		eventQueue(u, asm.R7, asm.R1),
		asm.StoreMem(asm.RFP, slotReadQueue, asm.R1, asm.DWord),
		mapUpdateCounted(mapEvRead, slotSeq, slotReadQueue),
		ret0(),
	)
}

// compReadExit: kretprobe on ib_uverbs_comp_event_read.
//
//	fp[slotSeq] = bpf_get_current_pid_tgid(); key = {tgid = that >> 32};
//	q = gv_evread[pid_tgid]; if (!q) return 0;
//	bpf_map_delete_elem(&gv_evread, &pid_tgid);
//	if (ret <= 0) return 0; // EAGAIN (the fd is non-blocking), EINTR, ...
//	compReadEvent;
//
// Registers: R6 ctx, R7 q.
func compReadExit(u *uverbsOffsets) asm.Instructions {
	return seq(
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.FnGetCurrentPidTgid.Call(),
		asm.StoreMem(asm.RFP, slotSeq, asm.R0, asm.DWord),
		zeroStack(slotEvKey, evKeySize),
		asm.RSh.Imm(asm.R0, 32),
		asm.StoreMem(asm.RFP, slotEvTgid, asm.R0, asm.Word),
		mapLookup(mapEvRead, slotSeq),
		asm.JNE.Imm(asm.R0, 0, "reading"),
		asm.Return(), // r0 == 0
		asm.LoadMem(asm.R7, asm.R0, 0, asm.DWord).WithSymbol("reading"),
		mapDelete(mapEvRead, slotSeq),
		asm.LoadMem(asm.R1, asm.R6, u.regRet, asm.DWord),
		asm.JSGT.Imm(asm.R1, 0, "got_event"),
		ret0(),
		compReadEvent(u),
	)
}

// compReadFexit: fexit of ib_uverbs_comp_event_read(struct file *filp,
// char __user *buf, size_t count, loff_t *pos), which sees the arguments
// and the return value in one program: compReadEnter and compReadExit
// together, and a read that found no event (EAGAIN: goverbs' channel fds
// are non-blocking) returns at once.
//
//	if (ret <= 0) return 0;
//	fp[slotSeq] = bpf_get_current_pid_tgid(); tgid = that >> 32; pidFilter (if Options.PIDs);
//	key = {tgid}; q = eventQueue(filp); compReadEvent;
//
// Registers as in compReadExit, R8 tgid.
func compReadFexit(u *uverbsOffsets) asm.Instructions {
	in := seq(
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R1, asm.R6, u.ret(4), asm.DWord),
		asm.JSGT.Imm(asm.R1, 0, "read_one"),
		ret0(),
		label("read_one", currentPidTgid(slotSeq, asm.R8)),
	)
	if u.pids {
		in = append(in, pidFilter(asm.R8)...)
	}
	return seq(in,
		zeroStack(slotEvKey, evKeySize),
		asm.StoreMem(asm.RFP, slotEvTgid, asm.R8, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, u.regArg0, asm.DWord),
		eventQueue(u, asm.R3, asm.R7),
		asm.Mov.Imm(asm.R0, 0),
		compReadEvent(u),
	)
}

// eventQueue is `dst = ((struct ib_uverbs_completion_event_file
// *)filp->private_data); if (!dst) return 0; dst = &dst->ev_queue`.
// Stack: slotReadQueue. Clobbers R0-R5.
func eventQueue(u *uverbsOffsets, filp, dst asm.Register) asm.Instructions {
	return seq(
		zeroStack(slotReadQueue, 8),
		readKernel(slotReadQueue, 8, filp, u.filePrivate),
		asm.LoadMem(dst, asm.RFP, slotReadQueue, asm.DWord),
		asm.JNE.Imm(dst, 0, "have_file"),
		ret0(),
		asm.Add.Imm(dst, u.fileQueue).WithSymbol("have_file"),
	)
}

// compReadEvent is the common part of compReadExit and compReadFexit: a
// read of the queue q in R7 returned an event; the gv_events key's tgid
// is set.
//
//	now = bpf_ktime_get_ns(); latency = -1;
//	rec = gv_evq[q];
//	if (rec) {
//		key.name = rec->name; raised = rec->raised;
//		if (rec->consumed < raised) {
//			seq = rec->consumed + 1;
//			if (raised - seq < evRing) {    // else its stamp was overwritten: unmatched
//				stamp = rec->stamps[seq % evRing];
//				if (stamp > now) goto sync; // raised after this read began: an older event was read
//				latency = now - stamp;
//			}
//			rec->consumed = seq;
//		}
//	sync:	// the kernel's queue empty, then no handler running: every
//		// event raised before the count was read has been read
//		if (list_empty(&q->event_list) && gv_evinfl[0] <= 0) rec->consumed = raised;
//	}
//	v = lookupOrInit(gv_events, key);
//	if (latency == -1) { v->unmatched++; return 0; }
//	v->matched++; v->ns += latency; histAdd; return 0;
//
// Registers: R7 q, then v; R8 rec, then latency; R9 now.
func compReadEvent(u *uverbsOffsets) asm.Instructions {
	return seq(
		asm.FnKtimeGetNs.Call().WithSymbol("got_event"),
		asm.Mov.Reg(asm.R9, asm.R0),
		asm.Mov.Imm(asm.R1, -1),
		asm.StoreMem(asm.RFP, slotLatency, asm.R1, asm.DWord),
		asm.StoreMem(asm.RFP, slotReadQueue, asm.R7, asm.DWord),
		mapLookup(mapEvQueues, slotReadQueue),
		asm.JEq.Imm(asm.R0, 0, "stats"), // no event of this queue was seen raised
		asm.Mov.Reg(asm.R8, asm.R0),
		copyWords(asm.RFP, slotEvKey, asm.R8, evqName, 2),
		asm.LoadMem(asm.R1, asm.R8, evqRaised, asm.DWord),
		asm.StoreMem(asm.RFP, slotRaisedNow, asm.R1, asm.DWord),
		asm.LoadMem(asm.R2, asm.R8, evqConsumed, asm.DWord),
		asm.JGE.Reg(asm.R2, asm.R1, "sync"),
		asm.Add.Imm(asm.R2, 1),
		asm.StoreMem(asm.RFP, slotSeq, asm.R2, asm.DWord),
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
		asm.StoreMem(asm.RFP, slotLatency, asm.R2, asm.DWord),
		asm.LoadMem(asm.R1, asm.RFP, slotSeq, asm.DWord).WithSymbol("consume"),
		asm.StoreMem(asm.R8, evqConsumed, asm.R1, asm.DWord),
		label("sync", zeroStack(slotRTmp, 8)),
		readKernel(slotRTmp, 8, asm.R7, u.qEventList), // event_list.next
		asm.LoadMem(asm.R1, asm.RFP, slotRTmp, asm.DWord),
		asm.Mov.Reg(asm.R2, asm.R7),
		asm.Add.Imm(asm.R2, u.qEventList),
		asm.JNE.Reg(asm.R1, asm.R2, "stats"), // not empty
		asm.StoreImm(asm.RFP, slotRTmp, 0, asm.Word),
		mapLookup(mapEvInfl, slotRTmp),
		asm.JEq.Imm(asm.R0, 0, "stats"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.JSGT.Imm(asm.R1, 0, "stats"),
		asm.LoadMem(asm.R1, asm.RFP, slotRaisedNow, asm.DWord),
		asm.StoreMem(asm.R8, evqConsumed, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("stats"),
		lookupOrInit(mapEvents, slotEvKey, slotEvZero, 8*evValWords),
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.LoadMem(asm.R8, asm.RFP, slotLatency, asm.DWord),
		asm.Mov.Imm(asm.R1, 1),
		asm.JNE.Imm(asm.R8, -1, "matched"),
		asm.AddAtomic.Mem(asm.R7, asm.R1, asm.DWord, evUnmatched),
		ret0(),
		asm.AddAtomic.Mem(asm.R7, asm.R1, asm.DWord, evMatched).WithSymbol("matched"),
		asm.AddAtomic.Mem(asm.R7, asm.R8, asm.DWord, evNs),
		histAdd(asm.R7, asm.R8),
		ret0(),
	)
}
