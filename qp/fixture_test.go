package qp_test

import (
	"bytes"
	"os"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

// TestMain checks that the suite leaves no kernel object behind: the
// resource counts `rdma resource show` reports are the same before and after.
func TestMain(m *testing.M) { os.Exit(rxetest.RunChecked(m)) }

// side is one end of a connection: device, PD, a registered buffer, a CQ
// and a QP.
type side struct {
	ctx *uverbs.Context
	pd  *uverbs.PD
	mem *mr.Memory
	mr  *mr.MR
	cq  *cq.CQ
	qp  *qp.QP
	gid uverbs.GID
	wc  []cq.WC
}

const bufSize = 4 << 20

type pairOpts struct {
	cfg    qp.Config
	legacy bool
	access mr.Access
}

func newSide(t testing.TB, name string, o pairOpts) *side {
	t.Helper()
	var err error
	s := &side{wc: make([]cq.WC, 64)}
	if s.ctx, err = uverbs.OpenWith(name, uverbs.Options{LegacyWrite: o.legacy}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.ctx.Close(); err != nil {
			t.Errorf("close context: %v", err)
		}
		s.mem.Close()
	})
	if s.pd, err = s.ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.mem, err = mr.Alloc(bufSize); err != nil {
		t.Fatal(err)
	}
	acc := o.access
	if acc == 0 {
		acc = mr.LocalWrite | mr.RemoteWrite | mr.RemoteRead | mr.RemoteAtomic
	}
	if s.mr, err = mr.Register(s.pd, s.mem.Bytes(), acc); err != nil {
		t.Fatal(err)
	}
	if s.cq, err = cq.Create(s.ctx, 256); err != nil {
		t.Fatal(err)
	}
	cfg := o.cfg
	cfg.SendCQ, cfg.RecvCQ = s.cq, s.cq
	if cfg.MaxSendWR == 0 {
		cfg.MaxSendWR = 64
	}
	if cfg.MaxRecvWR == 0 {
		cfg.MaxRecvWR = 64
	}
	if s.qp, err = qp.Create(s.pd, cfg); err != nil {
		t.Fatal(err)
	}
	if s.gid, err = s.ctx.DefaultGID(1); err != nil {
		t.Fatal(err)
	}
	return s
}

// connectedPair returns two RC QPs on rxe0 and rxe1 connected to each other.
func connectedPair(t testing.TB, o pairOpts) (*side, *side) {
	t.Helper()
	na, nb := rxetest.Pair(t)
	a, b := newSide(t, na, o), newSide(t, nb, o)
	acc := mr.RemoteWrite | mr.RemoteRead | mr.RemoteAtomic
	if err := a.qp.Connect(qp.Remote{QPN: b.qp.QPN(), PSN: 0x2222, GID: b.gid.GID}, qp.ConnectOptions{PSN: 0x1111, Access: acc}); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(qp.Remote{QPN: a.qp.QPN(), PSN: 0x1111, GID: a.gid.GID}, qp.ConnectOptions{PSN: 0x2222, Access: acc}); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// sge returns the SGE for n bytes at off in the side's buffer.
func (s *side) sge(t testing.TB, off, n int) qp.SGE {
	t.Helper()
	g, err := s.mr.SGE(off, n)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// sges returns the SGEs for n bytes at off in the side's buffer: one, or
// none for n == 0.
func (s *side) sges(t testing.TB, off, n int) []qp.SGE {
	t.Helper()
	if n == 0 {
		return nil
	}
	return []qp.SGE{s.sge(t, off, n)}
}

// poison fills b with 0xee, a byte the tests never send, and returns it:
// what an operation must not write stays so (untouched).
func poison(b []byte) []byte {
	for i := range b {
		b[i] = 0xee
	}
	return b
}

// untouched reports whether b still holds poison's bytes.
func untouched(b []byte) bool { return bytes.Equal(b, bytes.Repeat([]byte{0xee}, len(b))) }

func (s *side) addr(off int) uint64 { return s.mr.Addr() + uint64(off) }

// wait polls until n completions arrived, or none arrived for 20 s
// (scaled to the machine: a hang, not a slow run).
func (s *side) wait(t testing.TB, n int) []cq.WC {
	t.Helper()
	var got []cq.WC
	idle := hang.Scale(20 * time.Second)
	deadline := time.Now().Add(idle)
	for len(got) < n {
		k, err := s.cq.Poll(s.wc)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s.wc[:k]...)
		if k > 0 {
			deadline = time.Now().Add(idle)
		} else {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d of %d completions, none for %v (%s): %+v", s.ctx.Name(), len(got), n, idle, hang.How(), got)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	return got
}

// waitOK waits for n completions and fails on any error status.
func (s *side) waitOK(t testing.TB, n int) []cq.WC {
	t.Helper()
	got := s.wait(t, n)
	for i := range got {
		if err := got[i].Err(); err != nil {
			t.Fatalf("%s: %v", s.ctx.Name(), err)
		}
	}
	return got
}

// noMore checks that no further completion arrives within d.
func (s *side) noMore(t testing.TB, d time.Duration) {
	t.Helper()
	time.Sleep(d)
	if k, _ := s.cq.Poll(s.wc); k != 0 {
		t.Fatalf("%s: unexpected completions: %+v", s.ctx.Name(), s.wc[:k])
	}
}

// fill writes a pattern that depends on seed into b.
func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*7) + seed
	}
}

// writeWithImm RDMA-WRITEs n bytes (a pattern from seed) from a's memory
// at srcOff to b's at dstOff with immediate data imm: the write completes
// at a, b's receive recvID completes with imm and n bytes, and b's memory
// holds the bytes.
func writeWithImm(t *testing.T, a, b *side, srcOff, dstOff, n int, seed byte, wrID, recvID uint64, imm uint32) {
	t.Helper()
	fill(a.mem.Bytes()[srcOff:srcOff+n], seed)
	if err := b.qp.PostRecv([]qp.RecvWR{{ID: recvID}}); err != nil {
		t.Fatal(err)
	}
	wr := qp.SendWR{ID: wrID, Opcode: qp.OpRDMAWriteWithImm, Flags: qp.Signaled, Imm: imm,
		RemoteAddr: b.addr(dstOff), RKey: b.mr.RKey(), SGEs: a.sges(t, srcOff, n)}
	if err := a.qp.PostSend([]qp.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	a.waitOK(t, 1)
	rw := b.waitOK(t, 1)[0]
	if rw.ID != recvID || rw.Imm != imm || rw.ByteLen != uint32(n) || rw.Opcode.String() != "RECV_RDMA_WITH_IMM" {
		t.Errorf("target completion %+v", rw)
	}
	if !bytes.Equal(b.mem.Bytes()[dstOff:dstOff+n], a.mem.Bytes()[srcOff:srcOff+n]) {
		t.Errorf("remote memory differs after RDMA WRITE WITH IMM")
	}
}
