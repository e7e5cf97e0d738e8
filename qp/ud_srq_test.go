package qp_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
	wcs "github.com/goverbs/goverbs/wr" // (wr is a local name in this package's tests)
)

const qkey = 0x11111111

// udPair returns UD QPs on rxe0 and rxe1, in RTS, and an AH on a to b.
func udPair(t *testing.T) (*side, *side, *uverbs.AH) {
	na, nb := rxetest.Pair(t)
	a := newSide(t, na, pairOpts{cfg: qp.Config{Type: qp.UD}})
	b := newSide(t, nb, pairOpts{cfg: qp.Config{Type: qp.UD}})
	for _, s := range []*side{a, b} {
		if err := s.qp.ToRTS(qp.UDOptions{QKey: qkey}); err != nil {
			t.Fatal(err)
		}
	}
	ah, err := a.pd.CreateAH(uverbs.AHAttr{DGID: b.gid.GID})
	if err != nil {
		t.Fatal(err)
	}
	return a, b, ah
}

func TestUD(t *testing.T) {
	a, b, ah := udPair(t)
	mtu := a.qp.MaxUDPayload()
	if mtu < 256 {
		t.Fatalf("UD payload limit %d", mtu)
	}
	for _, n := range []int{0, 1, 100, mtu - 1, mtu} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			fill(a.mem.Bytes()[:n], byte(n))
			if err := b.qp.PostRecv([]qp.RecvWR{{ID: 5, SGEs: []qp.SGE{b.sge(t, dstOff, qp.GRHSize+mtu)}}}); err != nil {
				t.Fatal(err)
			}
			wr := qp.SendWR{ID: 6, Opcode: qp.OpSend, Flags: qp.Signaled, AH: ah.Provider(), RemoteQPN: b.qp.QPN(), RemoteQKey: qkey, SGEs: a.sges(t, 0, n)}
			if err := a.qp.PostSend([]qp.SendWR{wr}); err != nil {
				t.Fatal(err)
			}
			a.waitOK(t, 1)
			w := b.waitOK(t, 1)[0]
			if int(w.ByteLen) != qp.GRHSize+n || w.SrcQP != a.qp.QPN() || w.Flags&wcs.WCWithGRH == 0 {
				t.Fatalf("receive %+v: want %d bytes with GRH from QP %d", w, qp.GRHSize+n, a.qp.QPN())
			}
			buf := b.mem.Bytes()[dstOff:]
			grh, err := qp.ParseGRH(buf[:qp.GRHSize])
			if err != nil {
				t.Fatal(err)
			}
			if !grh.SGID.Equal(a.gid.GID) || !grh.DGID.Equal(b.gid.GID) {
				t.Errorf("GRH says %v -> %v, want %v -> %v", grh.SGID, grh.DGID, a.gid.GID, b.gid.GID)
			}
			if !bytes.Equal(buf[qp.GRHSize:qp.GRHSize+n], a.mem.Bytes()[:n]) {
				t.Error("UD payload differs")
			}
		})
	}
	// One byte over the MTU is refused before posting.
	err := a.qp.PostSend([]qp.SendWR{{Opcode: qp.OpSend, AH: ah.Provider(), RemoteQPN: b.qp.QPN(), RemoteQKey: qkey,
		SGEs: []qp.SGE{a.sge(t, 0, mtu+1)}}})
	if err == nil || !strings.Contains(err.Error(), "path MTU") {
		t.Errorf("oversize UD send: %v", err)
	}
	// No AH, or RDMA on UD: refused.
	if err := a.qp.PostSend([]qp.SendWR{{Opcode: qp.OpSend, RemoteQPN: b.qp.QPN(), SGEs: []qp.SGE{a.sge(t, 0, 8)}}}); err == nil {
		t.Error("UD send without an AH accepted")
	}
	if err := a.qp.PostSend([]qp.SendWR{{Opcode: qp.OpRDMAWrite, AH: ah.Provider(), SGEs: []qp.SGE{a.sge(t, 0, 8)}}}); err == nil {
		t.Error("RDMA WRITE on a UD QP accepted")
	}
	// A wrong QKey is dropped by the receiver: the send completes, nothing arrives.
	if err := b.qp.PostRecv([]qp.RecvWR{{ID: 9, SGEs: []qp.SGE{b.sge(t, dstOff, qp.GRHSize+mtu)}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend([]qp.SendWR{{ID: 1, Opcode: qp.OpSend, Flags: qp.Signaled, AH: ah.Provider(), RemoteQPN: b.qp.QPN(),
		RemoteQKey: qkey + 1, SGEs: []qp.SGE{a.sge(t, 0, 8)}}}); err != nil {
		t.Fatal(err)
	}
	a.waitOK(t, 1)
	b.noMore(t, 200*time.Millisecond)
	if err := ah.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ah.Close(); err != nil {
		t.Errorf("second AH Close: %v", err)
	}
}

func TestParseGRH(t *testing.T) {
	var v4 [40]byte
	v4[20] = 0x45
	v4[28] = 64
	copy(v4[32:], []byte{10, 99, 0, 1, 10, 99, 0, 2})
	g, err := qp.ParseGRH(v4[:])
	if err != nil || !g.SGID.Equal(net.IPv4(10, 99, 0, 1)) || !g.DGID.Equal(net.IPv4(10, 99, 0, 2)) || g.HopLimit != 64 {
		t.Errorf("IPv4: %+v %v", g, err)
	}
	var v6 [40]byte
	v6[0] = 0x60
	v6[7] = 1
	copy(v6[8:], net.ParseIP("fe80::1"))
	copy(v6[24:], net.ParseIP("fe80::2"))
	g, err = qp.ParseGRH(v6[:])
	if err != nil || !g.SGID.Equal(net.ParseIP("fe80::1")) || !g.DGID.Equal(net.ParseIP("fe80::2")) {
		t.Errorf("IPv6: %+v %v", g, err)
	}
	if _, err := qp.ParseGRH(v6[:39]); err == nil {
		t.Error("short GRH accepted")
	}
	if _, err := qp.ParseGRH(make([]byte, 40)); err == nil {
		t.Error("zero GRH accepted")
	}
}

// TestSRQ: two senders on rxe0 send to two QPs on rxe1 that receive from
// one SRQ; every message lands in the shared pool, and the limit event
// fires when the pool runs low.
func TestSRQ(t *testing.T) {
	na, nb := rxetest.Pair(t)
	b := newSide(t, nb, pairOpts{})
	srq, err := qp.CreateSRQ(b.pd, qp.SRQConfig{MaxWR: 64})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := b.ctx.Events()
	if err != nil {
		t.Fatal(err)
	}
	var senders []*side
	var receivers []*qp.QP
	for i := range 2 {
		a := newSide(t, na, pairOpts{})
		r, err := qp.Create(b.pd, qp.Config{SendCQ: b.cq, RecvCQ: b.cq, SRQ: srq, MaxSendWR: 8})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.qp.Connect(qp.Remote{QPN: r.QPN(), GID: b.gid.GID}, qp.ConnectOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := r.Connect(qp.Remote{QPN: a.qp.QPN(), GID: a.gid.GID}, qp.ConnectOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := r.PostRecv([]qp.RecvWR{{}}); err == nil {
			t.Error("PostRecv on a QP with an SRQ accepted")
		}
		fill(a.mem.Bytes()[:64], byte(i+1))
		senders, receivers = append(senders, a), append(receivers, r)
	}
	const n = 20
	recvs := make([]qp.RecvWR, n)
	for i := range recvs {
		recvs[i] = qp.RecvWR{ID: uint64(i), SGEs: []qp.SGE{b.sge(t, dstOff+i*64, 64)}}
	}
	if err := srq.PostRecv(recvs); err != nil {
		t.Fatal(err)
	}
	if err := srq.SetLimit(5); err != nil {
		t.Fatal(err)
	}
	// 16 messages (8 from each sender) leave 4 < 5 receives posted.
	for _, a := range senders {
		wrs := make([]qp.SendWR, 8)
		for i := range wrs {
			wrs[i] = qp.SendWR{ID: uint64(i), Opcode: qp.OpSend, SGEs: []qp.SGE{a.sge(t, 0, 64)}}
		}
		wrs[7].Flags = qp.Signaled
		if err := a.qp.PostSend(wrs); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range senders {
		a.waitOK(t, 1)
	}
	got := b.waitOK(t, 16)
	from := map[uint32]int{}
	seen := map[uint64]bool{}
	for _, w := range got {
		from[w.QPNum]++
		if seen[w.ID] {
			t.Errorf("receive %d used twice", w.ID)
		}
		seen[w.ID] = true
		if first := b.mem.Bytes()[dstOff+int(w.ID)*64]; first != 1 && first != 2 {
			t.Errorf("receive %d holds %d", w.ID, first)
		}
	}
	for _, r := range receivers {
		if from[r.QPN()] != 8 {
			t.Errorf("QP %d received %d, want 8 (%v)", r.QPN(), from[r.QPN()], from)
		}
	}
	e := collect(t, ev, 10*time.Second, func(e uverbs.AsyncEvent) bool { return e.Type == uverbs.EventSRQLimitReached })
	if last := e[len(e)-1]; last.Object != srq {
		t.Errorf("SRQ_LIMIT_REACHED names %v, want %v", last.Object, srq)
	}
	if a, err := srq.Query(); err != nil || a.Limit != 0 || a.MaxWR < 64 {
		t.Errorf("Query after the limit event: %+v %v (the limit disarms)", a, err)
	}
	// An SRQ in use cannot be destroyed.
	if err := srq.Close(); err == nil {
		t.Error("closing an SRQ with QPs attached succeeded")
	}
	for _, r := range receivers {
		r.Close()
	}
	if err := srq.Close(); err != nil {
		t.Fatal(err)
	}
	if err := srq.PostRecv(recvs[:1]); !errors.Is(err, qp.ErrClosed) {
		t.Errorf("PostRecv after Close: %v", err)
	}
}

func TestSRQBadInput(t *testing.T) {
	s := newSide(t, rxetest.One(t), pairOpts{})
	a := s.ctx.Attr()
	for _, cfg := range []qp.SRQConfig{{MaxWR: 0}, {MaxWR: a.MaxSRQWR + 1}, {MaxWR: 8, MaxSGE: a.MaxSRQSGE + 1}, {MaxWR: 8, Limit: 9}} {
		if _, err := qp.CreateSRQ(s.pd, cfg); err == nil {
			t.Errorf("CreateSRQ(%+v) accepted", cfg)
		}
	}
	srq, err := qp.CreateSRQ(s.pd, qp.SRQConfig{MaxWR: 8})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := qp.Create(s.pd, qp.Config{SendCQ: s.cq, RecvCQ: s.cq, SRQ: srq, MaxSendWR: 4, MaxRecvWR: 4}); err == nil {
		t.Error("QP with an SRQ and its own receive queue accepted")
	}
	if err := srq.SetLimit(srq.MaxWR() + 1); err == nil {
		t.Error("limit above MaxWR accepted")
	}
}
