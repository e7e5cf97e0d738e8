package qp_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/goverbs/goverbs"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

// wantClosed checks that err is ErrClosed (qp's and goverbs') and names
// what was closed.
func wantClosed(t *testing.T, what string, err error, name string) {
	t.Helper()
	if !errors.Is(err, qp.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) || !strings.Contains(err.Error(), name) {
		t.Errorf("%s: %v, want ErrClosed naming the %s", what, err, name)
	}
}

// TestCreateClosedMeanwhile: Create read the handles of its PD, CQs and
// SRQ, then let the provider prepare the QP (NewQP), then sent CREATE_QP
// with them. A Close of one of them in between destroyed the handle, and
// the kernel gives the lowest free handle to the context's next object:
// with nothing made meanwhile CREATE_QP failed with the kernel's EINVAL
// instead of ErrClosed; with a PD, CQ or SRQ made meanwhile (replace) the
// QP was made on that one, and Create succeeded. The provider's NewQP hook
// (rxetest.OpenHooked) runs the Close in that step. Create now holds them
// open across the command (a Close waits for it), so it finds the one
// closed before and returns ErrClosed naming it.
func TestCreateClosedMeanwhile(t *testing.T) {
	name := rxetest.One(t)
	for _, which := range []string{"PD", "send CQ", "receive CQ", "SRQ"} {
		for _, replace := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/replace=%v", strings.ReplaceAll(which, " ", "_"), replace), func(t *testing.T) {
				ctx, hooks := rxetest.OpenHooked(t, name)
				pd, err := ctx.AllocPD()
				if err != nil {
					t.Fatal(err)
				}
				send, err := cq.Create(ctx, 8)
				if err != nil {
					t.Fatal(err)
				}
				recv, err := cq.Create(ctx, 8)
				if err != nil {
					t.Fatal(err)
				}
				cfg := qp.Config{Type: qp.RC, SendCQ: send, RecvCQ: recv, MaxSendWR: 4, MaxRecvWR: 4}
				var victim interface{ Close() error }
				var remake func() (any, error)
				switch which {
				case "PD":
					victim, remake = pd, func() (any, error) { return ctx.AllocPD() }
				case "send CQ", "receive CQ":
					victim = send
					if which == "receive CQ" {
						victim = recv
					}
					remake = func() (any, error) { return cq.Create(ctx, 8) }
				case "SRQ":
					srq, err := qp.CreateSRQ(pd, qp.SRQConfig{MaxWR: 4})
					if err != nil {
						t.Fatal(err)
					}
					cfg.SRQ, cfg.MaxRecvWR = srq, 0
					victim, remake = srq, func() (any, error) { return qp.CreateSRQ(pd, qp.SRQConfig{MaxWR: 4}) }
				}
				var hookErr error
				hooks.BeforeNewQP(func() {
					if hookErr = victim.Close(); hookErr != nil || !replace {
						return
					}
					_, hookErr = remake() // takes the destroyed handle
				})
				q, err := qp.Create(pd, cfg)
				if hookErr != nil {
					t.Fatalf("the hook's close or remake of the %s: %v", which, hookErr)
				}
				if err == nil {
					q.Close()
					t.Fatalf("Create succeeded with its %s closed before CREATE_QP: the QP was made on the object that took the handle", which)
				}
				wantClosed(t, "Create with the "+which+" closed meanwhile", err, which)
			})
		}
	}
}

// TestCreateSRQClosedPDMeanwhile: CreateSRQ read its PD's handle before
// the provider's NewSRQ and used it after: a PD closed in between made
// CREATE_SRQ fail with the kernel's error, or, with a PD made meanwhile
// (replace), made the SRQ in that one. It now holds the PD open across
// the command and returns ErrClosed naming the PD.
func TestCreateSRQClosedPDMeanwhile(t *testing.T) {
	name := rxetest.One(t)
	for _, replace := range []bool{false, true} {
		t.Run(fmt.Sprintf("replace=%v", replace), func(t *testing.T) {
			ctx, hooks := rxetest.OpenHooked(t, name)
			pd, err := ctx.AllocPD()
			if err != nil {
				t.Fatal(err)
			}
			var hookErr error
			hooks.BeforeNewSRQ(func() {
				if hookErr = pd.Close(); hookErr != nil || !replace {
					return
				}
				_, hookErr = ctx.AllocPD()
			})
			srq, err := qp.CreateSRQ(pd, qp.SRQConfig{MaxWR: 4})
			if hookErr != nil {
				t.Fatalf("the hook's close or remake of the PD: %v", hookErr)
			}
			if err == nil {
				srq.Close()
				t.Fatal("CreateSRQ succeeded with its PD closed before CREATE_SRQ: the SRQ was made in the PD that took the handle")
			}
			wantClosed(t, "CreateSRQ with the PD closed meanwhile", err, "PD")
		})
	}
}

// TestCreateDuringSRQClose: a Create that names an SRQ whose Close is in
// progress (its lock held, not yet destroyed) waits for that Close and
// returns ErrClosed. It read the handle without the lock and made the QP
// on the SRQ as it was being destroyed (the Close then failed, EBUSY).
func TestCreateDuringSRQClose(t *testing.T) {
	s := newSide(t, rxetest.One(t), pairOpts{})
	srq, err := qp.CreateSRQ(s.pd, qp.SRQConfig{MaxWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	var made *qp.QP
	duringClose(t, "Create", "qp.Create(", srq, func() error {
		q, err := qp.Create(s.pd, qp.Config{Type: qp.RC, SendCQ: s.cq, RecvCQ: s.cq, MaxSendWR: 4, SRQ: srq})
		made = q
		return err
	}, func() { made.Close() })
}

// TestUDSendClosedAH: a UD send through a closed address handle was
// posted: the device found no AH of that number when it sent (rxe: "Unable
// to find AH matching ah_num") and moved the QP to ERR, so this and every
// later send failed (WR_FLUSH_ERR), or it went to the AH the kernel gave
// the number since. PostSend and QueueSend now refuse it with ErrClosed
// before anything is posted (one atomic load per request), the whole
// batch, and the QP stays usable.
func TestUDSendClosedAH(t *testing.T) {
	a, b, ah := udPair(t)
	live, err := a.pd.CreateAH(uverbs.AHAttr{DGID: b.gid.GID})
	if err != nil {
		t.Fatal(err)
	}
	if err := ah.Close(); err != nil {
		t.Fatal(err)
	}
	send := func(ah *uverbs.AH, id uint64) qp.SendWR {
		return qp.SendWR{ID: id, Opcode: qp.OpSend, Flags: qp.Signaled, AH: ah.Provider(), RemoteQPN: b.qp.QPN(),
			RemoteQKey: qkey, SGEs: a.sges(t, 0, 8)}
	}
	for _, op := range []struct {
		name string
		post func([]qp.SendWR) error
	}{{"PostSend", a.qp.PostSend}, {"QueueSend", a.qp.QueueSend}} {
		// The closed AH second: the first request is not posted either.
		err := op.post([]qp.SendWR{send(live, 1), send(ah, 2)})
		wantClosed(t, op.name+" through a closed AH", err, "address handle closed")
		if err == nil {
			a.qp.Ring()
		}
	}
	// Nothing was posted, and the QP still sends.
	a.noMore(t, 0)
	if err := b.qp.PostRecv([]qp.RecvWR{{ID: 3, SGEs: []qp.SGE{b.sge(t, dstOff, qp.GRHSize+64)}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend([]qp.SendWR{send(live, 4)}); err != nil {
		t.Fatal(err)
	}
	if w := a.waitOK(t, 1); w[0].ID != 4 {
		t.Errorf("send completion %+v, want ID 4 only (the refused batches posted nothing)", w[0])
	}
	b.waitOK(t, 1)
}
