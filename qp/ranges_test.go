package qp_test

import (
	"testing"

	"github.com/goverbs/goverbs/qp"
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
