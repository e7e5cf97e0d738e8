package qp_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

func TestSmokeSend(t *testing.T) {
	a, b := rxetest.Pair(t)
	type side struct {
		ctx *uverbs.Context
		pd  *uverbs.PD
		m   *mr.MR
		cq  *cq.CQ
		q   *qp.QP
	}
	mk := func(name string) *side {
		s := &side{ctx: rxetest.Open(t, name)}
		var err error
		if s.pd, err = s.ctx.AllocPD(); err != nil {
			t.Fatal(err)
		}
		mem, err := mr.Alloc(1 << 16)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mem.Close() })
		if s.m, err = mr.Register(s.pd, mem.Bytes(), mr.LocalWrite|mr.RemoteWrite|mr.RemoteRead); err != nil {
			t.Fatal(err)
		}
		if s.cq, err = cq.Create(s.ctx, 64); err != nil {
			t.Fatal(err)
		}
		if s.q, err = qp.Create(s.pd, qp.Config{SendCQ: s.cq, RecvCQ: s.cq, MaxSendWR: 16, MaxRecvWR: 16}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	sa, sb := mk(a), mk(b)
	ga, err := sa.ctx.DefaultGID(1)
	if err != nil {
		t.Fatal(err)
	}
	gb, err := sb.ctx.DefaultGID(1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s gid %v qpn %d; %s gid %v qpn %d", a, ga.GID, sa.q.QPN(), b, gb.GID, sb.q.QPN())
	if err := sa.q.Connect(qp.Remote{QPN: sb.q.QPN(), PSN: 200, GID: gb.GID}, qp.ConnectOptions{PSN: 100}); err != nil {
		t.Fatal(err)
	}
	if err := sb.q.Connect(qp.Remote{QPN: sa.q.QPN(), PSN: 100, GID: ga.GID}, qp.ConnectOptions{PSN: 200}); err != nil {
		t.Fatal(err)
	}
	rsge, _ := sb.m.SGE(0, 4096)
	if err := sb.q.PostRecv([]qp.RecvWR{{ID: 7, SGEs: []qp.SGE{rsge}}}); err != nil {
		t.Fatal(err)
	}
	msg := []byte("hello from goverbs")
	copy(sa.m.Bytes(), msg)
	ssge, _ := sa.m.SGE(0, len(msg))
	if err := sa.q.PostSend([]qp.SendWR{{ID: 9, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{ssge}}}); err != nil {
		t.Fatal(err)
	}
	wc := make([]cq.WC, 4)
	for _, s := range []*side{sa, sb} {
		deadline := time.Now().Add(5 * time.Second)
		for {
			n, err := s.cq.Poll(wc)
			if err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				t.Logf("%s: %+v", s.ctx.Name(), wc[0])
				if err := wc[0].Err(); err != nil {
					t.Fatal(err)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no completion", s.ctx.Name())
			}
			time.Sleep(time.Millisecond)
		}
	}
	if !bytes.Equal(sb.m.Bytes()[:len(msg)], msg) {
		t.Fatalf("received %q", sb.m.Bytes()[:len(msg)])
	}
}
