package bx_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs"
	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestMaxPeersConcurrentDials: concurrent handshakes to an endpoint do not
// take it past Config.MaxPeers. Before, each checked the count when it
// began and registered its peer when it ended, so all that overlapped got
// in: peers granted receive buffers the SRQ (MaxPeers*Credits) does not
// have, and requests the worker pool's backlog has no room for.
func TestMaxPeersConcurrentDials(t *testing.T) {
	const maxPeers, dials = 2, 8
	da, db := rxetest.Pair(t)
	srv := newEndpoint(t, db, func(c *bx.Config) { c.MaxPeers = maxPeers })
	cli := newEndpoint(t, da, nil)
	addr, err := srv.Listen(listenAddr(t, db))
	if err != nil {
		t.Fatal(err)
	}
	ctx, wd := hang.For(t, "", time.Minute) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	srv.Handle(1, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) { return req.Data(), nil })
	var wg sync.WaitGroup
	var mu sync.Mutex
	var dialed []*bx.Peer
	start := make(chan struct{})
	for range dials {
		wg.Go(func() {
			<-start
			p, err := cli.Dial(ctx, addr.String())
			if err != nil {
				if !strings.Contains(err.Error(), "endpoint full (2 peers)") {
					t.Errorf("a refused Dial: %v; want it to say the endpoint is full", err)
				}
				return
			}
			mu.Lock()
			dialed = append(dialed, p)
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	// A Dial that succeeded has a peer the server kept: it answers (a
	// refusal after the dialer's side had finished, with a bye, made Dial
	// succeed and the first call fail).
	if len(dialed) == 0 || len(dialed) > maxPeers {
		t.Errorf("%d of %d Dials succeeded, want 1..%d", len(dialed), dials, maxPeers)
	}
	for _, p := range dialed {
		m, err := p.Call(ctx, 1, []byte("here"))
		if err != nil {
			t.Fatalf("a call on a dialed peer: %v", hang.Cause(ctx, err))
		}
		m.Release()
	}
	// Every handshake the server ran ends as a peer or as a failure.
	eventually(t, "the server's handshakes done", func() bool {
		s := srv.Snapshot()
		return uint64(len(s.Peers))+s.Counters.HandshakesFailed >= dials
	})
	if n := len(srv.Snapshot().Peers); n > maxPeers {
		t.Fatalf("the server has %d peers, MaxPeers %d", n, maxPeers)
	}
}

// TestDialConnConcurrentSharesPeer: DialConns to one address made at once
// share one peer, as sequential ones do. Before, each dialed a peer of its
// own and the last one's won the reuse table: the others stayed
// connected, reused by nobody, until the endpoint closed (each with its
// QPs and a MaxPeers place at the server).
func TestDialConnConcurrentSharesPeer(t *testing.T) {
	const dials = 8
	srv, cli, _, ctx, _ := connTest(t, time.Minute, nil) // pair's own peer is one of cli's
	addr := srv.ListenAddrs()[0].String()
	conns := make([]net.Conn, dials)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range conns {
		wg.Go(func() {
			<-start
			c, err := cli.DialConn(ctx, addr)
			if err != nil {
				t.Errorf("DialConn %d: %v", i, hang.Cause(ctx, err))
				return
			}
			conns[i] = c
		})
	}
	close(start)
	wg.Wait()
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	if t.Failed() {
		return
	}
	peers := map[*bx.Peer]bool{}
	for _, c := range conns {
		peers[bx.ConnPeerForTest(c)] = true
	}
	if len(peers) != 1 {
		t.Errorf("%d Conns dialed at once to %s ride %d peers, want 1", dials, addr, len(peers))
	}
	if n := len(cli.Snapshot().Peers); n != 2 {
		t.Errorf("the client has %d peers, want 2 (pair's and the Conns')", n)
	}
}

// TestAllocAfterClose: Alloc on a closed endpoint fails with ErrClosed.
// Before, while a Buffer (or Msg) of it was still held, which keeps its
// pools mapped, Alloc handed out another buffer of a pool whose regions
// Close had deregistered.
func TestAllocAfterClose(t *testing.T) {
	da, _ := rxetest.Pair(t)
	e, err := bx.New(bx.Config{Device: da, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	held, err := e.Alloc(16)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := e.Alloc(16)
	if !errors.Is(err, bx.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("Alloc after Close: %v; want ErrClosed", err)
	}
	b.Free() // nil, or the buffer the old code handed out
	held.Free()
}

// TestAcceptAfterEndpointClose: Accept on a closed endpoint fails with
// ErrClosed even while a peer (Close shut it down) waits in its accept
// queue; before, it returned that dead peer with no error about half the
// time (TestAcceptAfterClose is the host-side check of the same).
func TestAcceptAfterEndpointClose(t *testing.T) {
	da, db := rxetest.Pair(t)
	srv, err := bx.New(bx.Config{Device: db, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	defer closeEndpoint(t, srv)
	cli := newEndpoint(t, da, nil)
	addr, err := srv.Listen(listenAddr(t, db))
	if err != nil {
		t.Fatal(err)
	}
	ctx, wd := hang.For(t, "", time.Minute) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	for range 4 {
		if _, err := cli.Dial(ctx, addr.String()); err != nil {
			t.Fatal(hang.Cause(ctx, err))
		}
	}
	eventually(t, "the server's peers", func() bool { return len(srv.Snapshot().Peers) == 4 })
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if p, err := srv.Accept(ctx); p != nil || !errors.Is(err, goverbs.ErrClosed) {
			t.Errorf("Accept %d after Close: peer %p, %v; want ErrClosed", i, p, err)
		}
	}
}

// TestInlineBacklogFull: a client that keeps the responses of an inline
// handler (never Releases them, so the server has no credit left to
// answer it) and keeps calling does not stall the server for its other
// peers. Each such request goes back to the receive queue at once while
// its response waits for a worker, and the one worker waits for a credit:
// before, once the backlog (sized for requests holding a receive buffer)
// was full, the progress goroutine blocked queueing the next response,
// holding the CQ, and no peer of the server got anything any more.
func TestInlineBacklogFull(t *testing.T) {
	small := func(c *bx.Config) {
		c.MaxPeers, c.Credits, c.Lanes, c.LaneMsgs, c.Workers = 2, 4, 1, 4, 1
	}
	const backlog = 2 * (4 + 1*4) // MaxPeers * (Credits + Lanes*LaneMsgs)
	da, db := rxetest.Pair(t)
	srv := newEndpoint(t, db, small)
	srv.HandleInline(1, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		return req.Data(), nil
	})
	addr, err := srv.Listen(listenAddr(t, db))
	if err != nil {
		t.Fatal(err)
	}
	ctx, wd := hang.For(t, "", time.Minute) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	cli, cli2 := newEndpoint(t, da, small), newEndpoint(t, da, small)
	p, err := cli.Dial(ctx, addr.String())
	if err != nil {
		t.Fatal(hang.Cause(ctx, err))
	}
	p2, err := cli2.Dial(ctx, addr.String())
	if err != nil {
		t.Fatal(hang.Cause(ctx, err))
	}

	flood, stop := context.WithCancel(ctx)
	var mu sync.Mutex
	var held []*bx.Msg
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
		for _, m := range held {
			m.Release()
		}
	}()
	for range 3 * backlog {
		wg.Go(func() {
			m, err := p.Call(flood, 1, []byte("keep me"))
			if err == nil {
				mu.Lock()
				held = append(held, m) // not released: the server's credits stay here
				mu.Unlock()
			}
		})
	}
	// The worker (1) waits for a credit and more than a backlog's worth of
	// responses wait behind it.
	eventually(t, "responses queued past the backlog", func() bool {
		return srv.PoolBusyForTest() > backlog+1+2
	})
	m, err := p2.Call(ctx, 1, []byte("other peer"))
	if err != nil {
		t.Fatalf("another peer's call while one peer holds the server's credits: %v", hang.Cause(ctx, err))
	}
	if string(m.Data()) != "other peer" {
		t.Errorf("response %q", m.Data())
	}
	m.Release()
}

// TestConcurrentRecv: Recvs waiting on one stream at once each get a
// message when as many arrive together, and each returns when the peer
// goes. The stream's notification holds one wake-up: before, the peer's
// going woke one Recv and the others waited until their contexts ended;
// and a message that came while no Recv was blocked on the notification
// could be left beside a Recv that then blocked (a narrow race: the
// message rounds need not fail on the old code; the last part does).
func TestConcurrentRecv(t *testing.T) {
	const readers, rounds = 4, 20
	_, _, p, sp := pair(t, nil)
	ctx, wd := hang.For(t, "", 30*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	rs, ss := sp.Stream(7), p.Stream(7)
	start := func() chan error {
		ch := make(chan error, readers)
		for range readers {
			go func() {
				m, err := rs.Recv(ctx)
				if err == nil {
					m.Release()
				}
				ch <- err
			}()
		}
		eventually(t, "Recvs waiting", func() bool { return rs.ReadersForTest() == readers })
		return ch
	}
	for i := range rounds {
		ch := start()
		for range readers { // back to back: delivered together
			if err := ss.Send(ctx, []byte("m")); err != nil {
				t.Fatal(hang.Cause(ctx, err))
			}
		}
		for range readers {
			if err := <-ch; err != nil {
				t.Fatalf("round %d: a Recv with its message queued: %v", i, hang.Cause(ctx, err))
			}
		}
		wd.Progress()
	}
	ch := start()
	p.Close()
	for range readers {
		if err := <-ch; err == nil || ctx.Err() != nil {
			t.Fatalf("Recv when the peer went: %v; want the peer's error", hang.Cause(ctx, err))
		}
	}
}

// TestInlinePanicOnCaller: an inline handler that panics while a Call's
// goroutine polls the CQ (and so runs it) ends the process, as it does on
// the progress goroutine or a worker. Before, the panic left pollMu held;
// recovered up the caller's stack (net/http recovers its handlers'
// panics), every later Call of the endpoint waited for ever. The scenario
// runs in a child process: A's Call to B makes B's handler call A back,
// A's inline handler panics, A's caller recovers and calls B again.
func TestInlinePanicOnCaller(t *testing.T) {
	if os.Getenv("GOVERBS_BX_PANIC_CHILD") == "1" {
		os.Exit(inlinePanicChild(t))
	}
	rxetest.Pair(t)                           // the devices, or the skip (a required failure) here
	ctx, wd := hang.For(t, "", 2*time.Minute) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestInlinePanicOnCaller$")
	cmd.Env = append(os.Environ(), "GOVERBS_BX_PANIC_CHILD=1")
	out, err := cmd.CombinedOutput()
	code := -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	if ctx.Err() != nil {
		t.Fatalf("child: %v", hang.Err(ctx))
	}
	// 2: the runtime's exit for a panic; 3: the child's own, stalled.
	if code != 2 || !strings.Contains(string(out), "handler boom") {
		t.Fatalf("child exit %d (%v), want 2 (the panic ends the process); output:\n%s", code, err, out)
	}
}

// inlinePanicChild is TestInlinePanicOnCaller's process: 0 if a Call after
// the recovered panic succeeds, 3 if it fails, 1 on a setup error (the old
// code's second Call waited for ever); the fixed code panics the process
// (2) before either.
func inlinePanicChild(t *testing.T) int {
	da, db := rxetest.Pair(t)
	a, err := bx.New(bx.Config{Device: da, Token: token})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	b, err := bx.New(bx.Config{Device: db, Token: token})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	a.HandleInline(7, func(context.Context, *bx.Peer, *bx.Msg) ([]byte, error) {
		panic("handler boom")
	})
	b.Handle(1, func(ctx context.Context, p *bx.Peer, req *bx.Msg) ([]byte, error) {
		if m, err := p.Call(ctx, 7, []byte("back")); err == nil { // runs A's inline handler
			m.Release()
		}
		return req.Data(), nil
	})
	b.Handle(2, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		return req.Data(), nil
	})
	addr, err := b.Listen(listenAddr(t, db))
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	// No bounds of the child's own: a bound on a call here would be one
	// on its speed (a first call that ran out before the handler did
	// would skip the panic); the parent's hang watchdog kills a child
	// that stops making progress.
	ctx := context.Background()
	p, err := a.Dial(ctx, addr.String())
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	func() {
		defer func() { fmt.Println("recovered:", recover()) }()
		if m, err := p.Call(ctx, 1, []byte("x")); err == nil {
			m.Release()
		}
	}()
	m, err := p.Call(ctx, 2, []byte("after"))
	if err != nil {
		fmt.Println("failed after the panic:", err)
		return 3
	}
	m.Release()
	fmt.Println("served after the panic")
	return 0
}
