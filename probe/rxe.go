package probe

import "github.com/cilium/ebpf/asm"

// The rxe probes: kprobes (or fentry) on rdma_rxe's functions, each adding
// 1 to a counter of the QP it is about, gv_qps[{device name, qpn}]. The
// structures are rxe's own (struct rxe_qp, rxe_cq, rxe_pkt_info), read
// with bpf_probe_read_kernel at the offsets rxeOffsets has from the
// running kernel's BTF.

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

// Stack slots of the rxe programs.
const (
	slotQPKey  = -24 // gv_qps key (qpKeySize): {char name[qpNameLen]; u32 qpn; u32 pad}
	slotQPN    = -8  // the key's qpn (and pad)
	slotQPTmp  = -32 // a pointer read on the way to the device's name
	slotQPZero = slotQPTmp - 8*qpValWords
	slotCQE    = -48 // cqPost: the CQE's status and opcode (u32 each)
	slotByte   = -16 // compQueue: the packet's opcode, then AETH syndrome
)

// kprobeQP counts idx for a function whose first argument, minus sub, is a
// struct rxe_qp * (sub: the offset of the timer that is the argument):
//
//	qp = (void *)arg0 - sub; qpCount(qp, idx);
//
// Registers: R6 qp.
func kprobeQP(o *rxeOffsets, idx int, sub int32) asm.Instructions {
	in := asm.Instructions{asm.LoadMem(asm.R6, asm.R1, o.regArg0, asm.DWord)}
	if sub != 0 {
		in = append(in, asm.Sub.Imm(asm.R6, sub))
	}
	return seq(in, qpCount(o, idx))
}

// qpCount is `key = qpKey(qp in R6); qpAdd(idx)`.
func qpCount(o *rxeOffsets, idx int) asm.Instructions {
	return seq(qpKey(o), qpAdd(idx))
}

// qpKey builds the gv_qps key of the QP whose struct rxe_qp * is in R6:
//
//	key.qpn = qp->ibqp.qp_num; r7 = &qp->ibqp.device; devName;
//
// Clobbers R1-R5, R7.
func qpKey(o *rxeOffsets) asm.Instructions {
	return seq(
		zeroStack(slotQPN, 8),
		readKernel(slotQPN, 4, asm.R6, o.qpNum),
		asm.Mov.Reg(asm.R7, asm.R6),
		asm.Add.Imm(asm.R7, o.qpDevice),
		devName(o),
	)
}

// devName is `key.name = (*(struct ib_device **)r7)->name` (its first
// qpNameLen bytes).
func devName(o *rxeOffsets) asm.Instructions {
	return readThrough(slotQPKey, qpNameLen, slotQPTmp, asm.R7, 0, o.devName)
}

// qpValue is `r0 = lookupOrInit(gv_qps, key)`.
func qpValue() asm.Instructions {
	return lookupOrInit(mapQPs, slotQPKey, slotQPZero, 8*qpValWords)
}

// qpAdd is `qpValue; r0->counter[idx]++; return 0`.
func qpAdd(idx int) asm.Instructions {
	return seq(
		qpValue(),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, int16(8*idx)),
		ret0(),
	)
}

// compQueue: rxe_comp_queue_pkt(struct rxe_qp *qp, struct sk_buff *skb)
// hands a response packet to the QP's completer. It counts the packet
// and, for an RC ACKNOWLEDGE whose AETH syndrome (the byte after the
// 12-byte BTH) is a NAK PSN sequence error (0x60) or an RNR NAK (0x2x),
// that NAK, per QP:
//
//	pkt = (struct rxe_pkt_info *)skb->cb; nak = 0;
//	if (pkt->opcode == IB_OPCODE_RC_ACKNOWLEDGE) {
//		syndrome = pkt->hdr[12];
//		if (syndrome == 0x60) nak = qpSeqNaks;
//		else if ((syndrome & 0xe0) == 0x20) nak = qpRNRNaks;
//	}
//	qpKey; v = qpValue; v->recv++; if (nak) v->counter[nak]++; return 0;
//
// Registers: R6 qp, R8 skb, R9 nak (the counter's byte offset).
func compQueue(o *rxeOffsets) asm.Instructions {
	return seq(
		asm.LoadMem(asm.R6, asm.R1, o.regArg0, asm.DWord), // qp
		asm.LoadMem(asm.R8, asm.R1, o.regArg1, asm.DWord), // skb
		asm.Mov.Imm(asm.R9, 0),
		zeroStack(slotByte, 8),
		readKernel(slotByte, 1, asm.R8, o.skbCB+o.pktOpcode),
		asm.LoadMem(asm.R1, asm.RFP, slotByte, asm.Byte),
		asm.JNE.Imm(asm.R1, 0x11, "count"),                               // IB_OPCODE_RC_ACKNOWLEDGE
		readThrough(slotByte, 1, slotByte, asm.R8, o.skbCB+o.pktHdr, 12), // AETH syndrome
		asm.LoadMem(asm.R1, asm.RFP, slotByte, asm.Byte),
		asm.JNE.Imm(asm.R1, 0x60, "not_seq"),
		asm.Mov.Imm(asm.R9, 8*qpSeqNaks),
		asm.Ja.Label("count"),
		asm.And.Imm(asm.R1, 0xe0).WithSymbol("not_seq"),
		asm.JNE.Imm(asm.R1, 0x20, "count"),
		asm.Mov.Imm(asm.R9, 8*qpRNRNaks),
		label("count", qpKey(o)),
		qpValue(),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 8*qpRecv),
		asm.JEq.Imm(asm.R9, 8*qpSeqNaks, "seq"),
		asm.JEq.Imm(asm.R9, 8*qpRNRNaks, "rnr"),
		ret0(),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 8*qpSeqNaks).WithSymbol("seq"),
		ret0(),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 8*qpRNRNaks).WithSymbol("rnr"),
		ret0(),
	)
}

// requesterEntry counts a retry pass of rxe_requester(struct rxe_qp *qp):
// it runs req_retry (go back to the oldest unacknowledged PSN and resend)
// when need_retry is set on entry.
//
//	if (!qp->req.need_retry) return 0; qpCount(qp, qpRetries);
//
// Registers: R6 qp.
func requesterEntry(o *rxeOffsets) asm.Instructions {
	return seq(
		asm.LoadMem(asm.R6, asm.R1, o.regArg0, asm.DWord),
		zeroStack(slotQPN, 8),
		readKernel(slotQPN, 4, asm.R6, o.needRetry),
		asm.LoadMem(asm.R1, asm.RFP, slotQPN, asm.Word),
		asm.JNE.Imm(asm.R1, 0, "retry"),
		ret0(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("retry"),
		qpCount(o, qpRetries),
	)
}

// cqPost counts a completion rxe_cq_post(struct rxe_cq *cq, struct
// rxe_cqe *cqe, ...) writes to a user CQ: the CQE is a struct
// ib_uverbs_wc { u64 wr_id; u32 status; u32 opcode; u32 vendor_err; u32
// byte_len; u32 imm; u32 qp_num; ... }; opcode & 0x80 is a receive.
//
//	if (!cq->is_user) return 0;
//	key = {cq->ibcq.device->name, cqe->qp_num};
//	if (cqe->status) { qpAdd(qpErrorCompletions) }
//	else if (cqe->opcode & 0x80) { qpAdd(qpRecvCompletions) }
//	else { qpAdd(qpSendCompletions) }
//
// Registers: R6 cq, R7 &cq->ibcq.device, R8 cqe then status, R9 opcode.
func cqPost(o *rxeOffsets) asm.Instructions {
	return seq(
		asm.LoadMem(asm.R6, asm.R1, o.regArg0, asm.DWord), // cq
		asm.LoadMem(asm.R8, asm.R1, o.regArg1, asm.DWord), // cqe
		zeroStack(slotQPN, 8),
		readKernel(slotQPN, 1, asm.R6, o.cqIsUser),
		asm.LoadMem(asm.R1, asm.RFP, slotQPN, asm.Byte),
		asm.JNE.Imm(asm.R1, 0, "user"),
		ret0(),
		label("user", readKernel(slotCQE, 8, asm.R8, 8)),  // status, opcode
		readKernel(slotQPN, 4, asm.R8, 28),                // qp_num
		asm.LoadMem(asm.R8, asm.RFP, slotCQE, asm.Word),   // status
		asm.LoadMem(asm.R9, asm.RFP, slotCQE+4, asm.Word), // opcode
		asm.Mov.Reg(asm.R7, asm.R6),
		asm.Add.Imm(asm.R7, o.cqDevice),
		devName(o), // clobbers R1-R5 only
		asm.JEq.Imm(asm.R8, 0, "status_ok"),
		qpAdd(qpErrorCompletions),
		asm.Mov.Reg(asm.R9, asm.R9).WithSymbol("status_ok"),
		asm.JSet.Imm(asm.R9, 0x80, "recv"),
		relabel(qpAdd(qpSendCompletions), "s_"),
		asm.Mov.Reg(asm.R9, asm.R9).WithSymbol("recv"),
		relabel(qpAdd(qpRecvCompletions), "r_"),
	)
}
