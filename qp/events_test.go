package qp_test

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

// collect reads events until want returns true or the deadline passes.
func collect(t *testing.T, ch <-chan uverbs.AsyncEvent, d time.Duration, want func(uverbs.AsyncEvent) bool) []uverbs.AsyncEvent {
	t.Helper()
	var got []uverbs.AsyncEvent
	d = hang.Scale(d) // a hang bound, not a speed bound
	timeout := time.After(d)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("event channel closed; got %v", got)
			}
			t.Logf("event: %v", ev)
			got = append(got, ev)
			if want(ev) {
				return got
			}
		case <-timeout:
			t.Fatalf("no matching event within %v (%s); got %v", d, hang.How(), got)
		}
	}
}

// TestAsyncCQOverflow overruns a receive CQ: rxe reports CQ_ERR for it.
// (rxe on 6.1 raises no async event when a QP goes to ERR, forced or after
// a transport error: it only flushes the work requests; TestFlushOnError
// checks that.)
func TestAsyncCQOverflow(t *testing.T) {
	na, nb := rxetest.Pair(t)
	a := newSide(t, na, pairOpts{})
	b := newSide(t, nb, pairOpts{})
	// b receives into a CQ smaller than the number of messages.
	small, err := cq.Create(b.ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	rq, err := qp.Create(b.pd, qp.Config{SendCQ: b.cq, RecvCQ: small, MaxSendWR: 8, MaxRecvWR: 64})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.qp.Connect(qp.Remote{QPN: rq.QPN(), GID: b.gid.GID}, qp.ConnectOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := rq.Connect(qp.Remote{QPN: a.qp.QPN(), GID: a.gid.GID}, qp.ConnectOptions{}); err != nil {
		t.Fatal(err)
	}
	ev, err := b.ctx.Events()
	if err != nil {
		t.Fatal(err)
	}
	n := small.Len() + 4
	recvs := make([]qp.RecvWR, n)
	sends := make([]qp.SendWR, n)
	for i := range n {
		recvs[i] = qp.RecvWR{ID: uint64(i), SGEs: []qp.SGE{b.sge(t, i*64, 64)}}
		sends[i] = qp.SendWR{ID: uint64(i), Opcode: qp.OpSend, SGEs: []qp.SGE{a.sge(t, 0, 8)}}
	}
	if err := rq.PostRecv(recvs); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(sends); err != nil {
		t.Fatal(err)
	}
	got := collect(t, ev, 20*time.Second, func(e uverbs.AsyncEvent) bool { return e.Type == uverbs.EventCQErr })
	last := got[len(got)-1]
	if last.Object != small {
		t.Errorf("CQ_ERR names %v, want the overrun CQ %v", last.Object, small)
	}
	if last.Type.Kind() != "cq" || !strings.Contains(last.String(), "CQ_ERR on CQ") {
		t.Errorf("event %q", last)
	}
	rq.Close()
	small.Close()
}

// TestAsyncPortDownUp takes the netdev under the first device down and up.
func TestAsyncPortDownUp(t *testing.T) {
	a, b := connectedPair(t, pairOpts{})
	ev, err := a.ctx.Events()
	if err != nil {
		t.Fatal(err)
	}
	info := a.ctx.Info()
	netdev := info.Parent
	if netdev == "" {
		t.Skip("no netdev parent")
	}
	if out, err := exec.Command("ip", "link", "set", netdev, "down").CombinedOutput(); err != nil {
		t.Fatalf("ip link set %s down: %v %s", netdev, err, out)
	}
	defer exec.Command("ip", "link", "set", netdev, "up").Run()
	collect(t, ev, 10*time.Second, func(e uverbs.AsyncEvent) bool { return e.Type == uverbs.EventPortErr })
	if out, err := exec.Command("ip", "link", "set", netdev, "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set %s up: %v %s", netdev, err, out)
	}
	collect(t, ev, 20*time.Second, func(e uverbs.AsyncEvent) bool { return e.Type == uverbs.EventPortActive })
	// The port is back: the connection still carries data.
	if err := b.qp.PostRecv([]qp.RecvWR{{ID: 1, SGEs: []qp.SGE{b.sge(t, dstOff, 64)}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend([]qp.SendWR{{ID: 1, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{a.sge(t, 0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	a.waitOK(t, 1)
	b.waitOK(t, 1)
}

// TestFlushOnError forces a QP with outstanding receives and sends to ERR:
// every outstanding work request completes with a flush error, in order;
// the QP then goes back to RESET and is reused for a new connection.
func TestFlushOnError(t *testing.T) {
	a, b := connectedPair(t, pairOpts{})
	recvs := make([]qp.RecvWR, 5)
	for i := range recvs {
		recvs[i] = qp.RecvWR{ID: uint64(100 + i), SGEs: []qp.SGE{b.sge(t, i*64, 64)}}
	}
	if err := b.qp.PostRecv(recvs); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ToError(); err != nil {
		t.Fatal(err)
	}
	attr, err := b.qp.Query()
	if err != nil || attr.State != qp.Err {
		t.Fatalf("Query after ToError: %v %v", attr.State, err)
	}
	got := b.wait(t, len(recvs))
	for i, w := range got {
		if w.ID != uint64(100+i) || w.Status.String() != "WR flushed" {
			t.Errorf("completion %d: %+v, want a flush of %d", i, w, 100+i)
		}
	}
	// Sends posted on an ERR QP flush too.
	if err := b.qp.PostSend([]qp.SendWR{{ID: 7, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{b.sge(t, 0, 8)}}}); err == nil {
		t.Error("PostSend on an ERR QP accepted")
	}
	// Reset and reconnect both sides: the QPs carry data again.
	for _, s := range []*side{a, b} {
		if err := s.qp.Modify(&qp.Attr{State: qp.Reset}, qp.MaskState); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.qp.Connect(qp.Remote{QPN: b.qp.QPN(), PSN: 7, GID: b.gid.GID}, qp.ConnectOptions{PSN: 9}); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(qp.Remote{QPN: a.qp.QPN(), PSN: 9, GID: a.gid.GID}, qp.ConnectOptions{PSN: 7}); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.PostRecv(recvs[:1]); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend([]qp.SendWR{{ID: 8, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{a.sge(t, 0, 8)}}}); err != nil {
		t.Fatal(err)
	}
	a.waitOK(t, 1)
	if w := b.waitOK(t, 1)[0]; w.ID != 100 {
		t.Errorf("after reuse received into %d", w.ID)
	}
}
