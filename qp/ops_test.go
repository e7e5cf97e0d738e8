package qp_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/qp"
	wcs "github.com/goverbs/goverbs/wr" // (wr is a local name here)
)

// sizes returns the message sizes every opcode is checked with: empty, one
// byte, the inline limit, around the path MTU, and 1 MiB.
func sizes(t *testing.T, a *side) []int {
	pa, err := a.ctx.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	mtu := pa.ActiveMTU.Bytes()
	inl := int(a.qp.Caps().MaxInline)
	return []int{0, 1, inl, mtu - 1, mtu, mtu + 1, 3*mtu + 17, 1 << 20}
}

const (
	srcOff = 0
	dstOff = 2 << 20
)

// sendChecked SENDs n bytes (a pattern from seed) at srcOff in a's buffer,
// as work request sendID, with immediate data imm if withImm, to a
// receive recvID of n+64 bytes at dstOff in b's; it checks both
// completions, the payload, and that nothing past it was written, and
// returns the receive's completion.
func sendChecked(t *testing.T, a, b *side, n int, seed byte, sendID, recvID uint64, withImm bool, imm uint32) cq.WC {
	t.Helper()
	src := a.mem.Bytes()[srcOff : srcOff+n]
	fill(src, seed)
	dst := poison(b.mem.Bytes()[dstOff : dstOff+n+64])
	if err := b.qp.PostRecv([]qp.RecvWR{{ID: recvID, SGEs: []qp.SGE{b.sge(t, dstOff, n+64)}}}); err != nil {
		t.Fatal(err)
	}
	wr := qp.SendWR{ID: sendID, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: a.sges(t, srcOff, n)}
	if withImm {
		wr.Opcode, wr.Imm = qp.OpSendWithImm, imm
	}
	if err := a.qp.PostSend([]qp.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	if sw := a.waitOK(t, 1)[0]; sw.ID != sendID || sw.Opcode.String() != "SEND" {
		t.Errorf("send completion %+v", sw)
	}
	rw := b.waitOK(t, 1)[0]
	if rw.ID != recvID || rw.ByteLen != uint32(n) || rw.Opcode.String() != "RECV" {
		t.Errorf("receive completion %+v, want id %d, %d bytes", rw, recvID, n)
	}
	if !bytes.Equal(dst[:n], src) {
		t.Errorf("payload differs")
	}
	if !untouched(dst[n:]) {
		t.Errorf("bytes past the message were written")
	}
	return rw
}

func TestSend(t *testing.T) {
	a, b := connectedPair(t, pairOpts{})
	for _, withImm := range []bool{false, true} {
		for _, n := range sizes(t, a) {
			name := fmt.Sprintf("imm=%v/size=%d", withImm, n)
			t.Run(name, func(t *testing.T) {
				imm := 0xdeadbeef ^ uint32(n)
				rw := sendChecked(t, a, b, n, byte(n), 1, 100, withImm, imm)
				if withImm {
					if rw.Flags&wcs.WCWithImm == 0 || rw.Imm != imm {
						t.Errorf("imm: flags %v imm %#x, want %#x", rw.Flags, rw.Imm, imm)
					}
				} else if rw.Flags&wcs.WCWithImm != 0 {
					t.Errorf("receive without imm has the imm flag: %+v", rw)
				}
			})
		}
	}
}

func TestInlineSend(t *testing.T) {
	a, b := connectedPair(t, pairOpts{cfg: qp.Config{MaxInline: 64}})
	inl := int(a.qp.Caps().MaxInline)
	if inl < 64 {
		t.Fatalf("asked for 64 inline bytes, got %d", inl)
	}
	// Inline data is copied at post time: the source may change right after.
	src := make([]byte, inl)
	fill(src, 3)
	if err := b.qp.PostRecv([]qp.RecvWR{{ID: 5, SGEs: []qp.SGE{b.sge(t, dstOff, inl)}}}); err != nil {
		t.Fatal(err)
	}
	wr := qp.SendWR{ID: 2, Opcode: qp.OpSend, Flags: qp.Signaled | qp.Inline,
		SGEs: []qp.SGE{{Addr: addrOf(src), Length: uint32(inl)}}}
	if err := a.qp.PostSend([]qp.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), src...)
	for i := range src {
		src[i] = 0
	}
	a.waitOK(t, 1)
	if rw := b.waitOK(t, 1)[0]; rw.ByteLen != uint32(inl) {
		t.Errorf("received %d bytes, want %d", rw.ByteLen, inl)
	}
	if got := b.mem.Bytes()[dstOff : dstOff+inl]; !bytes.Equal(got, want) {
		t.Errorf("inline payload differs")
	}
	// One byte over the limit is refused before anything is posted.
	wr.SGEs[0].Length = uint32(inl + 1)
	if err := a.qp.PostSend([]qp.SendWR{wr}); err == nil {
		t.Errorf("inline send of %d bytes over a %d limit accepted", inl+1, inl)
	}
}

func TestScatterGather(t *testing.T) {
	a, b := connectedPair(t, pairOpts{cfg: qp.Config{MaxSendSGE: 3, MaxRecvSGE: 2}})
	src := a.mem.Bytes()
	fill(src[:3000], 9)
	parts := []qp.SGE{a.sge(t, 0, 1000), a.sge(t, 1500, 700), a.sge(t, 2900, 100)}
	want := append(append(append([]byte(nil), src[0:1000]...), src[1500:2200]...), src[2900:3000]...)
	if err := b.qp.PostRecv([]qp.RecvWR{{ID: 1, SGEs: []qp.SGE{b.sge(t, dstOff, 1200), b.sge(t, dstOff+8192, 1000)}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend([]qp.SendWR{{ID: 1, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: parts}}); err != nil {
		t.Fatal(err)
	}
	a.waitOK(t, 1)
	if rw := b.waitOK(t, 1)[0]; rw.ByteLen != 1800 {
		t.Fatalf("received %d bytes, want 1800", rw.ByteLen)
	}
	d := b.mem.Bytes()
	got := append(append([]byte(nil), d[dstOff:dstOff+1200]...), d[dstOff+8192:dstOff+8192+600]...)
	if !bytes.Equal(got, want) {
		t.Errorf("gathered/scattered payload differs")
	}
}

func TestRDMAWriteRead(t *testing.T) {
	a, b := connectedPair(t, pairOpts{})
	for _, n := range sizes(t, a) {
		t.Run(fmt.Sprintf("write/size=%d", n), func(t *testing.T) {
			fill(a.mem.Bytes()[srcOff:srcOff+n], byte(n)+1)
			dst := poison(b.mem.Bytes()[dstOff : dstOff+n+8])
			wr := qp.SendWR{ID: 3, Opcode: qp.OpRDMAWrite, Flags: qp.Signaled, RemoteAddr: b.addr(dstOff), RKey: b.mr.RKey(), SGEs: a.sges(t, srcOff, n)}
			if err := a.qp.PostSend([]qp.SendWR{wr}); err != nil {
				t.Fatal(err)
			}
			if w := a.waitOK(t, 1)[0]; w.Opcode.String() != "RDMA_WRITE" {
				t.Errorf("completion opcode %v", w.Opcode)
			}
			if !bytes.Equal(dst[:n], a.mem.Bytes()[srcOff:srcOff+n]) || !untouched(dst[n:]) {
				t.Errorf("remote memory differs after RDMA WRITE")
			}
		})
		t.Run(fmt.Sprintf("write-imm/size=%d", n), func(t *testing.T) {
			writeWithImm(t, a, b, srcOff, dstOff, n, byte(n)+2, 4, 77, 0x01020304)
		})
		t.Run(fmt.Sprintf("read/size=%d", n), func(t *testing.T) {
			fill(b.mem.Bytes()[dstOff:dstOff+n], byte(n)+3)
			local := poison(a.mem.Bytes()[srcOff : srcOff+n+8])
			wr := qp.SendWR{ID: 5, Opcode: qp.OpRDMARead, Flags: qp.Signaled, RemoteAddr: b.addr(dstOff), RKey: b.mr.RKey(), SGEs: a.sges(t, srcOff, n)}
			if err := a.qp.PostSend([]qp.SendWR{wr}); err != nil {
				t.Fatal(err)
			}
			if w := a.waitOK(t, 1)[0]; w.Opcode.String() != "RDMA_READ" || w.ByteLen != uint32(n) {
				t.Errorf("read completion %+v", w)
			}
			if !bytes.Equal(local[:n], b.mem.Bytes()[dstOff:dstOff+n]) || !untouched(local[n:]) {
				t.Errorf("local memory differs after RDMA READ")
			}
		})
	}
	// The target of one-sided operations sees no completion.
	b.noMore(t, 0)
}

func TestAtomics(t *testing.T) {
	a, b := connectedPair(t, pairOpts{})
	target := b.mem.Bytes()[dstOff : dstOff+8]
	old := a.mem.Bytes()[srcOff : srcOff+8]
	binary.NativeEndian.PutUint64(target, 40)
	do := func(wr qp.SendWR) uint64 {
		t.Helper()
		wr.Flags, wr.RemoteAddr, wr.RKey = qp.Signaled, b.addr(dstOff), b.mr.RKey()
		wr.SGEs = []qp.SGE{a.sge(t, srcOff, 8)}
		if err := a.qp.PostSend([]qp.SendWR{wr}); err != nil {
			t.Fatal(err)
		}
		a.waitOK(t, 1)
		return binary.NativeEndian.Uint64(old)
	}
	if got := do(qp.SendWR{ID: 1, Opcode: qp.OpAtomicFetchAndAdd, CompareAdd: 2}); got != 40 {
		t.Errorf("fetch-and-add returned %d, want 40", got)
	}
	if got := binary.NativeEndian.Uint64(target); got != 42 {
		t.Errorf("memory after fetch-and-add %d, want 42", got)
	}
	if got := do(qp.SendWR{ID: 2, Opcode: qp.OpAtomicCmpAndSwp, CompareAdd: 41, Swap: 7}); got != 42 {
		t.Errorf("failed compare-and-swap returned %d, want 42", got)
	}
	if got := binary.NativeEndian.Uint64(target); got != 42 {
		t.Errorf("memory after failed compare-and-swap %d, want 42", got)
	}
	if got := do(qp.SendWR{ID: 3, Opcode: qp.OpAtomicCmpAndSwp, CompareAdd: 42, Swap: 1 << 40}); got != 42 {
		t.Errorf("compare-and-swap returned %d, want 42", got)
	}
	if got := binary.NativeEndian.Uint64(target); got != 1<<40 {
		t.Errorf("memory after compare-and-swap %d, want %d", got, uint64(1)<<40)
	}
	// Misaligned or wrongly sized atomics are refused before posting.
	if err := a.qp.PostSend([]qp.SendWR{{Opcode: qp.OpAtomicFetchAndAdd, RemoteAddr: b.addr(dstOff + 4), RKey: b.mr.RKey(),
		SGEs: []qp.SGE{a.sge(t, 0, 8)}}}); err == nil {
		t.Error("misaligned atomic accepted")
	}
	if err := a.qp.PostSend([]qp.SendWR{{Opcode: qp.OpAtomicFetchAndAdd, RemoteAddr: b.addr(dstOff), RKey: b.mr.RKey(),
		SGEs: []qp.SGE{a.sge(t, 0, 4)}}}); err == nil {
		t.Error("4-byte atomic accepted")
	}
}

// TestBatchAndUnsignaled posts a batch of unsignaled sends closed by one
// signaled send: one doorbell, every message delivered in order, one
// send completion.
func TestBatchAndUnsignaled(t *testing.T) {
	a, b := connectedPair(t, pairOpts{})
	const n = 32
	var recvs [n]qp.RecvWR
	var sends [n]qp.SendWR
	for i := range n {
		recvs[i] = qp.RecvWR{ID: uint64(i), SGEs: []qp.SGE{b.sge(t, dstOff+i*64, 64)}}
		binary.NativeEndian.PutUint64(a.mem.Bytes()[i*64:], uint64(i)*1000)
		sends[i] = qp.SendWR{ID: uint64(i), Opcode: qp.OpSend, SGEs: []qp.SGE{a.sge(t, i*64, 8)}}
	}
	sends[n-1].Flags = qp.Signaled
	if err := b.qp.PostRecv(recvs[:]); err != nil {
		t.Fatal(err)
	}
	// Several rounds: unsignaled WQEs must free their slots too.
	for round := range 4 {
		if round > 0 {
			if err := b.qp.PostRecv(recvs[:]); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.qp.PostSend(sends[:]); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if w := a.waitOK(t, 1); w[0].ID != n-1 {
			t.Errorf("round %d: send completion for %d, want %d", round, w[0].ID, n-1)
		}
		rw := b.waitOK(t, n)
		for i, w := range rw {
			if w.ID != uint64(i) || w.ByteLen != 8 {
				t.Fatalf("round %d: receive %d: %+v", round, i, w)
			}
			if got := binary.NativeEndian.Uint64(b.mem.Bytes()[dstOff+i*64:]); got != uint64(i)*1000 {
				t.Fatalf("round %d: message %d carries %d", round, i, got)
			}
		}
		a.noMore(t, 0)
	}
}

// TestQueueSendRing queues three sends in two batches without a doorbell:
// nothing may arrive until Ring, then all three arrive in order with one
// system call. Ring with nothing queued is harmless; after Close both
// QueueSend and Ring say ErrClosed.
func TestQueueSendRing(t *testing.T) {
	a, b := connectedPair(t, pairOpts{})
	const n = 100
	var rwrs []qp.RecvWR
	for i := range 3 {
		rwrs = append(rwrs, qp.RecvWR{ID: uint64(10 + i), SGEs: []qp.SGE{b.sge(t, dstOff+i*n, n)}})
	}
	if err := b.qp.PostRecv(rwrs); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.Ring(); err != nil {
		t.Fatalf("Ring with nothing queued: %v", err)
	}
	send := func(i int) qp.SendWR {
		fill(a.mem.Bytes()[srcOff+i*n:srcOff+(i+1)*n], byte(i+1))
		return qp.SendWR{ID: uint64(i + 1), Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{a.sge(t, srcOff+i*n, n)}}
	}
	if err := a.qp.QueueSend([]qp.SendWR{send(0)}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.QueueSend([]qp.SendWR{send(1), send(2)}); err != nil {
		t.Fatal(err)
	}
	// Not rung: the device has not started on them.
	b.noMore(t, 200*time.Millisecond)
	a.noMore(t, 0)
	if err := a.qp.Ring(); err != nil {
		t.Fatal(err)
	}
	sw := a.waitOK(t, 3)
	rw := b.waitOK(t, 3)
	for i := range 3 {
		if sw[i].ID != uint64(i+1) || rw[i].ID != uint64(10+i) || rw[i].ByteLen != n {
			t.Errorf("completion %d: send %+v, receive %+v", i, sw[i], rw[i])
		}
		want := a.mem.Bytes()[srcOff+i*n : srcOff+(i+1)*n]
		if got := b.mem.Bytes()[dstOff+i*n : dstOff+(i+1)*n]; !bytes.Equal(got, want) {
			t.Errorf("message %d: payload differs", i)
		}
	}
	if err := a.qp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.QueueSend([]qp.SendWR{send(0)}); !errors.Is(err, qp.ErrClosed) {
		t.Errorf("QueueSend after Close: %v, want ErrClosed", err)
	}
	if err := a.qp.Ring(); !errors.Is(err, qp.ErrClosed) {
		t.Errorf("Ring after Close: %v, want ErrClosed", err)
	}
}
