package wr_test

import (
	"fmt"
	"testing"

	"github.com/goverbs/goverbs/wr"
)

// TestValues: the constants are the kernel's (ib_user_verbs.h, ib_verbs.h;
// rdma-core's verbs.h has the same numbers), whatever the generated ABI
// file says, and every name has its String.
func TestValues(t *testing.T) {
	for _, c := range []struct {
		got  uint32
		want uint32
		s    fmt.Stringer
		name string
	}{
		{uint32(wr.OpRDMAWrite), 0, wr.OpRDMAWrite, "RDMA_WRITE"},
		{uint32(wr.OpRDMAWriteWithImm), 1, wr.OpRDMAWriteWithImm, "RDMA_WRITE_WITH_IMM"},
		{uint32(wr.OpSend), 2, wr.OpSend, "SEND"},
		{uint32(wr.OpSendWithImm), 3, wr.OpSendWithImm, "SEND_WITH_IMM"},
		{uint32(wr.OpRDMARead), 4, wr.OpRDMARead, "RDMA_READ"},
		{uint32(wr.OpAtomicCmpAndSwp), 5, wr.OpAtomicCmpAndSwp, "ATOMIC_CMP_AND_SWP"},
		{uint32(wr.OpAtomicFetchAndAdd), 6, wr.OpAtomicFetchAndAdd, "ATOMIC_FETCH_AND_ADD"},
		{uint32(wr.OpLocalInv), 7, wr.OpLocalInv, "LOCAL_INV"},
		{uint32(wr.OpBindMW), 8, wr.OpBindMW, "BIND_MW"},
		{uint32(wr.OpSendWithInv), 9, wr.OpSendWithInv, "SEND_WITH_INV"},
		{uint32(wr.WCSend), 0, wr.WCSend, "SEND"},
		{uint32(wr.WCRDMAWrite), 1, wr.WCRDMAWrite, "RDMA_WRITE"},
		{uint32(wr.WCRDMARead), 2, wr.WCRDMARead, "RDMA_READ"},
		{uint32(wr.WCCompSwap), 3, wr.WCCompSwap, "COMP_SWAP"},
		{uint32(wr.WCFetchAdd), 4, wr.WCFetchAdd, "FETCH_ADD"},
		{uint32(wr.WCBindMW), 5, wr.WCBindMW, "BIND_MW"},
		{uint32(wr.WCLocalInv), 6, wr.WCLocalInv, "LOCAL_INV"},
		{uint32(wr.WCRecv), 128, wr.WCRecv, "RECV"},
		{uint32(wr.WCRecvRDMAImm), 129, wr.WCRecvRDMAImm, "RECV_RDMA_WITH_IMM"},
		{uint32(wr.WCSuccess), 0, wr.WCSuccess, "success"},
		{uint32(wr.WCWRFlushErr), 5, wr.WCWRFlushErr, "WR flushed"},
		{uint32(wr.WCRemAccessErr), 10, wr.WCRemAccessErr, "remote access error"},
		{uint32(wr.WCRetryExcErr), 12, wr.WCRetryExcErr, "transport retry counter exceeded"},
		{uint32(wr.WCRNRRetryExcErr), 13, wr.WCRNRRetryExcErr, "RNR retry counter exceeded"},
		{uint32(wr.WCGeneralErr), 21, wr.WCGeneralErr, "general error"},
	} {
		if c.got != c.want || c.s.String() != c.name {
			t.Errorf("%s: value %d, String %q; want %d, %q", c.name, c.got, c.s, c.want, c.name)
		}
	}
	for _, c := range []struct{ got, want uint32 }{
		{uint32(wr.SendFence), 1}, {uint32(wr.SendSignaled), 2}, {uint32(wr.SendSolicited), 4}, {uint32(wr.SendInline), 8},
		{uint32(wr.WCWithGRH), 1}, {uint32(wr.WCWithImm), 2}, {uint32(wr.WCWithInv), 4},
	} {
		if c.got != c.want {
			t.Errorf("flag %d, want %d", c.got, c.want)
		}
	}
	if s := wr.Opcode(77).String(); s != "Opcode(77)" {
		t.Errorf("unknown opcode: %q", s)
	}
	if s := wr.WCStatus(99).String(); s != "WCStatus(99)" {
		t.Errorf("unknown status: %q", s)
	}
	w := wr.WC{ID: 7, Status: wr.WCRemAccessErr, VendorErr: 0x12}
	if err := w.Err(); err == nil || err.Error() != "work request 7 completed with status 10: remote access error (vendor error 0x12)" {
		t.Errorf("WC.Err: %v", err)
	}
	if err := (&wr.WC{Status: wr.WCSuccess}).Err(); err != nil {
		t.Errorf("successful WC.Err: %v", err)
	}
}
