package cm_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs"
	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

// The guest's addresses: rxe0 on v0, rxe1 on v1 (docs/vm.md).
var (
	addr0 = netip.MustParseAddr("10.99.0.1")
	addr1 = netip.MustParseAddr("10.99.0.2")
)

// TestMain checks that the suite leaves no kernel object (`rdma resource
// show`: pd, cq, qp, mr, ctx and cm_id counts per device) and no file
// descriptor behind.
func TestMain(m *testing.M) { os.Exit(rxetest.RunChecked(m)) }

// needCM skips (or fails under GOVERBS_RXE=required) without two devices
// and the rdma_cm device.
func needCM(t *testing.T) {
	t.Helper()
	rxetest.Pair(t)
	if _, err := os.Stat(cm.DevicePath); err != nil {
		if rxetest.Required() {
			t.Fatalf("GOVERBS_RXE=required but %v", err)
		}
		t.Skipf("no rdma_cm: %v", err)
	}
}

func port() uint16 { return uint16(20000 + rand.IntN(20000)) }

func openChannel(t *testing.T) *cm.Channel {
	t.Helper()
	ch, err := cm.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ch.Close(); err != nil {
			t.Errorf("close channel: %v", err)
		}
	})
	return ch
}

func step(t *testing.T, start time.Time, what string) {
	t.Logf("%8.3fs %s", time.Since(start).Seconds(), what)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(30*time.Second))
	t.Cleanup(cancel)
	return ctx
}

// end is one side's verbs objects, made on the device an ID resolved to.
type end struct {
	ctx *uverbs.Context
	pd  *uverbs.PD
	mem *mr.Memory
	mr  *mr.MR
	cq  *cq.CQ
	qp  *qp.QP
	wc  []cq.WC
}

func newEnd(t *testing.T, id *cm.ID) *end {
	t.Helper()
	name, port, err := id.Device()
	if err != nil {
		t.Fatal(err)
	}
	if port != 1 {
		t.Fatalf("%s: port %d, want 1", name, port)
	}
	e := &end{wc: make([]cq.WC, 16)}
	if e.ctx, err = uverbs.Open(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		id.Close() // destroys the QP before the context goes
		if err := e.ctx.Close(); err != nil {
			t.Errorf("close %s: %v", name, err)
		}
		e.mem.Close()
	})
	if e.pd, err = e.ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.mem, err = mr.Alloc(1 << 16); err != nil {
		t.Fatal(err)
	}
	if e.mr, err = mr.Register(e.pd, e.mem.Bytes(), mr.LocalWrite|mr.RemoteRead|mr.RemoteWrite); err != nil {
		t.Fatal(err)
	}
	if e.cq, err = cq.Create(e.ctx, 32); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = id.CreateQP(e.pd, qp.Config{SendCQ: e.cq, RecvCQ: e.cq, MaxSendWR: 8, MaxRecvWR: 8}); err != nil {
		t.Fatal(err)
	}
	want := qp.Init
	if id.QPType() == qp.UD {
		want = qp.RTS // a UD QP needs nothing of the peer
	}
	if e.qp.State() != want {
		t.Fatalf("QP in %v after CreateQP, want %v", e.qp.State(), want)
	}
	return e
}

func (e *end) poll(t *testing.T) cq.WC {
	t.Helper()
	return rxetest.PollOne(t, e.cq, e.wc, e.ctx.Name())
}

// TestConnect connects an RC QP on rxe0 to a listener on rxe1 with private
// data both ways, sends a message and an RDMA READ over it, disconnects,
// and checks the cm_id count is back where it was.
// TestConnect runs an RC connection in the TCP port space and in the IB
// port space (an ID made for RC QPs).
func TestConnect(t *testing.T) {
	needCM(t)
	t.Run("TCP", func(t *testing.T) { testConnect(t, cm.TCP) })
	t.Run("IB", func(t *testing.T) { testConnect(t, cm.IB) })
}

func testConnect(t *testing.T, ps cm.PortSpace) {
	rxetest.CheckCMIDs(t)
	ctx := testCtx(t)
	T := time.Now()
	t.Cleanup(func() { step(t, T, "cleanup done") })
	sch, cch := openChannel(t), openChannel(t)
	lis, err := sch.CreateIDType(ps, qp.RC)
	if err != nil {
		t.Fatal(err)
	}
	dst := listen(t, lis, 4)
	defer lis.Close()
	step(t, T, "listening")
	if n := rxetest.CMIDs(); n < 1 {
		t.Fatalf("rdma resource show cm_id counts %d IDs with a listener open", n)
	}

	cli, err := cch.CreateIDType(ps, qp.RC)
	if err != nil {
		t.Fatal(err)
	}
	if cli.PortSpace() != ps {
		t.Errorf("PortSpace() = %v, want %v", cli.PortSpace(), ps)
	}
	step(t, T, "counted")
	if err := cli.ResolveAddr(ctx, addr0, dst); err != nil {
		t.Fatal(err)
	}
	step(t, T, "address resolved")
	if err := cli.ResolveRoute(ctx); err != nil {
		t.Fatal(err)
	}
	step(t, T, "route resolved")
	rt, err := cli.Query()
	if err != nil {
		t.Fatal(err)
	}
	if rt.Src.Addr() != addr0 || rt.Dst != dst {
		t.Errorf("route %v -> %v, want %v -> %v", rt.Src, rt.Dst, addr0, dst)
	}
	c := newEnd(t, cli)
	step(t, T, "client end")
	if c.ctx.Name() != "rxe0" {
		t.Errorf("client device %s, want rxe0 (10.99.0.1 is on v0)", c.ctx.Name())
	}
	type result struct {
		ev  cm.Event
		err error
	}
	cres := make(chan result, 1)
	go func() {
		ev, err := cli.Connect(ctx, cm.ConnParam{PrivateData: []byte("hello from the client"), ResponderResources: 1, InitiatorDepth: 1})
		cres <- result{ev, err}
	}()

	req, err := lis.GetRequest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	step(t, T, "request")
	if !bytes.HasPrefix(req.PrivateData, []byte("hello from the client")) || len(req.PrivateData) != cm.MaxConnectData {
		t.Errorf("request private data %q (%d bytes), want the client's, padded to %d", req.PrivateData, len(req.PrivateData), cm.MaxConnectData)
	}
	sEnd := newEnd(t, req.ID)
	if err := sEnd.qp.PostRecv([]qp.RecvWR{{ID: 1, SGEs: []qp.SGE{must(sEnd.mr.SGE(0, 64))}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := req.ID.Accept(ctx, cm.ConnParam{PrivateData: []byte("welcome")}); err != nil {
		t.Fatal(err)
	}
	r := <-cres
	step(t, T, "connected")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !bytes.HasPrefix(r.ev.PrivateData, []byte("welcome")) {
		t.Errorf("accept private data %q, want welcome", r.ev.PrivateData)
	}
	if c.qp.State() != qp.RTS || sEnd.qp.State() != qp.RTS {
		t.Fatalf("QP states %v / %v, want RTS", c.qp.State(), sEnd.qp.State())
	}
	if sEnd.ctx.Name() != "rxe1" {
		t.Errorf("server device %s, want rxe1", sEnd.ctx.Name())
	}

	// SEND client -> server.
	msg := []byte("ping over rdma_cm")
	copy(c.mem.Bytes(), msg)
	if err := c.qp.PostSend([]qp.SendWR{{ID: 2, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{must(c.mr.SGE(0, len(msg)))}}}); err != nil {
		t.Fatal(err)
	}
	if wc := c.poll(t); wc.Err() != nil {
		t.Fatal(wc.Err())
	}
	wc := sEnd.poll(t)
	if wc.Err() != nil || int(wc.ByteLen) != len(msg) || !bytes.Equal(sEnd.mem.Bytes()[:len(msg)], msg) {
		t.Fatalf("server received %+v %q", wc, sEnd.mem.Bytes()[:len(msg)])
	}
	// RDMA READ server <- client: needs the responder resources rdma_cm set up.
	copy(c.mem.Bytes()[4096:], "read me")
	if err := sEnd.qp.PostSend([]qp.SendWR{{ID: 3, Opcode: qp.OpRDMARead, Flags: qp.Signaled, SGEs: []qp.SGE{must(sEnd.mr.SGE(8192, 7))},
		RemoteAddr: c.mr.Addr() + 4096, RKey: c.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := sEnd.poll(t); wc.Err() != nil {
		t.Fatal(wc.Err())
	}
	if got := string(sEnd.mem.Bytes()[8192 : 8192+7]); got != "read me" {
		t.Fatalf("RDMA READ got %q", got)
	}
	step(t, T, "read done")

	t0 := time.Now()
	if err := cli.Disconnect(); err != nil {
		t.Fatal(err)
	}
	defer func() { t.Logf("disconnect took %v", time.Since(t0)) }()
	if err := req.ID.WaitDisconnect(ctx); err != nil {
		t.Fatal(err)
	}
	// The passive side's DISCONNECT sends the DREP the active side waits for.
	if err := req.ID.Disconnect(); err != nil {
		t.Fatal(err)
	}
	if err := cli.WaitDisconnect(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestUD: a SIDR exchange on the UDP port space. The client learns the
// server's QPN, Q_Key and address from ESTABLISHED, makes an AH from it and
// sends a datagram the server receives behind its 40-byte GRH.
// TestUD runs a SIDR exchange and datagrams in the UDP port space and in
// the IB port space (an ID made for UD QPs).
func TestUD(t *testing.T) {
	needCM(t)
	t.Run("UDP", func(t *testing.T) { testUD(t, cm.UDP) })
	t.Run("IB", func(t *testing.T) { testUD(t, cm.IB) })
}

func testUD(t *testing.T, ps cm.PortSpace) {
	rxetest.CheckCMIDs(t)
	ctx := testCtx(t)
	ch := openChannel(t)
	lis, err := ch.CreateIDType(ps, qp.UD)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	dst := listen(t, lis, 2)
	cli, err := ch.CreateIDType(ps, qp.UD)
	if err != nil {
		t.Fatal(err)
	}
	resolve(ctx, t, cli, dst)
	c := newEnd(t, cli)
	type result struct {
		ev  cm.Event
		err error
	}
	cres := make(chan result, 1)
	go func() {
		ev, err := cli.Connect(ctx, cm.ConnParam{PrivateData: []byte("ud hello")})
		cres <- result{ev, err}
	}()
	req, err := lis.GetRequest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(req.PrivateData, []byte("ud hello")) {
		t.Errorf("SIDR request private data %q", req.PrivateData)
	}
	s := newEnd(t, req.ID)
	if err := s.qp.PostRecv([]qp.RecvWR{{ID: 1, SGEs: []qp.SGE{must(s.mr.SGE(0, 40+256))}}}); err != nil {
		t.Fatal(err)
	}
	// The Q_Key is the one the kernel gave the QPs at INIT: RDMA_UDP_QKEY.
	const qkey = 0x01234567
	if _, err := req.ID.Accept(ctx, cm.ConnParam{PrivateData: []byte("ud welcome")}); err != nil {
		t.Fatal(err)
	}
	r := <-cres
	if r.err != nil {
		t.Fatal(r.err)
	}
	ev := r.ev
	if ev.Type != cm.Established || ev.QPN != s.qp.QPN() || ev.QKey != qkey || ev.AH == nil {
		t.Fatalf("SIDR reply %v: QPN %d (want %d), QKey %#x (want %#x), AH %+v", ev, ev.QPN, s.qp.QPN(), ev.QKey, qkey, ev.AH)
	}
	if !bytes.HasPrefix(ev.PrivateData, []byte("ud welcome")) {
		t.Errorf("SIDR reply private data %q", ev.PrivateData)
	}
	t.Logf("AH %+v", *ev.AH)
	ah, err := c.pd.CreateAH(*ev.AH)
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Close()
	msg := []byte("datagram over rdma_cm")
	copy(c.mem.Bytes(), msg)
	if err := c.qp.PostSend([]qp.SendWR{{ID: 2, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{must(c.mr.SGE(0, len(msg)))},
		AH: ah.Provider(), RemoteQPN: ev.QPN, RemoteQKey: ev.QKey}}); err != nil {
		t.Fatal(err)
	}
	if wc := c.poll(t); wc.Err() != nil {
		t.Fatal(wc.Err())
	}
	wc := s.poll(t)
	if wc.Err() != nil || int(wc.ByteLen) != 40+len(msg) || !bytes.Equal(s.mem.Bytes()[40:40+len(msg)], msg) {
		t.Fatalf("server received %+v %q", wc, s.mem.Bytes()[40:40+len(msg)])
	}
}

func must(g qp.SGE, err error) qp.SGE {
	if err != nil {
		panic(err)
	}
	return g
}

// TestReject: a listener rejects with private data; the client's error
// carries reason 28 and the data.
func TestReject(t *testing.T) {
	ctx, ch := cmSetup(t)
	lis := newID(t, ch, cm.TCP)
	dst := listen(t, lis, 1)
	go func() {
		ev, err := lis.GetRequest(ctx)
		if err != nil {
			return
		}
		ev.ID.Reject([]byte("go away"), 0)
		ev.ID.Close()
	}()
	cli := newID(t, ch, cm.TCP)
	resolve(ctx, t, cli, dst)
	newEnd(t, cli)
	_, err := cli.Connect(ctx, cm.ConnParam{})
	var ee *cm.EventError
	if !errors.As(err, &ee) || !errors.Is(err, cm.ErrRejected) || errors.Is(err, cm.ErrConnRefused) {
		t.Fatalf("connect to a rejecting listener: %v, want ErrRejected", err)
	}
	if ee.Event.Status != cm.RejectConsumerDefined || !bytes.HasPrefix(ee.Event.PrivateData, []byte("go away")) {
		t.Fatalf("reject status %d data %q, want 28 and go away", ee.Event.Status, ee.Event.PrivateData)
	}
	t.Log(err)
}

// TestRefused: nobody listens on the port; the peer's CM answers with
// reason 8 (invalid service ID), ErrConnRefused.
func TestRefused(t *testing.T) {
	ctx, ch := cmSetup(t)
	cli := newID(t, ch, cm.TCP)
	resolve(ctx, t, cli, netip.AddrPortFrom(addr1, port()))
	newEnd(t, cli)
	_, err := cli.Connect(ctx, cm.ConnParam{})
	if !errors.Is(err, cm.ErrConnRefused) {
		t.Fatalf("connect with no listener: %v, want ErrConnRefused", err)
	}
	t.Log(err)
}

// TestUnreachable: an address on the link that nobody answers ARP for.
// Resolution ends within the context's deadline with an address error.
func TestUnreachable(t *testing.T) {
	needCM(t)
	rxetest.CheckCMIDs(t)
	ch := openChannel(t)
	cli := newID(t, ch, cm.TCP)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := cli.ResolveAddr(ctx, addr0, netip.MustParseAddrPort("10.99.0.77:7174"))
	took := time.Since(start)
	if err == nil {
		t.Fatal("resolving 10.99.0.77 (nobody there) succeeded")
	}
	if !errors.Is(err, cm.ErrAddress) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("resolve 10.99.0.77: %v, want an address error or the deadline", err)
	}
	if took > hang.Scale(20*time.Second) {
		t.Fatalf("resolve took %v for a 1.5 s deadline", took)
	}
	t.Logf("%v after %v", err, took.Round(time.Millisecond))

	// No route at all: the kernel refuses at once or reports an address error.
	id2 := newID(t, ch, cm.TCP)
	err = id2.ResolveAddr(testCtx(t), netip.Addr{}, netip.MustParseAddrPort("192.0.2.1:7174"))
	if err == nil {
		t.Fatal("resolving 192.0.2.1 (no route) succeeded")
	}
	t.Log(err)
}

// TestDestroyDuringResolve closes an ID while its resolve waits.
func TestDestroyDuringResolve(t *testing.T) {
	needCM(t)
	rxetest.CheckCMIDs(t)
	ch := openChannel(t)
	cli, err := ch.CreateID(cm.TCP)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(30*time.Second))
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- cli.ResolveAddr(ctx, addr0, netip.MustParseAddrPort("10.99.0.78:7174")) }()
	time.Sleep(100 * time.Millisecond)
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, cm.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) && !errors.Is(err, cm.ErrAddress) {
			t.Fatalf("resolve after Close: %v, want ErrClosed", err)
		}
	case <-ctx.Done():
		t.Fatal("resolve still waiting after Close")
	}
	if err := cli.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := cli.ResolveRoute(ctx); !errors.Is(err, cm.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Fatalf("use after Close: %v, want ErrClosed", err)
	}
}

// TestBadInput: errors before the kernel.
func TestBadInput(t *testing.T) {
	ctx, ch := cmSetup(t)
	if _, err := ch.CreateID(cm.PortSpace(7)); err == nil {
		t.Error("CreateID(7) succeeded")
	}
	for _, c := range []struct {
		ps cm.PortSpace
		t  qp.Type
	}{{cm.TCP, qp.UD}, {cm.UDP, qp.RC}, {cm.IB, qp.UC}} {
		if id, err := ch.CreateIDType(c.ps, c.t); err == nil || !strings.Contains(err.Error(), "not possible") {
			t.Errorf("CreateIDType(%v, %v) = %v, want an error naming the mismatch", c.ps, c.t, err)
			if id != nil {
				id.Close()
			}
		}
	}
	id := newID(t, ch, cm.TCP)
	if err := id.Listen(0); err == nil {
		t.Error("Listen(0) succeeded")
	}
	if err := id.ResolveAddr(ctx, netip.Addr{}, netip.AddrPort{}); err == nil {
		t.Error("ResolveAddr to the zero address succeeded")
	}
	if _, _, err := id.Device(); err == nil {
		t.Error("Device of an unbound ID succeeded")
	}
	_, err := id.Connect(ctx, cm.ConnParam{PrivateData: make([]byte, cm.MaxConnectData+1)})
	if err == nil || !strings.Contains(err.Error(), "private data") {
		t.Errorf("connect with %d bytes of private data: %v", cm.MaxConnectData+1, err)
	}
	if err := id.Reject(make([]byte, cm.MaxRejectData+1), 0); err == nil || !strings.Contains(err.Error(), "private data") {
		t.Errorf("reject with %d bytes of private data: %v", cm.MaxRejectData+1, err)
	}
	// The kernel refuses a connect before the route is resolved.
	if _, err := id.Connect(ctx, cm.ConnParam{QPN: 0x123456}); err == nil {
		t.Error("connect without a route succeeded")
	} else {
		t.Log(err)
	}
	// Close while a Wait is parked: it returns ErrClosed.
	waitErr := make(chan error, 1)
	go func() { _, err := id.Wait(ctx); waitErr <- err }()
	time.Sleep(50 * time.Millisecond)
	if ch.Fd() < 0 {
		t.Error("Fd of an open channel < 0")
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-waitErr; !errors.Is(err, cm.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("Wait across Close: %v, want ErrClosed", err)
	}
	if err := ch.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if ch.Fd() != -1 {
		t.Error("Fd of a closed channel is not -1")
	}
	if _, err := ch.CreateID(cm.TCP); !errors.Is(err, cm.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("CreateID after Close: %v", err)
	}
}

// listen binds lis to a random port on rxe1's address and listens with
// backlog; it returns the address.
func listen(t *testing.T, lis *cm.ID, backlog int) netip.AddrPort {
	t.Helper()
	dst := netip.AddrPortFrom(addr1, port())
	if err := lis.Bind(dst); err != nil {
		t.Fatal(err)
	}
	if err := lis.Listen(backlog); err != nil {
		t.Fatal(err)
	}
	return dst
}

// resolve resolves the address and the route from rxe0's address to dst.
func resolve(ctx context.Context, t *testing.T, id *cm.ID, dst netip.AddrPort) {
	t.Helper()
	if err := id.ResolveAddr(ctx, addr0, dst); err != nil {
		t.Fatal(err)
	}
	if err := id.ResolveRoute(ctx); err != nil {
		t.Fatal(err)
	}
}

// cmSetup starts a test over rdma_cm: it skips without the devices
// (needCM), checks that the cm_id count comes back (rxetest.CheckCMIDs),
// and returns a context bounding the test and a channel.
func cmSetup(t *testing.T) (context.Context, *cm.Channel) {
	t.Helper()
	needCM(t)
	rxetest.CheckCMIDs(t)
	return testCtx(t), openChannel(t)
}

// boundID creates an ID on ch in port space ps, closed at the end of the
// test, and binds it to addr (any port).
func boundID(t *testing.T, ch *cm.Channel, ps cm.PortSpace, addr netip.Addr) *cm.ID {
	t.Helper()
	id := newID(t, ch, ps)
	if err := id.Bind(netip.AddrPortFrom(addr, 0)); err != nil {
		t.Fatal(err)
	}
	return id
}

// newID creates an ID on ch in port space ps, closed at the end of the
// test.
func newID(t *testing.T, ch *cm.Channel, ps cm.PortSpace) *cm.ID {
	t.Helper()
	id, err := ch.CreateID(ps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { id.Close() })
	return id
}
