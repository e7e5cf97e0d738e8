package qp_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	wcs "github.com/goverbs/goverbs/wr" // (wr is a local name here)
)

// ucPair returns two UC QPs on rxe0 and rxe1 connected to each other. UC
// takes SENDs and RDMA WRITEs only, so the buffers and QPs grant remote
// write and nothing else.
func ucPair(t *testing.T) (*side, *side) {
	t.Helper()
	na, nb := rxetest.Pair(t)
	o := pairOpts{cfg: qp.Config{Type: qp.UC}, access: mr.LocalWrite | mr.RemoteWrite}
	a, b := newSide(t, na, o), newSide(t, nb, o)
	for _, s := range []*side{a, b} {
		if s.qp.Type() != qp.UC {
			t.Fatalf("created a %v QP, want UC", s.qp.Type())
		}
	}
	if err := a.qp.Connect(qp.Remote{QPN: b.qp.QPN(), PSN: 0x3333, GID: b.gid.GID}, qp.ConnectOptions{PSN: 0x4444, Access: mr.RemoteWrite}); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(qp.Remote{QPN: a.qp.QPN(), PSN: 0x4444, GID: a.gid.GID}, qp.ConnectOptions{PSN: 0x3333, Access: mr.RemoteWrite}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*side{a, b} {
		if st := s.qp.State(); st != qp.RTS {
			t.Fatalf("%s: UC QP in %v after Connect", s.ctx.Name(), st)
		}
	}
	return a, b
}

// TestUC runs SEND (with and without immediate data) and RDMA WRITE (with
// and without) over UC QPs between rxe0 and rxe1, in messages of one packet
// and of many, and checks what UC does not do: READs and atomics are
// refused when posted, and a SEND that finds no posted receive is dropped
// (the sender completes, nothing is retried), unlike RC's RNR retries.
func TestUC(t *testing.T) {
	a, b := ucPair(t)
	for _, withImm := range []bool{false, true} {
		for _, n := range sizes(t, a) {
			t.Run(fmt.Sprintf("send/imm=%v/size=%d", withImm, n), func(t *testing.T) {
				imm := 0xc0ffee00 ^ uint32(n)
				rw := sendChecked(t, a, b, n, byte(n)+5, 11, 200, withImm, imm)
				if withImm && (rw.Flags&wcs.WCWithImm == 0 || rw.Imm != imm) {
					t.Errorf("imm: flags %v imm %#x, want %#x", rw.Flags, rw.Imm, imm)
				}
			})
		}
	}
	for _, n := range sizes(t, a) {
		t.Run(fmt.Sprintf("write/size=%d", n), func(t *testing.T) {
			fill(a.mem.Bytes()[srcOff:srcOff+n], byte(n)+6)
			dst := poison(b.mem.Bytes()[dstOff : dstOff+n+8])
			wr := qp.SendWR{ID: 12, Opcode: qp.OpRDMAWrite, Flags: qp.Signaled, RemoteAddr: b.addr(dstOff), RKey: b.mr.RKey(), SGEs: a.sges(t, srcOff, n)}
			// UC has no ACK: the sender's completion says the WRITE
			// left, not that it landed. A SEND behind it on the same QP
			// is received after it (in order), so its receive
			// completion says the WRITE has landed.
			if err := b.qp.PostRecv([]qp.RecvWR{{ID: 203}}); err != nil {
				t.Fatal(err)
			}
			if err := a.qp.PostSend([]qp.SendWR{wr, {ID: 18, Opcode: qp.OpSend, Flags: qp.Signaled}}); err != nil {
				t.Fatal(err)
			}
			if w := a.waitOK(t, 2); w[0].Opcode.String() != "RDMA_WRITE" || w[1].Opcode.String() != "SEND" {
				t.Errorf("completion opcodes %v, %v", w[0].Opcode, w[1].Opcode)
			}
			if rw := b.waitOK(t, 1)[0]; rw.ID != 203 || rw.ByteLen != 0 {
				t.Errorf("receive completion %+v, want id 203, 0 bytes", rw)
			}
			want := a.mem.Bytes()[srcOff : srcOff+n]
			if !bytes.Equal(dst[:n], want) || !untouched(dst[n:]) {
				t.Errorf("remote memory differs after RDMA WRITE")
			}
		})
		t.Run(fmt.Sprintf("write-imm/size=%d", n), func(t *testing.T) {
			writeWithImm(t, a, b, srcOff, dstOff, n, byte(n)+7, 13, 201, 0x0a0b0c0d)
		})
	}
	b.noMore(t, 0)

	t.Run("no-read-no-atomics", func(t *testing.T) {
		for _, wr := range []qp.SendWR{
			{ID: 14, Opcode: qp.OpRDMARead, Flags: qp.Signaled, SGEs: []qp.SGE{a.sge(t, srcOff, 64)}, RemoteAddr: b.addr(dstOff), RKey: b.mr.RKey()},
			{ID: 15, Opcode: qp.OpAtomicFetchAndAdd, Flags: qp.Signaled, SGEs: []qp.SGE{a.sge(t, srcOff, 8)}, RemoteAddr: b.addr(dstOff), RKey: b.mr.RKey(), CompareAdd: 1},
		} {
			if err := a.qp.PostSend([]qp.SendWR{wr}); err == nil {
				t.Errorf("%v posted on a UC QP", wr.Opcode)
			} else {
				t.Logf("%v: %v", wr.Opcode, err)
			}
		}
		a.noMore(t, 0)
	})

	// A SEND with no receive posted is dropped by the responder, and the
	// next one, with a receive posted, arrives: nothing was retried.
	t.Run("send-without-receive-dropped", func(t *testing.T) {
		fill(a.mem.Bytes()[srcOff:srcOff+100], 1)
		fill(a.mem.Bytes()[srcOff+4096:srcOff+4096+100], 2)
		if err := a.qp.PostSend([]qp.SendWR{{ID: 16, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{a.sge(t, srcOff, 100)}}}); err != nil {
			t.Fatal(err)
		}
		a.waitOK(t, 1)
		b.noMore(t, 200*time.Millisecond)
		dst := poison(b.mem.Bytes()[dstOff : dstOff+100])
		if err := b.qp.PostRecv([]qp.RecvWR{{ID: 202, SGEs: []qp.SGE{b.sge(t, dstOff, 100)}}}); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend([]qp.SendWR{{ID: 17, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{a.sge(t, srcOff+4096, 100)}}}); err != nil {
			t.Fatal(err)
		}
		a.waitOK(t, 1)
		if rw := b.waitOK(t, 1)[0]; rw.ID != 202 || rw.ByteLen != 100 {
			t.Errorf("receive completion %+v, want id 202, 100 bytes", rw)
		}
		if !bytes.Equal(dst, a.mem.Bytes()[srcOff+4096:srcOff+4096+100]) {
			t.Errorf("the receive holds %x..., not the second SEND", dst[:8])
		}
		b.noMore(t, 200*time.Millisecond)
	})
}
