package wr

import (
	"fmt"

	"github.com/goverbs/goverbs/ioctl"
)

// WCStatus is a completion's status (IB_WC_*).
type WCStatus uint32

// Completion statuses: ib_verbs.h's enum ib_wc_status (rdma-core's
// IBV_WC_*), not in the uapi.
const (
	WCSuccess WCStatus = iota
	WCLocLenErr
	WCLocQPOpErr
	WCLocEECOpErr
	WCLocProtErr
	WCWRFlushErr
	WCMWBindErr
	WCBadRespErr
	WCLocAccessErr
	WCRemInvReqErr
	WCRemAccessErr
	WCRemOpErr
	WCRetryExcErr
	WCRNRRetryExcErr
	WCLocRDDViolErr
	WCRemInvRDReqErr
	WCRemAbortErr
	WCInvEECNErr
	WCInvEECStateErr
	WCFatalErr
	WCRespTimeoutErr
	WCGeneralErr
)

var statusNames = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "WR flushed", "memory window bind error", "bad response",
	"local access error", "remote invalid request", "remote access error", "remote operation error",
	"transport retry counter exceeded", "RNR retry counter exceeded", "local RDD violation",
	"remote invalid RD request", "remote aborted", "invalid EE context number",
	"invalid EE context state", "fatal error", "response timeout", "general error",
}

func (s WCStatus) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("WCStatus(%d)", uint32(s))
}

// WCOpcode says what completed (IB_WC_*).
type WCOpcode uint32

// Completion opcodes: the send side from the uapi (enum
// ib_uverbs_wc_opcode); the receive side is ib_verbs.h's IB_WC_RECV =
// 1 << 7 and IB_WC_RECV_RDMA_WITH_IMM, not in the uapi.
const (
	WCSend        WCOpcode = ioctl.IB_UVERBS_WC_SEND
	WCRDMAWrite   WCOpcode = ioctl.IB_UVERBS_WC_RDMA_WRITE
	WCRDMARead    WCOpcode = ioctl.IB_UVERBS_WC_RDMA_READ
	WCCompSwap    WCOpcode = ioctl.IB_UVERBS_WC_COMP_SWAP
	WCFetchAdd    WCOpcode = ioctl.IB_UVERBS_WC_FETCH_ADD
	WCBindMW      WCOpcode = ioctl.IB_UVERBS_WC_BIND_MW
	WCLocalInv    WCOpcode = ioctl.IB_UVERBS_WC_LOCAL_INV
	WCRecv        WCOpcode = 1 << 7
	WCRecvRDMAImm WCOpcode = WCRecv + 1
)

var wcOpNames = map[WCOpcode]string{
	WCSend: "SEND", WCRDMAWrite: "RDMA_WRITE", WCRDMARead: "RDMA_READ", WCCompSwap: "COMP_SWAP",
	WCFetchAdd: "FETCH_ADD", WCBindMW: "BIND_MW", WCLocalInv: "LOCAL_INV", WCRecv: "RECV",
	WCRecvRDMAImm: "RECV_RDMA_WITH_IMM",
}

func (o WCOpcode) String() string {
	if s, ok := wcOpNames[o]; ok {
		return s
	}
	return fmt.Sprintf("WCOpcode(%d)", uint32(o))
}

// WCFlags qualify a completion (IB_WC_*).
type WCFlags uint32

// Completion flags: ib_verbs.h's IB_WC_WITH_* (rdma-core's IBV_WC_WITH_*).
const (
	WCWithGRH WCFlags = 1
	WCWithImm WCFlags = 2
	// WCWithInv marks a receive of a SEND_WITH_INV: the rkey in InvRKey
	// was invalidated before the completion was written.
	WCWithInv WCFlags = 4
)

// WC is a work completion.
type WC struct {
	ID        uint64
	Status    WCStatus
	Opcode    WCOpcode
	VendorErr uint32
	ByteLen   uint32
	// Imm is the immediate data in host order when Flags has WCWithImm.
	Imm uint32
	// InvRKey is the rkey the sender invalidated when Flags has WCWithInv.
	InvRKey      uint32
	QPNum        uint32
	SrcQP        uint32
	Flags        WCFlags
	PKeyIndex    uint16
	SLID         uint16
	SL           uint8
	DLIDPathBits uint8
	PortNum      uint8
}

// Err returns nil for a successful completion, else an error naming the
// status, opcode and work request id.
func (wc *WC) Err() error {
	if wc == nil {
		return errNilWC
	}
	if wc.Status == WCSuccess {
		return nil
	}
	return &WCError{Status: wc.Status, Opcode: wc.Opcode, ID: wc.ID, VendorErr: wc.VendorErr}
}

// WCError is a failed completion.
type WCError struct {
	Status    WCStatus
	Opcode    WCOpcode
	ID        uint64
	VendorErr uint32
}

// Error names the work request and the status. The opcode of an error
// completion is undefined by the verbs spec (rxe reports garbage there), so
// it is not named.
func (e *WCError) Error() string {
	if e == nil {
		return "wr: nil WCError"
	}
	return fmt.Sprintf("work request %d completed with status %d: %v (vendor error %#x)", e.ID, uint32(e.Status), e.Status, e.VendorErr)
}
