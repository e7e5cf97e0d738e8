package qp_test

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/internal/uvobj"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
	"golang.org/x/sys/unix"
)

func wantErr(t *testing.T, err error, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one containing %q", substr)
	}
	if !strings.Contains(err.Error(), substr) {
		t.Fatalf("error %q does not contain %q", err, substr)
	}
}

func TestUnknownDevice(t *testing.T) {
	rxetest.One(t)
	_, err := uverbs.Open("nosuchdev0")
	wantErr(t, err, `device "nosuchdev0"`)
	if !errors.Is(err, uverbs.ErrNoDevice) {
		t.Errorf("error %v is not ErrNoDevice", err)
	}
	// It names the devices that exist.
	wantErr(t, err, "rxe")
}

func TestBadPortAndGID(t *testing.T) {
	c := rxetest.Open(t, rxetest.One(t))
	for _, port := range []int{0, 99} {
		_, err := c.QueryPort(port)
		wantErr(t, err, "out of range")
		_, err = c.GIDs(port)
		wantErr(t, err, "out of range")
	}
	pa, err := c.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.GID(1, int(pa.GIDTableLen))
	wantErr(t, err, "GID index")
	_, err = c.GID(1, -1)
	wantErr(t, err, "GID index")

	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	ccq, err := cq.Create(c, 8)
	if err != nil {
		t.Fatal(err)
	}
	q, err := qp.Create(pd, qp.Config{SendCQ: ccq, RecvCQ: ccq, MaxSendWR: 4, MaxRecvWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	g, _ := c.DefaultGID(1)
	remote := qp.Remote{QPN: q.QPN(), GID: g.GID}
	wantErr(t, q.Connect(remote, qp.ConnectOptions{Port: 99}), "port 99 out of range")
	wantErr(t, q.Connect(remote, qp.ConnectOptions{UseGID: true, GIDIndex: int(pa.GIDTableLen) + 5}), "GID index")
	// Above the port's active MTU: refused. At 4096 (jumbo frames, as
	// RoCE fabrics run: scripts/test's jumbo stage) nothing valid is
	// above it, and the next value is no IB MTU at all.
	err = q.Connect(remote, qp.ConnectOptions{MTU: pa.ActiveMTU + 1})
	if pa.ActiveMTU < uverbs.MTU4096 {
		wantErr(t, err, "active MTU")
	} else {
		wantErr(t, err, "invalid path MTU")
	}
	if q.State() != qp.Init {
		t.Errorf("after a refused RTR the QP is %v, want INIT", q.State())
	}
	// A QP refused on the way up still connects with good arguments.
	if err := q.Connect(remote, qp.ConnectOptions{}); err != nil {
		t.Fatal(err)
	}
	if q.State() != qp.RTS {
		t.Errorf("state %v, want RTS", q.State())
	}
}

func TestCapsAboveLimits(t *testing.T) {
	c := rxetest.Open(t, rxetest.One(t))
	pd, _ := c.AllocPD()
	ccq, err := cq.Create(c, 8)
	if err != nil {
		t.Fatal(err)
	}
	a := c.Attr()
	for _, cfg := range []qp.Config{
		{MaxSendWR: a.MaxQPWR + 1, MaxRecvWR: 4},
		{MaxSendWR: 4, MaxRecvWR: a.MaxQPWR + 1},
		{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: a.MaxSGE + 1},
		{MaxSendWR: 4, MaxRecvWR: 4, MaxRecvSGE: a.MaxSGE + 1},
		{MaxSendWR: 0, MaxRecvWR: 4},
	} {
		cfg.SendCQ, cfg.RecvCQ = ccq, ccq
		_, err := qp.Create(pd, cfg)
		wantErr(t, err, "device limit")
	}
	_, err = qp.Create(pd, qp.Config{Type: 99, SendCQ: ccq, RecvCQ: ccq, MaxSendWR: 4, MaxRecvWR: 4})
	wantErr(t, err, "QP type")
	_, err = qp.Create(pd, qp.Config{MaxSendWR: 4, MaxRecvWR: 4})
	wantErr(t, err, "CQ")
	// Inline data above what rxe supports is refused by the kernel.
	_, err = qp.Create(pd, qp.Config{SendCQ: ccq, RecvCQ: ccq, MaxSendWR: 4, MaxRecvWR: 4, MaxInline: 1 << 20})
	if err == nil {
		t.Error("1 MiB of inline data accepted")
	}
}

func TestCQSize(t *testing.T) {
	c := rxetest.Open(t, rxetest.One(t))
	for _, n := range []int{0, -1, int(c.Attr().MaxCQE) + 1} {
		_, err := cq.Create(c, n)
		wantErr(t, err, "entries")
	}
	q, err := cq.Create(c, 1)
	if err != nil {
		t.Fatal(err)
	}
	if q.Len() < 1 {
		t.Errorf("CQ of %d entries", q.Len())
	}
}

func TestPostOnResetQP(t *testing.T) {
	s := newSide(t, rxetest.One(t), pairOpts{})
	sge := s.sge(t, 0, 8)
	err := s.qp.PostSend([]qp.SendWR{{Opcode: qp.OpSend, SGEs: []qp.SGE{sge}}})
	var se *qp.StateError
	if !errors.As(err, &se) || se.State != qp.Reset {
		t.Fatalf("PostSend on a RESET QP: %v, want a StateError naming RESET", err)
	}
	wantErr(t, err, "RESET")
	wantErr(t, s.qp.QueueSend([]qp.SendWR{{Opcode: qp.OpSend, SGEs: []qp.SGE{sge}}}), "RESET")
	err = s.qp.PostRecv([]qp.RecvWR{{SGEs: []qp.SGE{sge}}})
	wantErr(t, err, "RESET")
	// INIT accepts receives but not sends.
	if err := s.qp.Init(1, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.qp.PostRecv([]qp.RecvWR{{SGEs: []qp.SGE{sge}}}); err != nil {
		t.Errorf("PostRecv in INIT: %v", err)
	}
	wantErr(t, s.qp.PostSend([]qp.SendWR{{Opcode: qp.OpSend, SGEs: []qp.SGE{sge}}}), "INIT")
}

func TestBadSGE(t *testing.T) {
	for _, tc := range []struct {
		name string
		sge  func(a *side) qp.SGE
	}{
		{"wrong lkey", func(a *side) qp.SGE { g := a.sge(t, 0, 64); g.LKey ^= 0x5a5a00; return g }},
		{"outside MR", func(a *side) qp.SGE { return qp.SGE{Addr: a.addr(bufSize - 16), Length: 64, LKey: a.mr.LKey()} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := connectedPair(t, pairOpts{})
			if err := b.qp.PostRecv([]qp.RecvWR{{ID: 1, SGEs: []qp.SGE{b.sge(t, 0, 4096)}}}); err != nil {
				t.Fatal(err)
			}
			if err := a.qp.PostSend([]qp.SendWR{{ID: 42, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{tc.sge(a)}}}); err != nil {
				t.Fatal(err)
			}
			w := a.wait(t, 1)[0]
			err := w.Err()
			var we *uverbs.WCError
			if !errors.As(err, &we) || we.ID != 42 {
				t.Fatalf("completion %+v: error %v, want a WCError for work request 42", w, err)
			}
			// The verbs spec says local protection error; rxe reports a
			// bad lkey as a local QP operation error.
			if w.Status != uverbs.WCStatus(4) && w.Status != uverbs.WCStatus(2) {
				t.Errorf("status %v, want local protection or local QP operation error", w.Status)
			}
			t.Logf("clear error: %v", err)
			// The QP is now in ERR: later sends flush.
			attr, err := a.qp.Query()
			if err != nil {
				t.Fatal(err)
			}
			if attr.State != qp.Err {
				t.Errorf("QP state after a protection error: %v, want ERR", attr.State)
			}
			// Nothing reached the receiver.
			b.noMore(t, 100*time.Millisecond)
		})
	}
}

func TestUseAfterCloseAndDoubleClose(t *testing.T) {
	c, err := uverbs.Open(rxetest.One(t))
	if err != nil {
		t.Fatal(err)
	}
	pd, _ := c.AllocPD()
	mem, _ := mr.Alloc(4096)
	defer mem.Close()
	m, err := mr.Register(pd, mem.Bytes(), mr.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	ccq, _ := cq.Create(c, 8)
	q, err := qp.Create(pd, qp.Config{SendCQ: ccq, RecvCQ: ccq, MaxSendWR: 4, MaxRecvWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	pd2, err := c.AllocPD() // stays open: a closed CQ alone must stop qp.Create
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.SGE(0, 64); err != nil {
		t.Fatalf("SGE before Close: %v", err)
	}
	for _, cl := range []interface{ Close() error }{q, q, ccq, ccq, m, m, pd, pd} {
		if err := cl.Close(); err != nil {
			t.Fatalf("Close %T: %v", cl, err)
		}
	}
	if g, err := m.SGE(0, 64); !errors.Is(err, uverbs.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("MR.SGE after Close: %+v, %v", g, err)
	}
	if !m.IsClosed() || !q.IsClosed() || !ccq.IsClosed() {
		t.Errorf("IsClosed after Close: MR %v, QP %v, CQ %v", m.IsClosed(), q.IsClosed(), ccq.IsClosed())
	}
	if err := q.Connect(qp.Remote{QPN: 1}, qp.ConnectOptions{}); !errors.Is(err, qp.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("Connect after Close: %v", err)
	}
	if err := ccq.Notify(false); !errors.Is(err, cq.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("Notify after Close: %v", err)
	}
	if _, err := qp.Create(pd2, qp.Config{SendCQ: ccq, RecvCQ: ccq, MaxSendWR: 4, MaxRecvWR: 4}); !errors.Is(err, uverbs.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("Create with a closed CQ: %v", err)
	}
	if err := pd2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := q.PostSend([]qp.SendWR{{Opcode: qp.OpSend}}); !errors.Is(err, qp.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("PostSend after Close: %v", err)
	}
	if err := q.PostRecv([]qp.RecvWR{{}}); !errors.Is(err, qp.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("PostRecv after Close: %v", err)
	}
	if _, err := q.Query(); !errors.Is(err, qp.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("Query after Close: %v", err)
	}
	if err := q.ToError(); !errors.Is(err, qp.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("Modify after Close: %v", err)
	}
	if _, err := ccq.Poll(make([]cq.WC, 1)); !errors.Is(err, cq.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("Poll after Close: %v", err)
	}
	if _, err := mr.Register(pd, mem.Bytes(), mr.LocalWrite); !errors.Is(err, uverbs.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("Register on a closed PD: %v", err)
	}
	if _, err := qp.Create(pd, qp.Config{SendCQ: ccq, RecvCQ: ccq, MaxSendWR: 4, MaxRecvWR: 4}); !errors.Is(err, uverbs.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("Create on a closed PD: %v", err)
	}
	// Closing the context closes what is left open on it: an MR too.
	if _, err := mr.Register(pd2, mem.Bytes(), mr.LocalWrite); !errors.Is(err, uverbs.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("Register on the closed PD2: %v", err)
	}
	pd3, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	m2, err := mr.Register(pd3, mem.Bytes(), mr.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close of the context: %v", err)
	}
	if _, err := m2.SGE(0, 64); !errors.Is(err, uverbs.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) || !m2.IsClosed() {
		t.Errorf("MR.SGE after closing its context: %v (IsClosed %v)", err, m2.IsClosed())
	}
	if err := m2.Close(); err != nil {
		t.Errorf("MR.Close after its context's Close: %v", err)
	}
	if b := mem.Bytes(); b == nil {
		t.Error("Memory.Bytes is nil before Memory.Close")
	}
	mem.Close()
	if b := mem.Bytes(); b != nil {
		t.Errorf("Memory.Bytes after Close: %d bytes", len(b))
	}
	if _, err := c.AllocPD(); !errors.Is(err, uverbs.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("AllocPD after Close: %v", err)
	}
	if _, err := cq.Create(c, 4); !errors.Is(err, uverbs.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("cq.Create after Close: %v", err)
	}
	if _, err := c.QueryPort(1); !errors.Is(err, uverbs.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("QueryPort after Close: %v", err)
	}
}

func TestDestroyInUse(t *testing.T) {
	c := rxetest.Open(t, rxetest.One(t))
	pd, _ := c.AllocPD()
	mem, _ := mr.Alloc(4096)
	defer mem.Close()
	m, err := mr.Register(pd, mem.Bytes(), mr.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	err = pd.Close()
	if !errors.Is(err, unix.EBUSY) {
		t.Fatalf("closing a PD with an MR: %v, want EBUSY", err)
	}
	wantErr(t, err, "still in use")
	// The PD is still usable.
	m2, err := mr.Register(pd, mem.Bytes(), mr.LocalWrite)
	if err != nil {
		t.Fatalf("PD unusable after a refused Close: %v", err)
	}
	ccq, _ := cq.Create(c, 8)
	q, err := qp.Create(pd, qp.Config{SendCQ: ccq, RecvCQ: ccq, MaxSendWR: 4, MaxRecvWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := ccq.Close(); !errors.Is(err, unix.EBUSY) {
		t.Errorf("closing a CQ used by a QP: %v, want EBUSY", err)
	}
	for _, cl := range []interface{ Close() error }{q, ccq, m, m2, pd} {
		if err := cl.Close(); err != nil {
			t.Fatalf("Close %T: %v", cl, err)
		}
	}
}

// TestContextCloseReleasesAll leaves objects open and closes the context:
// everything must go (TestMain checks the kernel's counts).
func TestContextCloseReleasesAll(t *testing.T) {
	c, err := uverbs.Open(rxetest.One(t))
	if err != nil {
		t.Fatal(err)
	}
	pd, _ := c.AllocPD()
	mem, _ := mr.Alloc(1 << 16)
	defer mem.Close()
	if _, err := mr.Register(pd, mem.Bytes(), mr.LocalWrite); err != nil {
		t.Fatal(err)
	}
	ccq, _ := cq.Create(c, 8)
	if _, err := qp.Create(pd, qp.Config{SendCQ: ccq, RecvCQ: ccq, MaxSendWR: 4, MaxRecvWR: 4}); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestMRBadInput(t *testing.T) {
	c := rxetest.Open(t, rxetest.One(t))
	pd, _ := c.AllocPD()
	mem, _ := mr.Alloc(4096)
	defer mem.Close()
	_, err := mr.Register(pd, nil, mr.LocalWrite)
	wantErr(t, err, "empty")
	_, err = mr.Register(pd, mem.Bytes(), mr.RemoteWrite)
	wantErr(t, err, "LocalWrite")
	_, err = mr.Register(pd, mem.Bytes(), 1<<20)
	wantErr(t, err, "unknown access")
	_, err = mr.Register(nil, mem.Bytes(), mr.LocalWrite)
	wantErr(t, err, "nil PD")
	_, err = mr.Alloc(0)
	wantErr(t, err, "size")
	m, err := mr.Register(pd, mem.Bytes(), mr.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.SGE(4000, 200)
	wantErr(t, err, "outside")
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestQueueFull fills the queues: a batch that does not fit is refused
// whole, with ErrQueueFull, and the rings stay usable.
func TestQueueFull(t *testing.T) {
	a, b := connectedPair(t, pairOpts{cfg: qp.Config{MaxSendWR: 8, MaxRecvWR: 8}})
	rcap := int(b.qp.Caps().MaxRecvWR)
	recvs := make([]qp.RecvWR, 4*rcap)
	for i := range recvs {
		recvs[i] = qp.RecvWR{ID: uint64(i), SGEs: []qp.SGE{b.sge(t, dstOff+i*64, 64)}}
	}
	// Fill the receive queue one by one until it refuses.
	posted := 0
	for ; posted < len(recvs); posted++ {
		err := b.qp.PostRecv(recvs[posted : posted+1])
		if errors.Is(err, qp.ErrQueueFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if posted < rcap || posted == len(recvs) {
		t.Fatalf("receive queue took %d, granted %d", posted, rcap)
	}
	// Send more than the send queue holds in one batch: refused whole.
	scap := int(a.qp.Caps().MaxSendWR)
	sends := make([]qp.SendWR, 4*scap)
	for i := range sends {
		sends[i] = qp.SendWR{ID: uint64(i), Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{a.sge(t, i*64, 8)}}
	}
	if err := a.qp.PostSend(sends); !errors.Is(err, qp.ErrQueueFull) {
		t.Fatalf("oversized batch: %v, want ErrQueueFull", err)
	}
	// Nothing of it went out.
	b.noMore(t, 200*time.Millisecond)
	a.noMore(t, 0)
	// The posted receives are consumed by exactly `posted` sends.
	for off := 0; off < posted; off += 4 {
		n := min(4, posted-off)
		if err := a.qp.PostSend(sends[off : off+n]); err != nil {
			t.Fatal(err)
		}
		a.waitOK(t, n)
	}
	got := b.waitOK(t, posted)
	for i, w := range got {
		if w.ID != uint64(i) {
			t.Fatalf("receive %d completed as %d", i, w.ID)
		}
	}
	b.noMore(t, 0)
}

// TestRecvBatchRefusedWhole posts receive batches whose second request
// is bad (too many SGEs; SGE lengths over 32 bits): each is refused with
// an error that names the request, and its good first request is not
// posted either: the receives posted after it are the ones that complete.
func TestRecvBatchRefusedWhole(t *testing.T) {
	a, b := connectedPair(t, pairOpts{cfg: qp.Config{MaxSendWR: 8, MaxRecvWR: 8, MaxRecvSGE: 2}})
	good := qp.RecvWR{ID: 999, SGEs: []qp.SGE{b.sge(t, dstOff, 64)}}
	many := make([]qp.SGE, b.qp.Caps().MaxRecvSGE+1)
	for i := range many {
		many[i] = b.sge(t, dstOff+64+i*8, 8)
	}
	huge := []qp.SGE{b.sge(t, dstOff, 64), b.sge(t, dstOff, 64)}
	huge[0].Length, huge[1].Length = 1<<31, 1<<31
	for _, bad := range []struct {
		sges []qp.SGE
		want string
	}{{many, "SGEs"}, {huge, "overflow"}} {
		err := b.qp.PostRecv([]qp.RecvWR{good, {ID: 1000, SGEs: bad.sges}})
		if err == nil {
			t.Fatalf("batch with a bad second request (%s) posted", bad.want)
		}
		wantErr(t, err, "request 1")
		wantErr(t, err, bad.want)
	}
	for i := range 4 {
		if err := b.qp.PostRecv([]qp.RecvWR{{ID: uint64(i), SGEs: []qp.SGE{b.sge(t, dstOff+i*64, 64)}}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4 {
		if err := a.qp.PostSend([]qp.SendWR{{ID: uint64(i), Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{a.sge(t, i*64, 8)}}}); err != nil {
			t.Fatal(err)
		}
	}
	a.waitOK(t, 4)
	for i, w := range b.waitOK(t, 4) {
		if w.ID != uint64(i) {
			t.Fatalf("receive %d completed as request %d: a refused batch left a request posted", i, w.ID)
		}
	}
	b.noMore(t, 0)
}

// TestLegacyWrite runs a connection with every command sent by write(),
// the path for kernels without the ioctl interface.
func TestLegacyWrite(t *testing.T) {
	a, b := connectedPair(t, pairOpts{legacy: true})
	if !uvobj.Of(a.ctx).File.UsesWrite() {
		t.Fatal("legacy mode not in effect")
	}
	fill(a.mem.Bytes()[:100], 1)
	if err := b.qp.PostRecv([]qp.RecvWR{{ID: 1, SGEs: []qp.SGE{b.sge(t, dstOff, 100)}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend([]qp.SendWR{{ID: 1, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{a.sge(t, 0, 100)}}}); err != nil {
		t.Fatal(err)
	}
	a.waitOK(t, 1)
	if w := b.waitOK(t, 1)[0]; w.ByteLen != 100 {
		t.Fatalf("received %d bytes", w.ByteLen)
	}
	gids, err := a.ctx.GIDs(1)
	if err != nil || len(gids) == 0 {
		t.Fatalf("GIDs through sysfs: %v %v", gids, err)
	}
	attr, err := a.qp.Query()
	if err != nil || attr.State != qp.RTS || attr.DestQPN != b.qp.QPN() {
		t.Fatalf("Query: %+v %v", attr, err)
	}
}

// noPanic runs f and turns a panic into a test failure.
func noPanic(t *testing.T, what string, f func() error) (err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("%s panicked: %v", what, r)
		}
	}()
	return f()
}

// TestCreateCQOfAnotherContext: a CQ made on another context than the
// PD's is refused, naming which; its handle would otherwise name a CQ
// of the PD's context: here cq1, made after a PD in each context, has
// the same handle as cq2, and the kernel silently used it.
func TestCreateCQOfAnotherContext(t *testing.T) {
	name := rxetest.One(t)
	c1, c2 := rxetest.Open(t, name), rxetest.Open(t, name)
	pd, err := c1.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.AllocPD(); err != nil {
		t.Fatal(err)
	}
	cq1, err := cq.Create(c1, 8)
	if err != nil {
		t.Fatal(err)
	}
	cq2, err := cq.Create(c2, 8)
	if err != nil {
		t.Fatal(err)
	}
	_, err = qp.Create(pd, qp.Config{SendCQ: cq2, RecvCQ: cq1, MaxSendWR: 4, MaxRecvWR: 4})
	wantErr(t, err, "send CQ belongs to another device context")
	_, err = qp.Create(pd, qp.Config{SendCQ: cq1, RecvCQ: cq2, MaxSendWR: 4, MaxRecvWR: 4})
	wantErr(t, err, "receive CQ belongs to another device context")
	q, err := qp.Create(pd, qp.Config{SendCQ: cq1, RecvCQ: cq1, MaxSendWR: 4, MaxRecvWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCreateOnZeroPD needs no device: a PD no AllocPD made is named as
// such, before the (zero) device limits are looked at.
func TestCreateOnZeroPD(t *testing.T) {
	zpd := new(uverbs.PD)
	_, err := qp.Create(zpd, qp.Config{SendCQ: new(cq.CQ), RecvCQ: new(cq.CQ), MaxSendWR: 4, MaxRecvWR: 4})
	wantErr(t, err, "nil PD")
	if !errors.Is(err, goverbs.ErrNil) {
		t.Errorf("Create on a zero PD: %v is not ErrNil", err)
	}
	_, err = qp.CreateSRQ(zpd, qp.SRQConfig{MaxWR: 4})
	wantErr(t, err, "nil PD")
	if !errors.Is(err, goverbs.ErrNil) {
		t.Errorf("CreateSRQ on a zero PD: %v is not ErrNil", err)
	}
}

// TestModifyNilAttr: a nil Attr is an error, not a panic.
func TestModifyNilAttr(t *testing.T) {
	s := newSide(t, rxetest.One(t), pairOpts{})
	for _, mask := range []qp.AttrMask{qp.MaskState, qp.MaskPort | qp.MaskPathMTU, 0} {
		err := noPanic(t, "Modify(nil)", func() error { return s.qp.Modify(nil, mask) })
		wantErr(t, err, "modify: nil Attr")
	}
	if s.qp.State() != qp.Reset {
		t.Errorf("state %v after refused Modify, want RESET", s.qp.State())
	}
}

// TestUDUpThroughModify brings a UD QP to RTS with Modify, not ToRTS: it
// sends up to the port's MTU all the same.
func TestUDUpThroughModify(t *testing.T) {
	na, nb := rxetest.Pair(t)
	a := newSide(t, na, pairOpts{cfg: qp.Config{Type: qp.UD}})
	b := newSide(t, nb, pairOpts{cfg: qp.Config{Type: qp.UD}})
	if err := b.qp.ToRTS(qp.UDOptions{QKey: qkey}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		attr qp.Attr
		mask qp.AttrMask
	}{
		{qp.Attr{State: qp.Init, Port: 1, QKey: qkey}, qp.MaskState | qp.MaskPKeyIndex | qp.MaskPort | qp.MaskQKey},
		{qp.Attr{State: qp.RTR}, qp.MaskState},
		{qp.Attr{State: qp.RTS, SQPSN: 7}, qp.MaskState | qp.MaskSQPSN},
	} {
		if err := a.qp.Modify(&m.attr, m.mask); err != nil {
			t.Fatal(err)
		}
	}
	pa, err := a.ctx.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	mtu := a.qp.MaxUDPayload()
	if mtu != pa.ActiveMTU.Bytes() || mtu != b.qp.MaxUDPayload() {
		t.Fatalf("MaxUDPayload %d after Modify to RTS (ToRTS: %d), want the active MTU %d", mtu, b.qp.MaxUDPayload(), pa.ActiveMTU.Bytes())
	}
	ah, err := a.pd.CreateAH(uverbs.AHAttr{DGID: b.gid.GID})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.qp.PostRecv([]qp.RecvWR{{ID: 1, SGEs: []qp.SGE{b.sge(t, dstOff, qp.GRHSize+mtu)}}}); err != nil {
		t.Fatal(err)
	}
	fill(a.mem.Bytes()[:mtu], 9)
	if err := a.qp.PostSend([]qp.SendWR{{ID: 2, Opcode: qp.OpSend, Flags: qp.Signaled, AH: ah.Provider(), RemoteQPN: b.qp.QPN(),
		RemoteQKey: qkey, SGEs: []qp.SGE{a.sge(t, 0, mtu)}}}); err != nil {
		t.Fatal(err)
	}
	a.waitOK(t, 1)
	if w := b.waitOK(t, 1)[0]; int(w.ByteLen) != qp.GRHSize+mtu {
		t.Errorf("received %d bytes, want %d", w.ByteLen, qp.GRHSize+mtu)
	}
	if err := ah.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestInlineBadAddr: an inline SGE at address 0, or one whose range wraps
// around, is refused with an error, not a panic; the QP stays usable.
func TestInlineBadAddr(t *testing.T) {
	a, b := connectedPair(t, pairOpts{cfg: qp.Config{MaxInline: 64}})
	for _, tc := range []struct {
		sge  qp.SGE
		want string
	}{
		{qp.SGE{Addr: 0, Length: 8}, "inline SGE 0: address 0 with length 8"},
		{qp.SGE{Addr: ^uint64(0) - 3, Length: 8}, "wraps around"},
	} {
		wrs := []qp.SendWR{{ID: 1, Opcode: qp.OpSend, Flags: qp.Signaled | qp.Inline, SGEs: []qp.SGE{tc.sge}}}
		wantErr(t, noPanic(t, "PostSend", func() error { return a.qp.PostSend(wrs) }), tc.want)
		wantErr(t, noPanic(t, "QueueSend", func() error { return a.qp.QueueSend(wrs) }), tc.want)
	}
	// A good inline send still goes through, and only it arrives.
	src := []byte("inline!!")
	if err := b.qp.PostRecv([]qp.RecvWR{{ID: 5, SGEs: []qp.SGE{b.sge(t, dstOff, 64)}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend([]qp.SendWR{{ID: 2, Opcode: qp.OpSend, Flags: qp.Signaled | qp.Inline,
		SGEs: []qp.SGE{{Addr: addrOf(src), Length: uint32(len(src))}}}}); err != nil {
		t.Fatal(err)
	}
	if w := a.waitOK(t, 1)[0]; w.ID != 2 {
		t.Errorf("send completion for request %d, want 2", w.ID)
	}
	if w := b.waitOK(t, 1)[0]; w.ByteLen != uint32(len(src)) {
		t.Errorf("received %d bytes, want %d", w.ByteLen, len(src))
	}
	b.noMore(t, 100*time.Millisecond)
}

// TestConnectBadGID: a malformed remote GID is refused before any state
// change: a connected QP stays connected.
func TestConnectBadGID(t *testing.T) {
	a, b := connectedPair(t, pairOpts{})
	for _, g := range []net.IP{{1, 2, 3, 4, 5}, {}} {
		err := a.qp.Connect(qp.Remote{QPN: b.qp.QPN(), GID: g}, qp.ConnectOptions{})
		wantErr(t, err, fmt.Sprintf("remote GID of %d bytes", len(g)))
		if a.qp.State() != qp.RTS {
			t.Fatalf("state %v after a refused Connect, want RTS", a.qp.State())
		}
	}
	// Still connected: a send arrives.
	if err := b.qp.PostRecv([]qp.RecvWR{{ID: 1, SGEs: []qp.SGE{b.sge(t, dstOff, 64)}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend([]qp.SendWR{{ID: 1, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{a.sge(t, 0, 8)}}}); err != nil {
		t.Fatal(err)
	}
	a.waitOK(t, 1)
	b.waitOK(t, 1)
}
