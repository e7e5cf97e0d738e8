package bx_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/qp"
)

// Lanes set up through rdma_cm (Config.LaneSetup CM).

func cmOn(c *bx.Config) { c.LaneSetup = bx.LaneSetupCM }

// needCM skips (or fails under GOVERBS_RXE=required) without the rdma_cm
// device.
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

// wantCMIDs checks the count while the peers are connected: the
// listener and one ID per lane on each side.
func wantCMIDs(t *testing.T, base, lanes int) {
	t.Helper()
	if base < 0 {
		return // no count (rxetest.CheckCMIDs)
	}
	if n := rxetest.CMIDs(); n != base+1+2*lanes {
		t.Fatalf("%d cm_ids with %d lanes connected, want %d (%d + listener + 2 per lane):\n%s", n, lanes, base+1+2*lanes, base, rxetest.CMIDTable())
	}
}

// TestCMCalls makes calls over lanes set up through rdma_cm, eager and
// rendezvous sizes both ways, every payload checked, with the rendezvous
// targets in the shared region and in windows.
func TestCMCalls(t *testing.T) {
	t.Run("region", func(t *testing.T) { cmCalls(t, cmOn) })
	t.Run("windows", func(t *testing.T) { cmCalls(t, func(c *bx.Config) { cmOn(c); windowsOn(c) }) })
}

func cmCalls(t *testing.T, mod func(*bx.Config)) {
	needCM(t)
	base := rxetest.CheckCMIDs(t)
	srv, _, p, sp := pair(t, mod)
	wantCMIDs(t, base, p.LaneCountForTest())
	// The connection manager moved the QPs with the parameters bx asked
	// for: retry count 6 (7 would retry forever on rxe), ACK timeout 14
	// (the kernel's is 19 on rxe).
	for i := range p.LaneCountForTest() {
		for _, peer := range []*bx.Peer{p, sp} {
			a, err := peer.LaneAttrForTest(i)
			if err != nil {
				t.Fatal(err)
			}
			if a.State != qp.RTS || a.RetryCnt != 6 || a.MaxRdAtomic != 1 || a.Timeout != 14 {
				t.Errorf("lane %d: QP in %v, retry count %d, RDMA reads in flight %d, ACK timeout %d; want RTS, 6, 1, 14", i, a.State, a.RetryCnt, a.MaxRdAtomic, a.Timeout)
			}
			if i == 0 && peer == p {
				t.Logf("lane QP: ACK timeout %d (4.096 us << %d), retry %d, RNR retry %d, path MTU %v", a.Timeout, a.Timeout, a.RetryCnt, a.RNRRetry, a.PathMTU)
			}
		}
	}
	srv.Handle(7, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		// The response differs from the request, so an echo of the wrong
		// buffer shows.
		r := slices.Clone(req.Data())
		for i := range r {
			r[i] ^= 0x5a
		}
		return r, nil
	})
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	for i, n := range []int{1, 64, 8000, 8144, 8145, 100_000, 1 << 20} {
		req := make([]byte, n)
		for k := range req {
			req[k] = byte(k*7 + i)
		}
		m, err := p.Call(ctx, 7, req)
		if err != nil {
			t.Fatalf("call of %d bytes: %v", n, hang.Cause(ctx, err))
		}
		wd.Progress()
		got := m.Data()
		if len(got) != n {
			t.Fatalf("call of %d bytes answered %d", n, len(got))
		}
		for k := range got {
			if got[k] != req[k]^0x5a {
				t.Fatalf("call of %d bytes: byte %d is %#x, want %#x", n, k, got[k], req[k]^0x5a)
			}
		}
		m.Release()
	}
	// Above EagerSize: by rendezvous, or split in parts (bx's default up
	// to SplitSize; windowsOn turns that off).
	if r, sp := srv.Stats().Rendezvous.Load(), srv.Stats().Split.Load(); r+sp < 3 {
		t.Errorf("the server counted %d rendezvous requests and %d split messages, want at least 3 in all", r, sp)
	}
	// The other way: the acceptor's peer calls the dialer.
	p.Endpoint().Handle(8, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		return append([]byte("ok:"), req.Data()...), nil
	})
	big := bytes.Repeat([]byte("0123456789abcdef"), 20_000)
	for _, req := range [][]byte{[]byte("small"), big} {
		m, err := sp.Call(ctx, 8, req)
		if err != nil {
			t.Fatalf("call from the acceptor (%d bytes): %v", len(req), hang.Cause(ctx, err))
		}
		if !bytes.Equal(m.Data(), append([]byte("ok:"), req...)) {
			t.Fatalf("call from the acceptor (%d bytes) answered %d bytes that differ", len(req), len(m.Data()))
		}
		m.Release()
	}
}

// TestCMRecovery forces the client's QPs to ERR in the middle of a
// numbered stream (as TestRecoveryForcedError): recovery connects new
// lanes through rdma_cm, every message arrives once, in order, and the old
// lanes' IDs are gone.
func TestCMRecovery(t *testing.T) {
	needCM(t)
	base := rxetest.CheckCMIDs(t)
	_, cli, p, sp := pair(t, cmOn)
	ctx, wd := hang.For(t, "", 90*time.Second) // a hang bound (no progress), not a speed bound
	numberedAcrossBreak(t, ctx, wd, p, sp, 400)
	if n := cli.Stats().Recoveries.Load(); n == 0 {
		t.Fatal("no recovery counted")
	}
	// Recovery is over on both sides once a call goes through.
	if _, err := p.Call(ctx, 99, []byte("after")); !bx.IsRemote(err) {
		t.Fatalf("call after recovery: %v, want the remote's no-handler error", err)
	}
	wantCMIDs(t, base, p.LaneCountForTest())
	t.Logf("recoveries %d, duplicates dropped at the receiver %d", cli.Stats().Recoveries.Load(), sp.Endpoint().Stats().Duplicates.Load())
}

// TestCMRecoveryMidRendezvous is TestRecoveryMidRendezvous with rdma_cm
// lanes: both ends' QPs broken again and again while rendezvous and eager
// messages flow both ways, windows on (the dialer resends only after the
// acceptor confirms its new lanes and windows, ctlLanesUp).
func TestCMRecoveryMidRendezvous(t *testing.T) {
	needCM(t)
	rxetest.CheckCMIDs(t)
	recoveryMidRendezvous(t, func(c *bx.Config) { cmOn(c); windowsOn(c) })
}

// TestCMForgedConnect sends the acceptor's rdma_cm listener connect
// requests that are not the dialer's lanes: garbage, a well-formed one
// with a wrong key, and a replay of a real lane's private data after its
// lane connected. Each is rejected; the connected peer goes on calling.
func TestCMForgedConnect(t *testing.T) {
	needCM(t)
	base := rxetest.CheckCMIDs(t)
	srv, _, p, sp := pair(t, cmOn)
	srv.Handle(7, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) { return req.Data(), nil })
	ctx, wd := hang.For(t, "", 30*time.Second) // a hang bound (no progress), not a speed bound
	dst := srv.CMAddrForTest()
	if !dst.IsValid() {
		t.Fatal("the listening endpoint has no rdma_cm listener")
	}
	call := func(what string) {
		t.Helper()
		m, err := p.Call(ctx, 7, []byte(what))
		if err != nil || string(m.Data()) != what {
			t.Fatalf("call %s: %v", what, hang.Cause(ctx, err))
		}
		m.Release()
		wd.Progress()
	}
	call("before")
	ch, err := cm.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	wrongKey := p.CMConnectDataForTest(0, 0)
	wrongKey[10] ^= 1
	cases := []struct {
		name string
		data []byte
	}{
		{"garbage", []byte("let me in")},
		{"wrong key", wrongKey},
		{"replay", p.CMConnectDataForTest(0, 0)},
		{"replay of another epoch", p.CMConnectDataForTest(1, 1)},
	}
	for i, c := range cases {
		id, err := ch.CreateID(cm.TCP)
		if err != nil {
			t.Fatal(err)
		}
		if err := id.ResolveAddr(ctx, netip.MustParseAddr("10.99.0.1"), dst); err != nil {
			t.Fatal(err)
		}
		if err := id.ResolveRoute(ctx); err != nil {
			t.Fatal(err)
		}
		_, err = id.Connect(ctx, cm.ConnParam{PrivateData: c.data, QPN: 0x100 + uint32(i)})
		var ee *cm.EventError
		if !errors.Is(err, cm.ErrRejected) || !errors.As(err, &ee) || !bytes.Contains(ee.Event.PrivateData, []byte("no such lane session")) {
			t.Errorf("%s: connect: %v, want a reject with bx's reason", c.name, err)
		}
		id.Close()
		if got := srv.Stats().CMRejected.Load(); got != uint64(i+1) {
			t.Errorf("%s: the server counted %d rejected requests, want %d", c.name, got, i+1)
		}
		call(fmt.Sprintf("after %s", c.name))
	}
	if !p.ActiveForTest() || !sp.ActiveForTest() {
		t.Error("a peer left the active state")
	}
	if n := srv.Stats().Recoveries.Load(); n != 0 {
		t.Errorf("%d recoveries on the server", n)
	}
	wantCMIDs(t, base, p.LaneCountForTest())
}

// TestCMMismatch dials between endpoints of different lane setups: the
// handshake fails on both sides within the bound, nothing stays behind.
func TestCMMismatch(t *testing.T) {
	needCM(t)
	rxetest.CheckCMIDs(t)
	dialMismatched(t, cmOn, "Config.LaneSetup")
}

// TestCMSetupTime measures connection setup both ways, two processes: a
// server process per lane setup (the test binary as a child, child_test.go)
// on rxe1, and in this process, for each dial, a new endpoint on rxe0 (not
// timed) whose Dial and first 64-byte call are timed. The two setups
// alternate. It runs only with GOVERBS_BX_SETUP_TIMES=N (dials per setup)
// and asserts nothing about speed: it logs the figures docs/perf.md quotes.
func TestCMSetupTime(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("GOVERBS_BX_SETUP_TIMES"))
	if n <= 0 {
		t.Skip("set GOVERBS_BX_SETUP_TIMES=N to measure N setups each way")
	}
	needCM(t)
	rxetest.CheckCMIDs(t)
	da, db := rxetest.Pair(t)
	type mode struct {
		name       string
		addr       string
		mod        func(*bx.Config)
		dial, call []time.Duration
	}
	modes := []*mode{
		{name: "exchange", addr: "10.99.0.2:18810", mod: func(*bx.Config) {}},
		{name: "cm", addr: "10.99.0.2:18811", mod: cmOn},
	}
	startChild(t, db, modes[0].addr)
	startChild(t, db, modes[1].addr+",cm")
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	// One dial each first, not counted: the first address resolution of
	// a process (ARP, rdma_cm's) is not what a setup costs.
	for i := -1; i < n; i++ {
		for _, m := range modes {
			cfg := bx.Config{Device: da, Token: token}
			m.mod(&cfg)
			e, err := bx.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			p, err := e.Dial(ctx, m.addr)
			if err != nil {
				e.Close()
				t.Fatalf("%s dial %d: %v", m.name, i, hang.Cause(ctx, err))
			}
			t1 := time.Now()
			r, err := p.Call(ctx, 1, make([]byte, 64))
			t2 := time.Now()
			if err != nil || len(r.Data()) != 64 {
				e.Close()
				t.Fatalf("%s call %d: %v", m.name, i, hang.Cause(ctx, err))
			}
			r.Release()
			if i >= 0 {
				m.dial = append(m.dial, t1.Sub(t0))
				m.call = append(m.call, t2.Sub(t0))
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			wd.Progress()
		}
	}
	q := func(d []time.Duration) string {
		d = slices.Clone(d)
		slices.Sort(d)
		ms := func(x time.Duration) string { return fmt.Sprintf("%.2f", x.Seconds()*1000) }
		return fmt.Sprintf("median %s ms, p25 %s, p75 %s, min %s, max %s", ms(d[len(d)/2]), ms(d[len(d)/4]), ms(d[3*len(d)/4]), ms(d[0]), ms(d[len(d)-1]))
	}
	for _, m := range modes {
		t.Logf("%-8s N=%d  Dial: %s", m.name, n, q(m.dial))
		t.Logf("%-8s N=%d  Dial + first 64 B call: %s", m.name, n, q(m.call))
	}
}
