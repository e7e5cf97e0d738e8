package mr_test

import (
	"bytes"
	"testing"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

// end is one side of the RDMA test: a device, two allocators with
// different access, a CQ and an RC QP.
type end struct {
	ctx    *uverbs.Context
	local  *mr.Allocator // LocalWrite: send and receive buffers
	remote *mr.Allocator // LocalWrite|RemoteWrite: RDMA WRITE targets
	cq     *cq.CQ
	qp     *qp.QP
	gid    uverbs.GID
	wc     []cq.WC
}

func newEnd(t *testing.T, name string) *end {
	e := &end{ctx: rxetest.Open(t, name), wc: make([]cq.WC, 16)}
	pd, err := e.ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		a   **mr.Allocator
		acc mr.Access
	}{{&e.local, 0}, {&e.remote, mr.LocalWrite | mr.RemoteWrite}} {
		a, err := mr.NewAllocator(pd, mr.AllocatorConfig{RegionSize: 4 << 20, Limit: 16 << 20, Access: x.acc})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := a.Close(); err != nil {
				t.Errorf("close allocator: %v", err)
			}
		})
		*x.a = a
	}
	if e.cq, err = cq.Create(e.ctx, 64); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = qp.Create(pd, qp.Config{Type: qp.RC, SendCQ: e.cq, RecvCQ: e.cq, MaxSendWR: 16, MaxRecvWR: 16}); err != nil {
		t.Fatal(err)
	}
	if e.gid, err = e.ctx.DefaultGID(1); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *end) wait(t *testing.T) cq.WC {
	t.Helper()
	return rxetest.PollOne(t, e.cq, e.wc, e.ctx.Name())
}

func (e *end) waitOK(t *testing.T) cq.WC {
	t.Helper()
	wc := e.wait(t)
	if err := wc.Err(); err != nil {
		t.Fatalf("%s: %v", e.ctx.Name(), err)
	}
	return wc
}

func pattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*7) + seed
	}
}

// TestAllocatorRDMA moves data between buffers of two allocators on rxe0
// and rxe1: SENDs into posted receive buffers, identified again from the
// completion's work request ID and address, and an RDMA WRITE into a
// remote-writable buffer. A WRITE aimed at a buffer of the LocalWrite-only
// allocator is refused by the device.
func TestAllocatorRDMA(t *testing.T) {
	na, nb := rxetest.Pair(t)
	a, b := newEnd(t, na), newEnd(t, nb)
	acc := mr.RemoteWrite | mr.RemoteRead
	if err := a.qp.Connect(qp.Remote{QPN: b.qp.QPN(), PSN: 0x2222, GID: b.gid.GID}, qp.ConnectOptions{PSN: 0x1111, Access: acc}); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(qp.Remote{QPN: a.qp.QPN(), PSN: 0x1111, GID: a.gid.GID}, qp.ConnectOptions{PSN: 0x2222, Access: acc}); err != nil {
		t.Fatal(err)
	}

	// SEND: b posts receive buffers with their Handles as WR IDs.
	sizes := []int{1, 1000, 4096, 100 << 10}
	var recvs []mr.Buf
	for _, n := range sizes {
		rb, err := b.local.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		pattern(rb.Bytes(), 0xee)
		recvs = append(recvs, rb)
		if err := b.qp.PostRecv([]qp.RecvWR{{ID: rb.Handle(), SGEs: []qp.SGE{rb.SGE(rb.Len())}}}); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range sizes {
		sb, err := a.local.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		pattern(sb.Bytes(), byte(i))
		if err := a.qp.PostSend([]qp.SendWR{{ID: sb.Handle(), Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{sb.SGE(n)}}}); err != nil {
			t.Fatal(err)
		}
		sw := a.waitOK(t)
		done, ok := a.local.FromHandle(sw.ID)
		if !ok || done != sb {
			t.Fatalf("send completion ID %#x: not the sent buffer", sw.ID)
		}
		rw := b.waitOK(t)
		rb, ok := b.local.FromHandle(rw.ID)
		if !ok || rb != recvs[i] || rw.ByteLen != uint32(n) {
			t.Fatalf("receive completion %+v: want buffer %d, %d bytes", rw, recvs[i].ID(), n)
		}
		if lb, ok := b.local.Lookup(rb.Addr() + uint64(n) - 1); !ok || lb != rb {
			t.Errorf("Lookup of the received buffer's last byte failed")
		}
		if !bytes.Equal(rb.Bytes()[:n], sb.Bytes()) {
			t.Errorf("%d-byte SEND: payload differs", n)
		}
		if err := a.local.Free(done); err != nil {
			t.Fatal(err)
		}
		if err := b.local.Free(rb); err != nil {
			t.Fatal(err)
		}
	}

	// RDMA WRITE into a buffer of b's remote-writable allocator.
	const n = 64 << 10
	src, err := a.local.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer a.local.Free(src)
	dst, err := b.remote.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.remote.Free(dst)
	pattern(src.Bytes(), 42)
	pattern(dst.Bytes(), 0)
	if err := a.qp.PostSend([]qp.SendWR{{ID: 7, Opcode: qp.OpRDMAWrite, Flags: qp.Signaled, SGEs: []qp.SGE{src.SGE(n)},
		RemoteAddr: dst.Addr(), RKey: dst.RKey()}}); err != nil {
		t.Fatal(err)
	}
	a.waitOK(t)
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Error("RDMA WRITE: payload differs")
	}

	// The LocalWrite-only allocator's rkey grants nothing remotely.
	closed, err := b.local.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer b.local.Free(closed)
	pattern(closed.Bytes(), 9)
	if err := a.qp.PostSend([]qp.SendWR{{ID: 8, Opcode: qp.OpRDMAWrite, Flags: qp.Signaled, SGEs: []qp.SGE{src.SGE(4096)},
		RemoteAddr: closed.Addr(), RKey: closed.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := a.wait(t); wc.Err() == nil {
		t.Error("RDMA WRITE into a LocalWrite-only buffer succeeded")
	} else {
		t.Logf("WRITE into a LocalWrite-only buffer: %v", wc.Err())
	}
	want := make([]byte, 4096)
	pattern(want, 9)
	if !bytes.Equal(closed.Bytes(), want) {
		t.Error("LocalWrite-only buffer was written remotely")
	}
	st := b.local.Stats()
	t.Logf("b.local: %d regions (%d huge), %d buffers in use, %d allocs", st.Regions, st.HugeRegions, st.InUse, st.Allocs)
}
