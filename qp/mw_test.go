package qp_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/wr"
)

// The memory window tests: side a is the writer, side b owns the target
// memory and binds windows over it on b.qp, the QP connected to a.qp.

const (
	mwOff = dstOff // where windows open in b's buffer
	mwLen = 8192
)

// mwPair is connectedPair with buffers that accept window binds.
func mwPair(t testing.TB) (*side, *side) {
	t.Helper()
	return connectedPair(t, pairOpts{access: mr.LocalWrite | mr.RemoteWrite | mr.RemoteRead | mr.RemoteAtomic | mr.MWBind})
}

func allocMW(t testing.TB, s *side, typ mr.MWType) *mr.MW {
	t.Helper()
	w, err := mr.AllocMW(s.pd, typ)
	if err != nil {
		t.Fatal(err)
	}
	if w.Type() != typ || w.PD() != s.pd || w.IsClosed() {
		t.Fatalf("new window: type %v, PD %p (want %v, %p), closed %v", w.Type(), w.PD(), typ, s.pd, w.IsClosed())
	}
	return w
}

// newKey is key, or key+1 when key is the low byte of w's current rkey
// (rxe draws a window's first key at random; a bind refuses the current
// key, since the old rkey would keep working).
func newKey(w *mr.MW, key uint8) uint8 {
	if uint8(w.RKey()) == key {
		return key + 1
	}
	return key
}

// bind binds w over [off, off+n) of s's buffer with key on s.qp, waits for
// the BIND_MW completion and returns the new rkey (key's low byte, or the
// next, see newKey).
func bind(t testing.TB, s *side, w *mr.MW, off, n int, access mr.Access, key uint8) uint32 {
	t.Helper()
	old := w.RKey()
	key = newKey(w, key)
	b, err := w.Bind(s.mr, off, n, access, key)
	if err != nil {
		t.Fatal(err)
	}
	if b.MWRKey != old || b.RKey != old&^0xff|uint32(key) || w.RKey() != b.RKey {
		t.Fatalf("bind of window %#x with key %#x: request %+v, window rkey now %#x", old, key, b, w.RKey())
	}
	if err := s.qp.PostSend([]qp.SendWR{{ID: 0xb1, Opcode: qp.OpBindMW, Flags: qp.Signaled, Bind: b}}); err != nil {
		t.Fatal(err)
	}
	if c := s.waitOK(t, 1)[0]; c.ID != 0xb1 || c.Opcode != wr.WCBindMW {
		t.Fatalf("bind completion %+v, want id 0xb1, BIND_MW", c)
	}
	return b.RKey
}

// invalidate posts LOCAL_INV of rkey on s.qp and waits for its completion.
func invalidate(t testing.TB, s *side, rkey uint32) {
	t.Helper()
	if err := s.qp.PostSend([]qp.SendWR{{ID: 0x1a, Opcode: qp.OpLocalInv, Flags: qp.Signaled, InvRKey: rkey}}); err != nil {
		t.Fatal(err)
	}
	if c := s.waitOK(t, 1)[0]; c.ID != 0x1a || c.Opcode != wr.WCLocalInv {
		t.Fatalf("LOCAL_INV completion %+v, want id 0x1a, LOCAL_INV", c)
	}
}

// writeVia RDMA-WRITEs n bytes (a pattern from seed) from a's buffer to
// addr under rkey on q (a.qp unless given) and returns the completion,
// whatever its status.
func writeVia(t testing.TB, a *side, q *qp.QP, c *cq.CQ, addr uint64, rkey uint32, n int, seed byte) cq.WC {
	t.Helper()
	fill(a.mem.Bytes()[srcOff:srcOff+n], seed)
	if err := q.PostSend([]qp.SendWR{{ID: 0x77, Opcode: qp.OpRDMAWrite, Flags: qp.Signaled,
		SGEs: []qp.SGE{a.sge(t, srcOff, n)}, RemoteAddr: addr, RKey: rkey}}); err != nil {
		t.Fatal(err)
	}
	return pollOne(t, c)
}

func pollOne(t testing.TB, c *cq.CQ) cq.WC {
	t.Helper()
	wc := make([]cq.WC, 1)
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := c.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return wc[0]
		}
		if time.Now().After(deadline) {
			t.Fatal("no completion within 20 s")
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// wantRemoteAccessErr checks that a WRITE failed the way RC reports a
// refused rkey: a remote access error at the writer, whose QP is in ERR.
func wantRemoteAccessErr(t *testing.T, c cq.WC, q *qp.QP) {
	t.Helper()
	if c.Status != wr.WCRemAccessErr {
		t.Fatalf("WRITE completed with %v (%+v), want %v", c.Status, c, wr.WCRemAccessErr)
	}
	attr, err := q.Query()
	if err != nil {
		t.Fatal(err)
	}
	if attr.State != qp.Err {
		t.Errorf("writer QP in %v after a remote access error, want ERR", attr.State)
	}
}

// TestMWWriteThenLocalInv: a WRITE into a bound type 2 window lands; after
// LOCAL_INV the same WRITE is refused with a remote access error, the QP
// goes to ERR and the memory is untouched.
func TestMWWriteThenLocalInv(t *testing.T) {
	a, b := mwPair(t)
	w := allocMW(t, b, mr.MWType2)
	if w.RKey()>>8 == b.mr.RKey()>>8 {
		t.Fatalf("window rkey %#x has the index of the MR's rkey %#x", w.RKey(), b.mr.RKey())
	}
	before := w.RKey()
	rkey := bind(t, b, w, mwOff, mwLen, mr.RemoteWrite, 0x11)
	if rkey&0xff != 0x11 && rkey&0xff != 0x12 || rkey == before {
		t.Fatalf("bound rkey %#x (window's was %#x), want a new rkey with low byte 0x11 (0x12 if 0x11 was current)", rkey, before)
	}
	dst := b.mem.Bytes()[mwOff : mwOff+mwLen]
	// The whole window, start to end.
	if c := writeVia(t, a, a.qp, a.cq, b.addr(mwOff), rkey, mwLen, 3); c.Status != wr.WCSuccess {
		t.Fatalf("WRITE into the bound window: %v", c.Err())
	}
	if !bytes.Equal(dst, a.mem.Bytes()[srcOff:srcOff+mwLen]) {
		t.Fatal("WRITE through the window did not land")
	}
	landed := bytes.Clone(dst)

	invalidate(t, b, rkey)
	c := writeVia(t, a, a.qp, a.cq, b.addr(mwOff), rkey, 64, 9)
	wantRemoteAccessErr(t, c, a.qp)
	if !bytes.Equal(dst, landed) {
		t.Error("a WRITE after LOCAL_INV changed the target memory")
	}
	// The responder reports nothing to b's CQ for a refused WRITE.
	b.noMore(t, 50*time.Millisecond)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestMWOutOfRange: rxe checks a window's rkey (QP, state, access) but
// then checks the offset range against the window's MR, not against the
// window (rxe_resp.c check_rkey calls mr_check_range(mw->mr, ...) and no
// code compares with mw->addr/length). A window therefore confines writes
// to its range only when its MR is exactly that range: the MR here is the
// target and nothing else, registered without remote access of its own
// (LocalWrite|MWBind), so its rkey opens nothing and the window only the
// target. WRITEs that begin before it or end past it are refused.
func TestMWOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		name string
		off  int // from the window start
		n    int
		mr   bool // use the MR's own rkey instead of the window's
	}{
		{"past-end", mwLen - 32, 64, false},
		{"before-start", -1, 16, false},
		{"one-byte-past", mwLen, 1, false},
		{"mr-rkey", 0, 16, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := mwPair(t)
			target, err := mr.Register(b.pd, b.mem.Bytes()[mwOff:mwOff+mwLen], mr.LocalWrite|mr.MWBind)
			if err != nil {
				t.Fatal(err)
			}
			w := allocMW(t, b, mr.MWType2)
			req, err := w.Bind(target, 0, mwLen, mr.RemoteWrite, newKey(w, 0x42))
			if err != nil {
				t.Fatal(err)
			}
			if err := b.qp.PostSend([]qp.SendWR{{ID: 1, Opcode: qp.OpBindMW, Flags: qp.Signaled, Bind: req}}); err != nil {
				t.Fatal(err)
			}
			b.waitOK(t, 1)
			// In range first: the window works, to its last byte.
			if c := writeVia(t, a, a.qp, a.cq, b.addr(mwOff+mwLen-16), req.RKey, 16, 1); c.Status != wr.WCSuccess {
				t.Fatalf("WRITE of the window's last 16 bytes: %v", c.Err())
			}
			rkey := req.RKey
			if tc.mr {
				rkey = target.RKey()
			}
			around := bytes.Clone(b.mem.Bytes()[mwOff-4096 : mwOff+mwLen+4096])
			c := writeVia(t, a, a.qp, a.cq, b.addr(mwOff+tc.off), rkey, tc.n, 7)
			wantRemoteAccessErr(t, c, a.qp)
			if !bytes.Equal(around, b.mem.Bytes()[mwOff-4096:mwOff+mwLen+4096]) {
				t.Error("a refused WRITE changed memory")
			}
		})
	}
}

// TestMWRangeWithinMROnRxe pins down the rxe behaviour TestMWOutOfRange
// works around: a WRITE through a type 2 window that lies outside the
// window but inside the window's MR lands. The IBA requires a remote
// access error here (a window's bounds are checked like an MR's); if this
// test starts failing, the kernel has started enforcing window bounds and
// docs/mw.md should say so.
func TestMWRangeWithinMROnRxe(t *testing.T) {
	a, b := mwPair(t)
	w := allocMW(t, b, mr.MWType2)
	rkey := bind(t, b, w, mwOff, mwLen, mr.RemoteWrite, 0x43)
	for _, tc := range []struct {
		name   string
		off, n int // from the window start
	}{
		{"past-end", mwLen - 32, 64},
		{"before-start", -64, 16},
		{"far-away", mwLen + 1<<20, 128},
	} {
		c := writeVia(t, a, a.qp, a.cq, b.addr(mwOff+tc.off), rkey, tc.n, byte(tc.n))
		if c.Status != wr.WCSuccess {
			t.Fatalf("%s: WRITE outside the window, inside its MR: %v: rxe enforces window bounds now", tc.name, c.Err())
		}
		if !bytes.Equal(b.mem.Bytes()[mwOff+tc.off:mwOff+tc.off+tc.n], a.mem.Bytes()[srcOff:srcOff+tc.n]) {
			t.Fatalf("%s: the WRITE completed but did not land", tc.name)
		}
	}
	t.Logf("rxe: WRITEs outside the window [%#x, %#x) but inside its MR land", b.addr(mwOff), b.addr(mwOff+mwLen))
}

// TestMWReadOnlyWindow: a window bound for remote read refuses WRITEs.
func TestMWReadOnlyWindow(t *testing.T) {
	a, b := mwPair(t)
	w := allocMW(t, b, mr.MWType2)
	rkey := bind(t, b, w, mwOff, mwLen, mr.RemoteRead, 0x5)
	fill(b.mem.Bytes()[mwOff:mwOff+64], 0x33)
	if err := a.qp.PostSend([]qp.SendWR{{ID: 5, Opcode: qp.OpRDMARead, Flags: qp.Signaled,
		SGEs: []qp.SGE{a.sge(t, srcOff, 64)}, RemoteAddr: b.addr(mwOff), RKey: rkey}}); err != nil {
		t.Fatal(err)
	}
	if c := a.waitOK(t, 1)[0]; c.Opcode != wr.WCRDMARead {
		t.Fatalf("READ completion %+v", c)
	}
	if !bytes.Equal(a.mem.Bytes()[srcOff:srcOff+64], b.mem.Bytes()[mwOff:mwOff+64]) {
		t.Fatal("READ through a read-only window returned other bytes")
	}
	wantRemoteAccessErr(t, writeVia(t, a, a.qp, a.cq, b.addr(mwOff), rkey, 64, 1), a.qp)
}

// secondPair connects one more RC QP on a's device (in a's PD) to one more
// on b's device in b's PD: a different QP pair that can name b's rkeys.
func secondPair(t *testing.T, a, b *side) (*qp.QP, *cq.CQ, *qp.QP) {
	t.Helper()
	var qs [2]*qp.QP
	var cqs [2]*cq.CQ
	for i, s := range []*side{a, b} {
		c, err := cq.Create(s.ctx, 16)
		if err != nil {
			t.Fatal(err)
		}
		q, err := qp.Create(s.pd, qp.Config{Type: qp.RC, SendCQ: c, RecvCQ: c, MaxSendWR: 16, MaxRecvWR: 16})
		if err != nil {
			t.Fatal(err)
		}
		qs[i], cqs[i] = q, c
	}
	acc := mr.RemoteWrite | mr.RemoteRead
	if err := qs[0].Connect(qp.Remote{QPN: qs[1].QPN(), PSN: 0x55, GID: b.gid.GID}, qp.ConnectOptions{PSN: 0x66, Access: acc}); err != nil {
		t.Fatal(err)
	}
	if err := qs[1].Connect(qp.Remote{QPN: qs[0].QPN(), PSN: 0x66, GID: a.gid.GID}, qp.ConnectOptions{PSN: 0x55, Access: acc}); err != nil {
		t.Fatal(err)
	}
	return qs[0], cqs[0], qs[1]
}

// TestMWOtherQP: a type 2 window serves the QP it was bound on only: a
// WRITE with its rkey arriving on another QP of the same PD is refused,
// while the bound QP's peer still writes. A type 1 window, bound the same
// way, serves both.
func TestMWOtherQP(t *testing.T) {
	t.Run("type2", func(t *testing.T) {
		a, b := mwPair(t)
		c2, c2cq, _ := secondPair(t, a, b)
		w := allocMW(t, b, mr.MWType2)
		rkey := bind(t, b, w, mwOff, mwLen, mr.RemoteWrite, 0x7)
		if c := writeVia(t, a, a.qp, a.cq, b.addr(mwOff), rkey, 128, 1); c.Status != wr.WCSuccess {
			t.Fatalf("WRITE from the bound QP's peer: %v", c.Err())
		}
		before := bytes.Clone(b.mem.Bytes()[mwOff : mwOff+128])
		wantRemoteAccessErr(t, writeVia(t, a, c2, c2cq, b.addr(mwOff), rkey, 128, 2), c2)
		if !bytes.Equal(before, b.mem.Bytes()[mwOff:mwOff+128]) {
			t.Error("the refused WRITE from the other QP changed memory")
		}
	})
	t.Run("type1", func(t *testing.T) {
		a, b := mwPair(t)
		c2, c2cq, _ := secondPair(t, a, b)
		w := allocMW(t, b, mr.MWType1)
		rkey := bind(t, b, w, mwOff, mwLen, mr.RemoteWrite, 0x8)
		if c := writeVia(t, a, a.qp, a.cq, b.addr(mwOff), rkey, 128, 1); c.Status != wr.WCSuccess {
			t.Fatalf("WRITE through a type 1 window from the binding QP's peer: %v", c.Err())
		}
		if c := writeVia(t, a, c2, c2cq, b.addr(mwOff+128), rkey, 128, 2); c.Status != wr.WCSuccess {
			t.Fatalf("WRITE through a type 1 window from another QP: %v", c.Err())
		}
		if !bytes.Equal(b.mem.Bytes()[mwOff+128:mwOff+256], a.mem.Bytes()[srcOff:srcOff+128]) {
			t.Error("the WRITE from another QP did not land")
		}
	})
}

// TestMWRebindNewKey: a window invalidated and bound again with a new key
// opens to the new rkey and no longer to the old one.
func TestMWRebindNewKey(t *testing.T) {
	a, b := mwPair(t)
	w := allocMW(t, b, mr.MWType2)
	old := bind(t, b, w, mwOff, mwLen, mr.RemoteWrite, 0x21)
	if c := writeVia(t, a, a.qp, a.cq, b.addr(mwOff), old, 64, 1); c.Status != wr.WCSuccess {
		t.Fatalf("WRITE under the first key: %v", c.Err())
	}
	invalidate(t, b, old)
	// Bound again over another range of the same region.
	next := bind(t, b, w, mwOff+4096, 4096, mr.RemoteWrite, 0x22)
	if next == old || next>>8 != old>>8 {
		t.Fatalf("rebind gave rkey %#x after %#x: want the same window index and a new key", next, old)
	}
	if c := writeVia(t, a, a.qp, a.cq, b.addr(mwOff+4096), next, 64, 2); c.Status != wr.WCSuccess {
		t.Fatalf("WRITE under the new key: %v", c.Err())
	}
	if !bytes.Equal(b.mem.Bytes()[mwOff+4096:mwOff+4096+64], a.mem.Bytes()[srcOff:srcOff+64]) {
		t.Fatal("WRITE under the new key did not land")
	}
	wantRemoteAccessErr(t, writeVia(t, a, a.qp, a.cq, b.addr(mwOff+4096), old, 64, 3), a.qp)
}

// TestMWBindWhileBound: a type 2 window must be invalidated before it is
// bound again; rxe answers a second bind with a bind error completion.
func TestMWBindWhileBound(t *testing.T) {
	_, b := mwPair(t)
	w := allocMW(t, b, mr.MWType2)
	bind(t, b, w, mwOff, mwLen, mr.RemoteWrite, 0x1)
	req, err := w.Bind(b.mr, mwOff, mwLen, mr.RemoteWrite, newKey(w, 0x2))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.qp.PostSend([]qp.SendWR{{ID: 3, Opcode: qp.OpBindMW, Flags: qp.Signaled, Bind: req}}); err != nil {
		t.Fatal(err)
	}
	if c := b.wait(t, 1)[0]; c.Status != wr.WCMWBindErr {
		t.Fatalf("second bind of a bound type 2 window completed %v, want %v", c.Status, wr.WCMWBindErr)
	}
}

// TestMWSendWithInv: the writer's SEND_WITH_INV invalidates the window at
// the target: its receive completion names the rkey, and a later WRITE
// with it is refused.
func TestMWSendWithInv(t *testing.T) {
	a, b := mwPair(t)
	w := allocMW(t, b, mr.MWType2)
	rkey := bind(t, b, w, mwOff, mwLen, mr.RemoteWrite, 0x31)
	if err := b.qp.PostRecv([]qp.RecvWR{{ID: 0xcc, SGEs: []qp.SGE{b.sge(t, 0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	fill(a.mem.Bytes()[srcOff:srcOff+4096], 4)
	// The data and the "done" message in one doorbell, as a rendezvous
	// writer would post them.
	if err := a.qp.PostSend([]qp.SendWR{
		{ID: 1, Opcode: qp.OpRDMAWrite, SGEs: []qp.SGE{a.sge(t, srcOff, 4096)}, RemoteAddr: b.addr(mwOff), RKey: rkey},
		{ID: 2, Opcode: qp.OpSendWithInv, Flags: qp.Signaled, SGEs: []qp.SGE{a.sge(t, srcOff, 8)}, InvRKey: rkey},
	}); err != nil {
		t.Fatal(err)
	}
	if c := a.waitOK(t, 1)[0]; c.ID != 2 || c.Opcode != wr.WCSend {
		t.Fatalf("SEND_WITH_INV completion %+v, want id 2, SEND", c)
	}
	r := b.waitOK(t, 1)[0]
	if r.ID != 0xcc || r.Opcode != wr.WCRecv || r.ByteLen != 8 || r.Flags&wr.WCWithInv == 0 || r.InvRKey != rkey {
		t.Fatalf("receive of SEND_WITH_INV %+v, want id 0xcc, RECV, 8 bytes, flag WithInv, InvRKey %#x", r, rkey)
	}
	if r.Flags&wr.WCWithImm != 0 || r.Imm != 0 {
		t.Errorf("receive of SEND_WITH_INV claims immediate data: %+v", r)
	}
	if !bytes.Equal(b.mem.Bytes()[mwOff:mwOff+4096], a.mem.Bytes()[srcOff:srcOff+4096]) {
		t.Fatal("the WRITE before SEND_WITH_INV did not land")
	}
	// The window is free again: a type 2 window binds only when free
	// (TestMWBindWhileBound), and this bind needs no LOCAL_INV first.
	next := bind(t, b, w, mwOff+4096, 64, mr.RemoteWrite, 0x32)
	if next == rkey {
		t.Fatalf("rebind kept rkey %#x", rkey)
	}
	wantRemoteAccessErr(t, writeVia(t, a, a.qp, a.cq, b.addr(mwOff), rkey, 64, 5), a.qp)
}

// TestMWBadInput: every wrong argument is refused before anything reaches
// the send queue, with an error that names it; the QP stays usable.
func TestMWBadInput(t *testing.T) {
	a, b := mwPair(t)
	if _, err := mr.AllocMW(nil, mr.MWType2); err == nil {
		t.Error("AllocMW(nil PD) succeeded")
	}
	_, err := mr.AllocMW(b.pd, 3)
	wantErr(t, err, "unknown window type 3")
	w := allocMW(t, b, mr.MWType2)

	plain, err := mr.Register(b.pd, b.mem.Bytes()[:4096], mr.LocalWrite|mr.RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	noLocalWrite, err := mr.Register(b.pd, b.mem.Bytes()[4096:8192], mr.RemoteRead|mr.MWBind)
	if err != nil {
		t.Fatal(err)
	}
	defer noLocalWrite.Close()
	otherPD, err := b.ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer otherPD.Close()
	otherMR, err := mr.Register(otherPD, b.mem.Bytes()[8192:12288], mr.LocalWrite|mr.MWBind)
	if err != nil {
		t.Fatal(err)
	}
	defer otherMR.Close()

	cur := w.RKey()
	for _, tc := range []struct {
		name   string
		m      *mr.MR
		off, n int
		access mr.Access
		key    uint8
		want   string
	}{
		{"nil MR", nil, 0, 64, mr.RemoteWrite, 1, "nil memory region"},
		{"zero length", b.mr, 0, 0, mr.RemoteWrite, 1, "length 0"},
		{"negative length", b.mr, 0, -5, mr.RemoteWrite, 1, "length -5"},
		{"past the end", b.mr, bufSize - 10, 64, mr.RemoteWrite, 1, "outside the"},
		{"negative offset", b.mr, -1, 64, mr.RemoteWrite, 1, "outside the"},
		{"no MWBind", plain, 0, 64, mr.RemoteWrite, 1, "without MWBind access"},
		{"other PD", otherMR, 0, 64, mr.RemoteWrite, 1, "another protection domain"},
		{"local access", b.mr, 0, 64, mr.LocalWrite, 1, "grants some of RemoteRead"},
		{"no access", b.mr, 0, 64, 0, 1, "grants some of RemoteRead"},
		{"MWBind access", b.mr, 0, 64, mr.MWBind | mr.RemoteRead, 1, "grants some of RemoteRead"},
		{"write without LocalWrite", noLocalWrite, 0, 64, mr.RemoteWrite, 1, "needs a region with LocalWrite"},
		{"same key", b.mr, 0, 64, mr.RemoteWrite, uint8(cur), "low byte of the window's current rkey"},
	} {
		_, err := w.Bind(tc.m, tc.off, tc.n, tc.access, tc.key)
		if err == nil {
			t.Errorf("%s: Bind succeeded", tc.name)
			continue
		}
		if !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
			t.Errorf("%s: error %q does not contain %q", tc.name, err, tc.want)
		}
		if w.RKey() != cur {
			t.Fatalf("%s: a refused Bind moved the window's rkey from %#x to %#x", tc.name, cur, w.RKey())
		}
	}

	// Requests the provider refuses before the send queue.
	good, err := w.Bind(b.mr, mwOff, mwLen, mr.RemoteWrite, newKey(w, 0x9))
	if err != nil {
		t.Fatal(err)
	}
	otherIndex := good
	otherIndex.RKey ^= 0x100
	for _, tc := range []struct {
		name string
		wr   qp.SendWR
		want string
	}{
		{"bind with SGEs", qp.SendWR{Opcode: qp.OpBindMW, Bind: good, SGEs: []qp.SGE{b.sge(t, 0, 8)}}, "takes no SGEs"},
		{"bind to another window", qp.SendWR{Opcode: qp.OpBindMW, Bind: otherIndex}, "names another window"},
		{"bind with local access", qp.SendWR{Opcode: qp.OpBindMW, Bind: func() qp.MWBind { x := good; x.Access |= 1; return x }()}, "a window grants only remote"},
		{"LOCAL_INV with SGEs", qp.SendWR{Opcode: qp.OpLocalInv, InvRKey: good.RKey, SGEs: []qp.SGE{b.sge(t, 0, 8)}}, "LOCAL_INV takes no SGEs"},
	} {
		err := b.qp.PostSend([]qp.SendWR{tc.wr})
		if err == nil {
			t.Fatalf("%s: PostSend succeeded", tc.name)
		}
		if !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
			t.Errorf("%s: error %q does not contain %q", tc.name, err, tc.want)
		}
	}
	// None of that reached the QP: the good request still binds.
	if err := b.qp.PostSend([]qp.SendWR{{ID: 9, Opcode: qp.OpBindMW, Flags: qp.Signaled, Bind: good}}); err != nil {
		t.Fatal(err)
	}
	if c := b.waitOK(t, 1)[0]; c.Opcode != wr.WCBindMW {
		t.Fatalf("bind completion %+v", c)
	}
	if c := writeVia(t, a, a.qp, a.cq, b.addr(mwOff), good.RKey, 64, 1); c.Status != wr.WCSuccess {
		t.Fatalf("WRITE after the refused requests: %v", c.Err())
	}
	invalidate(t, b, good.RKey)

	// Closed objects.
	closedMR, err := mr.Register(b.pd, b.mem.Bytes()[:4096], mr.LocalWrite|mr.MWBind)
	if err != nil {
		t.Fatal(err)
	}
	if err := closedMR.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Bind(closedMR, 0, 64, mr.RemoteWrite, 0x44); !errors.Is(err, uverbs.ErrClosed) {
		t.Errorf("Bind over a closed MR: %v, want ErrClosed", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if !w.IsClosed() {
		t.Error("IsClosed false after Close")
	}
	if _, err := w.Bind(b.mr, 0, 64, mr.RemoteWrite, 0x45); !errors.Is(err, uverbs.ErrClosed) {
		t.Errorf("Bind of a closed window: %v, want ErrClosed", err)
	}
	pd2, err := b.ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if err := pd2.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := mr.AllocMW(pd2, mr.MWType2); !errors.Is(err, uverbs.ErrClosed) {
		t.Errorf("AllocMW in a closed PD: %v, want ErrClosed", err)
	}
}

// TestMWClosedWithContext: rxe refuses to deregister an MR while a window
// is bound to it (IBA 10.6.7.2.6), and deregisters it once the window is
// invalidated. Windows left open are deallocated by the context's Close,
// newest first, so before their MR and PD; the side's cleanup fails the
// test if that Close fails.
func TestMWClosedWithContext(t *testing.T) {
	_, b := mwPair(t)
	m, err := mr.Register(b.pd, b.mem.Bytes()[:mwLen], mr.LocalWrite|mr.RemoteWrite|mr.MWBind)
	if err != nil {
		t.Fatal(err)
	}
	w1 := allocMW(t, b, mr.MWType2)
	w2 := allocMW(t, b, mr.MWType1)
	req, err := w1.Bind(m, 0, 4096, mr.RemoteWrite, newKey(w1, 0x3))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.qp.PostSend([]qp.SendWR{{ID: 1, Opcode: qp.OpBindMW, Flags: qp.Signaled, Bind: req}}); err != nil {
		t.Fatal(err)
	}
	b.waitOK(t, 1)
	if err := m.Close(); err == nil {
		t.Fatal("deregistered an MR with a bound window")
	} else {
		t.Logf("deregister with a bound window: %v", err)
	}
	if m.IsClosed() {
		t.Fatal("a failed Close marked the MR closed")
	}
	invalidate(t, b, req.RKey)
	if err := m.Close(); err != nil {
		t.Fatalf("deregister after LOCAL_INV: %v", err)
	}
	if err := w2.Close(); err != nil {
		t.Fatal(err)
	}
	if !w2.IsClosed() || w1.IsClosed() {
		t.Fatalf("closed: w1 %v, w2 %v", w1.IsClosed(), w2.IsClosed())
	}
	// w1 stays open for the context's Close.
}
