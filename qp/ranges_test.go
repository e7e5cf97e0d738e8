package qp_test

import (
	"testing"

	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/uverbs/rxe"
)

// TestModifyRanges needs no device: attributes wider than their field are
// refused before the kernel sees them. rxe takes a destination QPN over
// 24 bits and sends to the QP of its low 24, stores a retry count or RNR
// retry over 7 as given (8 RNR retries are not infinite, 7 is), and masks
// an RNR timer over 31 to 5 bits (32 becomes 0, the longest).
func TestModifyRanges(t *testing.T) {
	for _, tc := range []struct {
		attr qp.Attr
		mask qp.AttrMask
		want string // "" for accepted
	}{
		{qp.Attr{DestQPN: 1<<24 - 1}, qp.MaskDestQPN, ""},
		{qp.Attr{DestQPN: 1<<24 | 5}, qp.MaskDestQPN, "over 24 bits"},
		{qp.Attr{DestQPN: 1 << 24}, 0, ""}, // not in the mask: not looked at
		{qp.Attr{Timeout: 31, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 31}, qp.MaskTimeout | qp.MaskRetryCnt | qp.MaskRNRRetry | qp.MaskMinRNRTimer, ""},
		{qp.Attr{Timeout: 32}, qp.MaskTimeout, "timeout 32"},
		{qp.Attr{RetryCnt: 8}, qp.MaskRetryCnt, "retry count 8"},
		{qp.Attr{RNRRetry: 8}, qp.MaskRNRRetry, "RNR retry 8"},
		{qp.Attr{MinRNRTimer: 32}, qp.MaskMinRNRTimer, "RNR timer 32"},
		{qp.Attr{State: qp.RTR, DestQPN: 1 << 24}, qp.MaskState | qp.MaskDestQPN, "over 24 bits"},
	} {
		err := qp.CheckModify(&tc.attr, tc.mask)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v mask %#x: %v", tc.attr, tc.mask, err)
		case tc.want != "":
			wantErr(t, err, tc.want)
		}
	}
}

// TestUDRemoteQPN needs no device: a UD send to a QPN over 24 bits is
// refused, naming the request; rxe would send it to the QP of the low 24.
func TestUDRemoteQPN(t *testing.T) {
	ah := &rxe.AH{}
	ok := qp.SendWR{ID: 1, Opcode: qp.OpSend, AH: ah, RemoteQPN: 1<<24 - 1}
	if err := qp.CheckUD([]qp.SendWR{ok}); err != nil {
		t.Fatalf("UD send to QPN %#x: %v", ok.RemoteQPN, err)
	}
	bad := ok
	bad.ID, bad.RemoteQPN = 2, 1<<24|7
	err := qp.CheckUD([]qp.SendWR{ok, bad})
	wantErr(t, err, "request 1 (id 2): remote QPN 0x1000007 is over 24 bits")
}

// TestConnectBadRanges: a remote QPN over 24 bits, or a retry, RNR or
// timeout option out of its range, is refused before any state change
// (Connect resets a live QP first): a connected QP stays connected.
func TestConnectBadRanges(t *testing.T) {
	a, b := connectedPair(t, pairOpts{})
	g := b.gid.GID
	for _, tc := range []struct {
		remote qp.Remote
		o      qp.ConnectOptions
		want   string
	}{
		{qp.Remote{QPN: 1<<24 | b.qp.QPN(), GID: g}, qp.ConnectOptions{}, "over 24 bits"},
		{qp.Remote{QPN: b.qp.QPN(), GID: g}, qp.ConnectOptions{RetryCnt: 8}, "retry count 8"},
		{qp.Remote{QPN: b.qp.QPN(), GID: g}, qp.ConnectOptions{RNRRetry: 9}, "RNR retry 9"},
		{qp.Remote{QPN: b.qp.QPN(), GID: g}, qp.ConnectOptions{MinRNRTimer: 32}, "RNR timer 32"},
		{qp.Remote{QPN: b.qp.QPN(), GID: g}, qp.ConnectOptions{Timeout: 40}, "timeout 40"},
	} {
		wantErr(t, a.qp.Connect(tc.remote, tc.o), tc.want)
		if a.qp.State() != qp.RTS {
			t.Fatalf("state %v after a refused Connect (%s), want RTS", a.qp.State(), tc.want)
		}
	}
	// Modify refuses them too, and leaves the QP as it was.
	wantErr(t, a.qp.Modify(&qp.Attr{RetryCnt: 8}, qp.MaskRetryCnt), "retry count 8")
	// Still connected: a send arrives.
	if err := b.qp.PostRecv([]qp.RecvWR{{ID: 1, SGEs: []qp.SGE{b.sge(t, dstOff, 64)}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend([]qp.SendWR{{ID: 1, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{a.sge(t, 0, 8)}}}); err != nil {
		t.Fatal(err)
	}
	a.waitOK(t, 1)
	b.waitOK(t, 1)
}

// TestReadWithoutReadSlots: an RC QP brought to RTS by hand with
// MaxRdAtomic 0 (the mask bit is required there, and 0 is Attr's zero
// value) refuses an RDMA READ or atomic, naming it; rxe took it and held
// it, and every request behind it, for ever. A SEND still goes, and a QP
// moved to RTS with MaxRdAtomic 1 reads.
func TestReadWithoutReadSlots(t *testing.T) {
	na, nb := rxetest.Pair(t)
	a, b := newSide(t, na, pairOpts{}), newSide(t, nb, pairOpts{})
	acc := mr.RemoteWrite | mr.RemoteRead | mr.RemoteAtomic
	if err := b.qp.Connect(qp.Remote{QPN: a.qp.QPN(), PSN: 0x1111, GID: a.gid.GID}, qp.ConnectOptions{PSN: 0x2222, Access: acc}); err != nil {
		t.Fatal(err)
	}
	up := func(rd uint8, psn uint32) { // psn: where b expects a's next request
		t.Helper()
		if err := a.qp.Modify(&qp.Attr{State: qp.Reset}, qp.MaskState); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.Init(1, acc); err != nil {
			t.Fatal(err)
		}
		av := qp.AV{Port: 1, IsGlobal: true, DGID: b.gid.GID, SGIDIndex: uint8(a.gid.Index), HopLimit: 1}
		if err := a.qp.Modify(&qp.Attr{State: qp.RTR, AV: av, PathMTU: uverbs.MTU1024, DestQPN: b.qp.QPN(), RQPSN: 0x2222,
			MaxDestRdAtomic: 1, MinRNRTimer: 12}, qp.MaskState|qp.MaskAV|qp.MaskPathMTU|qp.MaskDestQPN|qp.MaskRQPSN|
			qp.MaskMaxDestRdAtomic|qp.MaskMinRNRTimer); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.Modify(&qp.Attr{State: qp.RTS, SQPSN: psn, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: rd},
			qp.MaskState|qp.MaskSQPSN|qp.MaskTimeout|qp.MaskRetryCnt|qp.MaskRNRRetry|qp.MaskMaxQPRdAtomic); err != nil {
			t.Fatal(err)
		}
	}
	read := qp.SendWR{ID: 5, Opcode: qp.OpRDMARead, Flags: qp.Signaled, RemoteAddr: b.addr(dstOff), RKey: b.mr.RKey(), SGEs: []qp.SGE{a.sge(t, srcOff, 64)}}
	up(0, 0x1111)
	send := qp.SendWR{ID: 4, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{a.sge(t, 0, 8)}}
	wantErr(t, a.qp.PostSend([]qp.SendWR{send, read}), "work request 1 (id 5): RDMA_READ on a QP whose MaxRdAtomic is 0")
	faa := qp.SendWR{ID: 6, Opcode: qp.OpAtomicFetchAndAdd, Flags: qp.Signaled, RemoteAddr: b.addr(dstOff), RKey: b.mr.RKey(), SGEs: []qp.SGE{a.sge(t, srcOff, 8)}}
	wantErr(t, a.qp.PostSend([]qp.SendWR{faa}), "MaxRdAtomic is 0")
	// Nothing of the refused batch went: the SEND alone does.
	if err := b.qp.PostRecv([]qp.RecvWR{{ID: 1, SGEs: []qp.SGE{b.sge(t, dstOff, 64)}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend([]qp.SendWR{send}); err != nil {
		t.Fatal(err)
	}
	a.waitOK(t, 1)
	b.waitOK(t, 1)
	up(1, 0x1112) // after the SEND
	if err := a.qp.PostSend([]qp.SendWR{read}); err != nil {
		t.Fatalf("READ with MaxRdAtomic 1: %v", err)
	}
	a.waitOK(t, 1)
}
