package provider

import "github.com/goverbs/goverbs/wr"

// The work request and completion types and values live in package wr,
// a leaf that users may import alone; a provider names them here too.
type (
	SGE       = wr.SGE
	Opcode    = wr.Opcode
	SendFlags = wr.SendFlags
	SendWR    = wr.SendWR
	MWBind    = wr.MWBind
	RecvWR    = wr.RecvWR
	AH        = wr.AH
	WCStatus  = wr.WCStatus
	WCOpcode  = wr.WCOpcode
	WCFlags   = wr.WCFlags
	WC        = wr.WC
	WCError   = wr.WCError
)

// Opcodes, flags and statuses: package wr's.
const (
	OpRDMAWrite         = wr.OpRDMAWrite
	OpRDMAWriteWithImm  = wr.OpRDMAWriteWithImm
	OpSend              = wr.OpSend
	OpSendWithImm       = wr.OpSendWithImm
	OpRDMARead          = wr.OpRDMARead
	OpAtomicCmpAndSwp   = wr.OpAtomicCmpAndSwp
	OpAtomicFetchAndAdd = wr.OpAtomicFetchAndAdd
	OpLocalInv          = wr.OpLocalInv
	OpBindMW            = wr.OpBindMW
	OpSendWithInv       = wr.OpSendWithInv
	SendFence           = wr.SendFence
	SendSignaled        = wr.SendSignaled
	SendSolicited       = wr.SendSolicited
	SendInline          = wr.SendInline
	WCSuccess           = wr.WCSuccess
	WCLocLenErr         = wr.WCLocLenErr
	WCLocQPOpErr        = wr.WCLocQPOpErr
	WCLocEECOpErr       = wr.WCLocEECOpErr
	WCLocProtErr        = wr.WCLocProtErr
	WCWRFlushErr        = wr.WCWRFlushErr
	WCMWBindErr         = wr.WCMWBindErr
	WCBadRespErr        = wr.WCBadRespErr
	WCLocAccessErr      = wr.WCLocAccessErr
	WCRemInvReqErr      = wr.WCRemInvReqErr
	WCRemAccessErr      = wr.WCRemAccessErr
	WCRemOpErr          = wr.WCRemOpErr
	WCRetryExcErr       = wr.WCRetryExcErr
	WCRNRRetryExcErr    = wr.WCRNRRetryExcErr
	WCLocRDDViolErr     = wr.WCLocRDDViolErr
	WCRemInvRDReqErr    = wr.WCRemInvRDReqErr
	WCRemAbortErr       = wr.WCRemAbortErr
	WCInvEECNErr        = wr.WCInvEECNErr
	WCInvEECStateErr    = wr.WCInvEECStateErr
	WCFatalErr          = wr.WCFatalErr
	WCRespTimeoutErr    = wr.WCRespTimeoutErr
	WCGeneralErr        = wr.WCGeneralErr
	WCSend              = wr.WCSend
	WCRDMAWrite         = wr.WCRDMAWrite
	WCRDMARead          = wr.WCRDMARead
	WCCompSwap          = wr.WCCompSwap
	WCFetchAdd          = wr.WCFetchAdd
	WCBindMW            = wr.WCBindMW
	WCLocalInv          = wr.WCLocalInv
	WCRecv              = wr.WCRecv
	WCRecvRDMAImm       = wr.WCRecvRDMAImm
	WCWithGRH           = wr.WCWithGRH
	WCWithImm           = wr.WCWithImm
	WCWithInv           = wr.WCWithInv
)
