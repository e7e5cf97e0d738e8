// Package wr holds the work requests and completions every goverbs
// provider shares: scatter/gather elements, send and receive work
// requests, completions, and their opcodes, flags and statuses, each a
// named type with a String method. It is a leaf: qp, cq, uverbs and the
// providers alias its types (qp.SendWR is wr.SendWR), so a user may import
// wr alone to name them (w.Status != wr.WCSuccess, w.Flags&wr.WCWithImm).
// Where the kernel's uapi defines a value (ib_user_verbs.h's
// IB_UVERBS_WR_* and IB_UVERBS_WC_* send opcodes), the constant is the
// generated one from package ioctl; the others (completion statuses, send
// flags, receive completion opcodes) are the kernel's ib_verbs.h values,
// which rdma-core's verbs.h repeats, and are not in the uapi.
package wr

import (
	"fmt"

	"github.com/goverbs/goverbs/ioctl"
)

// SGE is one scatter/gather element: Length bytes at Addr in the memory
// region whose local key is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// Opcode is a send work request's operation (IB_UVERBS_WR_*).
type Opcode uint32

// The send opcodes rxe supports, from the uapi (enum ib_uverbs_wr_opcode).
const (
	OpRDMAWrite         Opcode = ioctl.IB_UVERBS_WR_RDMA_WRITE
	OpRDMAWriteWithImm  Opcode = ioctl.IB_UVERBS_WR_RDMA_WRITE_WITH_IMM
	OpSend              Opcode = ioctl.IB_UVERBS_WR_SEND
	OpSendWithImm       Opcode = ioctl.IB_UVERBS_WR_SEND_WITH_IMM
	OpRDMARead          Opcode = ioctl.IB_UVERBS_WR_RDMA_READ
	OpAtomicCmpAndSwp   Opcode = ioctl.IB_UVERBS_WR_ATOMIC_CMP_AND_SWP
	OpAtomicFetchAndAdd Opcode = ioctl.IB_UVERBS_WR_ATOMIC_FETCH_AND_ADD
	// OpLocalInv invalidates a local memory window (or MR) by its rkey.
	OpLocalInv Opcode = ioctl.IB_UVERBS_WR_LOCAL_INV
	// OpBindMW binds a type 2 memory window (rxe also binds type 1
	// windows with it) to a range of a memory region.
	OpBindMW Opcode = ioctl.IB_UVERBS_WR_BIND_MW
	// OpSendWithInv is a SEND that also invalidates the peer's rkey
	// InvRKey when it arrives.
	OpSendWithInv Opcode = ioctl.IB_UVERBS_WR_SEND_WITH_INV
)

var opcodeNames = map[Opcode]string{
	OpRDMAWrite: "RDMA_WRITE", OpRDMAWriteWithImm: "RDMA_WRITE_WITH_IMM",
	OpSend: "SEND", OpSendWithImm: "SEND_WITH_IMM", OpRDMARead: "RDMA_READ",
	OpAtomicCmpAndSwp: "ATOMIC_CMP_AND_SWP", OpAtomicFetchAndAdd: "ATOMIC_FETCH_AND_ADD",
	OpLocalInv: "LOCAL_INV", OpBindMW: "BIND_MW", OpSendWithInv: "SEND_WITH_INV",
}

func (o Opcode) String() string {
	if s, ok := opcodeNames[o]; ok {
		return s
	}
	return fmt.Sprintf("Opcode(%d)", uint32(o))
}

// SendFlags modify a send work request (IB_SEND_*).
type SendFlags uint32

// Send flags: ib_verbs.h's IB_SEND_* (rdma-core's IBV_SEND_*), not in the
// uapi.
const (
	SendFence     SendFlags = 1
	SendSignaled  SendFlags = 2
	SendSolicited SendFlags = 4
	SendInline    SendFlags = 8
)

// SendWR is a send work request. Fields that do not apply to its opcode are
// ignored.
type SendWR struct {
	ID     uint64
	Opcode Opcode
	Flags  SendFlags
	// Imm is the immediate data of *_WITH_IMM, in host order; it travels
	// in network order and arrives in WC.Imm in host order.
	Imm  uint32
	SGEs []SGE
	// RDMA and atomics: the peer's address and remote key.
	RemoteAddr uint64
	RKey       uint32
	// Atomics: the compare (CMP_AND_SWP) or add (FETCH_AND_ADD) operand,
	// and the swap value.
	CompareAdd uint64
	Swap       uint64
	// UD: the address handle (uverbs.AH.Provider()), remote QPN and QKey.
	AH         AH
	RemoteQPN  uint32
	RemoteQKey uint32
	// LOCAL_INV: the local rkey to invalidate; SEND_WITH_INV: the peer's.
	InvRKey uint32
	// BIND_MW: the window, the range and the rkey it gets.
	Bind MWBind
}

// MWBind is what a BIND_MW work request binds: Length bytes at Addr of the
// memory region whose local key is LKey, with remote access Access
// (IB_ACCESS_REMOTE_*), to the window whose rkey is now MWRKey. After the
// bind the window answers to RKey: the same window index (the upper 24
// bits), a new key in the low 8 bits. mr.MW.Bind fills one in.
type MWBind struct {
	MWRKey uint32
	RKey   uint32
	LKey   uint32
	Access uint32
	Addr   uint64
	Length uint64
}

// RecvWR is a receive work request.
type RecvWR struct {
	ID   uint64
	SGEs []SGE
}

// AH is the provider's half of an address handle, as a UD send names it
// (SendWR.AH): uverbs.AH.Provider() returns one. Providers implement it;
// users only pass it on.
type AH interface {
	Udata() (in, out []byte)
	Attach(handle uint32) error
}
