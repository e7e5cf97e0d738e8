package qp_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs/provider"
)

// hookLog records the provider hooks the core calls, in order.
type hookLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *hookLog) add(f string, a ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, fmt.Sprintf(f, a...))
}

func (l *hookLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.calls
	l.calls = nil
	return c
}

// hookedQP and hookedCQ are rxe's QP and CQ with the hooks a hardware
// provider implements (provider.QPModifier, QPDestroyer, CQCleaner),
// recording their calls: the real device underneath, only the hooks
// observed.
type hookedQP struct {
	provider.QP
	log *hookLog
}

func (q *hookedQP) BeforeModify(mask uint32, to provider.QPState) error {
	q.log.add("before modify %d", to)
	return nil
}

func (q *hookedQP) AfterModify(mask uint32, to provider.QPState) error {
	q.log.add("after modify %d", to)
	return nil
}

func (q *hookedQP) BeforeDestroy() error {
	q.log.add("before destroy")
	return nil
}

type hookedCQ struct {
	provider.CQ
	log *hookLog
}

func (c *hookedCQ) Clean(qpn uint32, srq provider.SRQ) {
	c.log.add("clean qpn %d srq %v", qpn, srq != nil)
}

// TestProviderHooks: with a provider that implements the hardware hooks,
// the core calls them around MODIFY_QP (before and after, with the target
// state), cleans the CQs of the QP after a move to RESET and after
// DESTROY_QP (one CQ for send and receive: cleaned once), and calls
// BeforeDestroy first.
func TestProviderHooks(t *testing.T) {
	na, _ := rxetest.Pair(t)
	log := &hookLog{}
	ctx, h := rxetest.OpenHooked(t, na)
	h.WrapQP = func(q provider.QP) provider.QP { return &hookedQP{QP: q, log: log} }
	h.WrapCQ = func(c provider.CQ) provider.CQ { return &hookedCQ{CQ: c, log: log} }
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	c, err := cq.Create(ctx, 8)
	if err != nil {
		t.Fatal(err)
	}
	q, err := qp.Create(pd, qp.Config{Type: qp.RC, SendCQ: c, RecvCQ: c, MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Init(1, 0); err != nil {
		t.Fatal(err)
	}
	if err := q.Modify(&qp.Attr{State: qp.Reset}, qp.MaskState); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	n := q.QPN()
	want := []string{
		"before modify 1", "after modify 1", // INIT
		"before modify 0", fmt.Sprintf("clean qpn %d srq false", n), "after modify 0", // RESET
		"before destroy", fmt.Sprintf("clean qpn %d srq false", n),
	}
	if got := log.take(); !slices.Equal(got, want) {
		t.Errorf("hooks called:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}
