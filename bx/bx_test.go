package bx_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

var token = []byte("0123456789abcdef-test-token")

// pair returns a server endpoint on the second device listening on its
// address, a client endpoint on the first, and the client's peer.
func pair(t testing.TB, mod func(*bx.Config)) (srv, cli *bx.Endpoint, p *bx.Peer, sp *bx.Peer) {
	t.Helper()
	da, db := rxetest.Pair(t)
	srv, cli = newEndpoint(t, db, mod), newEndpoint(t, da, mod)
	addr, err := srv.Listen(listenAddr(t, db))
	if err != nil {
		t.Fatal(err)
	}
	ctx, wd := hang.For(t, "", 20*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	if p, err = cli.Dial(ctx, addr.String()); err != nil {
		t.Fatal(err)
	}
	if sp, err = srv.Accept(ctx); err != nil {
		t.Fatal(err)
	}
	return srv, cli, p, sp
}

// reportErrs closes errs, once nothing sends on it any more, and fails t
// with each error it holds.
func reportErrs(t *testing.T, errs chan error) {
	t.Helper()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// fatalErrs closes errs, once nothing sends on it any more, and stops t
// at the first error it holds.
func fatalErrs(t *testing.T, errs chan error) {
	t.Helper()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// newEndpoint opens an endpoint on dev with the test token, closed (and
// its Close checked) at the end of the test.
func newEndpoint(t testing.TB, dev string, mod func(*bx.Config)) *bx.Endpoint {
	t.Helper()
	cfg := bx.Config{Device: dev, Token: token}
	if mod != nil {
		mod(&cfg)
	}
	e, err := bx.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeEndpoint(t, e) })
	return e
}

// closeEndpoint closes e and checks its Close, bounded: a Close that has
// not returned within closeBound fails the test, with every goroutine's
// stack dumped by its hang watchdog, instead of holding the package until
// go test's -timeout.
func closeEndpoint(t testing.TB, e *bx.Endpoint) {
	t.Helper()
	ctx, wd := hang.Watch(context.Background(), t.Name()+": Endpoint.Close", closeBound)
	defer wd.Stop()
	done := make(chan error, 1)
	go func() { done <- e.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("close endpoint: %v", err)
		}
	case <-ctx.Done():
		t.Errorf("close endpoint: %v", hang.Err(ctx))
	}
}

// closeBound is more than a Close may take when its peers are gone: a bye
// per peer (HandshakeTimeout, 10 s) and the teardown's waits.
const closeBound = 2 * time.Minute

// listenAddr is the IPv4 address of the device's netdev, port 0.
func listenAddr(t testing.TB, dev string) string {
	t.Helper()
	if dev == "rxe1" {
		return "10.99.0.2:0"
	}
	return "127.0.0.1:0"
}

func TestStreams(t *testing.T) {
	const streams, per = 1000, 3
	_, _, p, sp := pair(t, nil)
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	errc := make(chan error, 1)
	go func() {
		for i := range streams {
			for k := range per {
				msg := fmt.Appendf(nil, "stream %d message %d", i, k)
				if err := p.Stream(uint32(i)).Send(ctx, msg); err != nil {
					errc <- err
					return
				}
			}
		}
		errc <- nil
	}()
	for i := range streams {
		s := sp.Stream(uint32(i))
		for k := range per {
			m, err := s.Recv(ctx)
			if err != nil {
				t.Fatalf("stream %d: %v", i, hang.Cause(ctx, err))
			}
			if want := fmt.Sprintf("stream %d message %d", i, k); string(m.Data()) != want {
				t.Fatalf("stream %d got %q, want %q", i, m.Data(), want)
			}
			m.Release()
			wd.Progress()
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestRPC(t *testing.T) {
	srv, _, p, _ := pair(t, nil)
	srv.Handle(7, func(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		if bytes.HasPrefix(req.Data(), []byte("fail")) {
			return nil, errors.New("asked to fail")
		}
		return append([]byte("echo:"), req.Data()...), nil
	})
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				req := fmt.Sprintf("g%d-%d", g, i)
				m, err := p.Call(ctx, 7, []byte(req))
				if err != nil {
					errs <- hang.Cause(ctx, err)
					return
				}
				if string(m.Data()) != "echo:"+req {
					errs <- fmt.Errorf("call %s answered %q", req, m.Data())
				}
				m.Release()
				wd.Progress()
			}
		}()
	}
	wg.Wait()
	fatalErrs(t, errs)
	_, err := p.Call(ctx, 7, []byte("fail please"))
	if !bx.IsRemote(err) || !strings.Contains(err.Error(), "asked to fail") {
		t.Errorf("remote error: %v", err)
	}
	_, err = p.Call(ctx, 99, []byte("x"))
	if !bx.IsRemote(err) || !strings.Contains(err.Error(), "no handler") {
		t.Errorf("no handler: %v", err)
	}
	// A deadline that passes while the handler runs.
	srv.Handle(8, func(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		time.Sleep(300 * time.Millisecond)
		return nil, nil
	})
	short, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	if _, err := p.Call(short, 8, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("timeout: %v", err)
	}
}

func TestRendezvous(t *testing.T) {
	_, _, p, sp := pair(t, nil)
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	sizes := []int{8000, 8144, 8145, 100_000, 1 << 20, 4 << 20}
	go func() {
		for i, n := range sizes {
			b, err := p.Stream(1).Peer().Endpoint().Alloc(n)
			if err != nil {
				t.Error(err)
				return
			}
			pl := b.Payload()
			for k := range pl {
				pl[k] = byte(k*7 + i)
			}
			if err := p.Stream(1).SendBuffer(ctx, b); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i, n := range sizes {
		m, err := sp.Stream(1).Recv(ctx)
		if err != nil {
			t.Fatal(hang.Cause(ctx, err))
		}
		wd.Progress()
		d := m.Data()
		if len(d) != n {
			t.Fatalf("message %d: %d bytes, want %d", i, len(d), n)
		}
		for k := range d {
			if d[k] != byte(k*7+i) {
				t.Fatalf("message %d byte %d differs", i, k)
			}
		}
		m.Release()
	}
	if _, err := p.Endpoint().Alloc(5 << 20); !errors.Is(err, bx.ErrTooLarge) {
		t.Errorf("oversize alloc: %v", err)
	}
}

func TestWrongToken(t *testing.T) {
	da, db := rxetest.Pair(t)
	srv, err := bx.New(bx.Config{Device: db, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cli, err := bx.New(bx.Config{Device: da, Token: []byte("another-token-of-16+bytes")})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	addr, err := srv.Listen("10.99.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, _ := hang.For(t, "", 10*time.Second) // a hang bound (no progress), not a speed bound
	if _, err := cli.Dial(ctx, addr.String()); !errors.Is(err, bx.ErrAuth) {
		t.Fatalf("dial with a wrong token: %v, want ErrAuth", err)
	}
	// Nobody calls Accept for the refused connection: the acceptor counts
	// it and keeps who and why (Snapshot; goverbs_bx_handshakes_failed_total).
	for srv.Snapshot().Counters.HandshakesFailed == 0 {
		if ctx.Err() != nil {
			t.Fatalf("the acceptor did not count the refused handshake: %v", hang.Err(ctx))
		}
		time.Sleep(5 * time.Millisecond)
	}
	s := srv.Snapshot()
	if s.Counters.HandshakesFailed != 1 || !strings.HasPrefix(s.LastHandshakeFailure, "10.99.0.1:") || !strings.HasSuffix(s.LastHandshakeFailure, ": "+bx.ErrAuth.Error()) {
		t.Errorf("acceptor: %d failed handshakes, the last %q; want 1, from 10.99.0.1, ErrAuth", s.Counters.HandshakesFailed, s.LastHandshakeFailure)
	}
	if c := cli.Snapshot(); c.Counters.HandshakesFailed != 0 || c.LastHandshakeFailure != "" {
		t.Errorf("the dialer counted %d failed handshakes (%q): Dial's error is where a dialer learns it", c.Counters.HandshakesFailed, c.LastHandshakeFailure)
	}
	if _, err := bx.New(bx.Config{Device: da, Token: []byte("short")}); err == nil {
		t.Error("short token accepted")
	}
}

// numberedAcrossBreak sends n numbered messages on stream 3 from p, breaks
// p's lanes (QPs to ERR) halfway, and checks that sp receives every one
// once, in order.
func numberedAcrossBreak(t *testing.T, ctx context.Context, wd *hang.Watchdog, p, sp *bx.Peer, n int) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		var b [8]byte
		for i := range n {
			binary.LittleEndian.PutUint64(b[:], uint64(i))
			if err := p.Stream(3).Send(ctx, b[:]); err != nil {
				errc <- err
				return
			}
			if i == n/2 {
				if err := p.BreakLanesForTest(); err != nil {
					errc <- err
					return
				}
			}
		}
		errc <- nil
	}()
	for i := range n {
		m, err := sp.Stream(3).Recv(ctx)
		if err != nil {
			t.Fatalf("message %d: %v", i, hang.Cause(ctx, err))
		}
		wd.Progress()
		if got := binary.LittleEndian.Uint64(m.Data()); got != uint64(i) {
			t.Fatalf("message %d carries %d", i, got)
		}
		m.Release()
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestRecoveryForcedError forces the client's QPs to ERR in the middle of a
// numbered stream: the peers rebuild the lanes over the control plane and
// every message arrives exactly once, in order.
func TestRecoveryForcedError(t *testing.T) {
	_, cli, p, sp := pair(t, nil)
	const n = 400
	ctx, wd := hang.For(t, "", 90*time.Second) // a hang bound (no progress), not a speed bound
	numberedAcrossBreak(t, ctx, wd, p, sp, n)
	if cli.Stats().Recoveries.Load() == 0 {
		t.Error("no recovery counted")
	}
	t.Logf("duplicates dropped at the receiver: %d", sp.Endpoint().Stats().Duplicates.Load())
}

// TestRecoveryCrossingAsk breaks both ends' QPs at once and sends from
// both: each notices, and the acceptor asks the dialer to recover while the
// dialer's own round is under way (the round is held 300 ms at its start,
// so the ask surely crosses it). That round answers the ask: one round on
// each side, not a second that abandons the first. With rdma_cm lanes the
// acceptor then sat waiting for the abandoned round's connects, and the
// recovery could run out of PeerTimeout (TestCMRecoveryMidRendezvous,
// run AB).
func TestRecoveryCrossingAsk(t *testing.T) {
	t.Run("verbs", func(t *testing.T) { recoveryCrossingAsk(t, nil, false) })
	t.Run("cm", func(t *testing.T) { needCM(t); recoveryCrossingAsk(t, cmOn, false) })
}

// TestRecoveryLateAsk is TestRecoveryCrossingAsk with the acceptor's ask
// written only once the dialer's round has moved the acceptor to the next
// epoch (the ask's goroutine ran late: a loaded machine). The ask names
// the epoch whose QPs failed, not the acceptor's epoch by then, so the
// dialer's round answers it: one round. It named the new epoch before,
// the dialer took it for a failure of its round and abandoned it, and with
// rdma_cm lanes the acceptor sat deaf for PeerTimeout/2 waiting for that
// round's connects (TestCMRecoveryMidRendezvous, run AF: out of
// PeerTimeout).
func TestRecoveryLateAsk(t *testing.T) {
	t.Run("verbs", func(t *testing.T) { recoveryCrossingAsk(t, nil, true) })
	t.Run("cm", func(t *testing.T) { needCM(t); recoveryCrossingAsk(t, cmOn, true) })
}

func recoveryCrossingAsk(t *testing.T, mod func(*bx.Config), late bool) {
	srv, cli, p, sp := pair(t, mod)
	srv.Handle(7, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) { return req.Data(), nil })
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	call := func(what string) error {
		m, err := p.Call(ctx, 7, []byte(what))
		if err != nil {
			return fmt.Errorf("call %s: %w", what, hang.Cause(ctx, err))
		}
		defer m.Release()
		if string(m.Data()) != what {
			return fmt.Errorf("call %s: answer %q", what, m.Data())
		}
		return nil
	}
	if err := call("before"); err != nil {
		t.Fatal(err)
	}
	var held atomic.Int32
	bx.OnDialerRoundForTest(func(*bx.Peer) {
		held.Add(1)
		time.Sleep(300 * time.Millisecond)
	})
	defer bx.OnDialerRoundForTest(nil)
	var lateAsks atomic.Int32
	if late {
		e0 := sp.EpochForTest()
		bx.OnAskForTest(func(q *bx.Peer) {
			if q != sp {
				return
			}
			// Bounded by the hang watchdog, not the clock: a round that
			// never comes fails the test below.
			for q.EpochForTest() == e0 && ctx.Err() == nil {
				time.Sleep(time.Millisecond)
			}
			if q.EpochForTest() != e0 {
				lateAsks.Add(1)
			}
		})
		defer bx.OnAskForTest(nil)
	}
	if err := p.BreakLanesForTest(); err != nil {
		t.Fatal(err)
	}
	if err := sp.BreakLanesForTest(); err != nil {
		t.Fatal(err)
	}
	// Both send on their broken QPs: both start a recovery.
	errc := make(chan error, 2)
	go func() { errc <- call("across") }()
	go func() {
		if err := sp.Stream(4).Send(ctx, []byte("from the acceptor")); err != nil {
			errc <- fmt.Errorf("acceptor send: %w", err)
			return
		}
		m, err := p.Stream(4).Recv(ctx)
		if err != nil {
			errc <- fmt.Errorf("dialer recv: %w", hang.Cause(ctx, err))
			return
		}
		defer m.Release()
		if string(m.Data()) != "from the acceptor" {
			errc <- fmt.Errorf("dialer recv: %q", m.Data())
			return
		}
		errc <- nil
	}()
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	for !p.ActiveForTest() || !sp.ActiveForTest() {
		if ctx.Err() != nil {
			t.Fatal(hang.Err(ctx))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := call("after"); err != nil {
		t.Fatal(err)
	}
	if n := held.Load(); n == 0 {
		t.Fatal("no dialer round ran: the breaks started no recovery")
	}
	if late && lateAsks.Load() == 0 {
		t.Fatal("no ask was written after the dialer's round moved the acceptor's epoch: the case under test did not happen")
	}
	for _, c := range []struct {
		who string
		e   *bx.Endpoint
	}{{"dialer", cli}, {"acceptor", srv}} {
		st := c.e.Stats()
		if r, n := st.Recoveries.Load(), st.RecoveryRounds.Load(); r != 1 || n != 1 {
			t.Errorf("%s: %d recoveries in %d rounds, want 1 in 1", c.who, r, n)
		}
	}
}

// TestRecoveryMidRendezvous breaks both ends' QPs again and again while
// large messages (rendezvous: RTS, CTS, WRITE, FIN) and small ones are in
// flight in both directions: every message must arrive intact, once, in
// order, whatever step of a rendezvous the failure cut.
func TestRecoveryMidRendezvous(t *testing.T) {
	t.Run("region", func(t *testing.T) { recoveryMidRendezvous(t, shared) })
	// Transfers in progress get new windows on the new QPs.
	t.Run("windows", func(t *testing.T) { recoveryMidRendezvous(t, windowsOn) })
	// Few credits: what a recovery resends often needs more than the peer
	// grants at once (CTSs and FINs queued during recovery take credits
	// of the new epoch too); the rest goes out as grants come, and the
	// windows the peer writes through stay bound meanwhile.
	t.Run("few credits", func(t *testing.T) {
		recoveryMidRendezvous(t, func(c *bx.Config) { windowsOn(c); c.Credits = 6 })
	})
	// bx's defaults: messages up to SplitSize go split in parts, the rest
	// by rendezvous; a break cuts split messages between parts too.
	t.Run("split", func(t *testing.T) {
		cli, srv := recoveryMidRendezvous(t, nil)
		if a, b := cli.Stats().Split.Load(), srv.Stats().Split.Load(); a == 0 || b == 0 {
			t.Errorf("split messages received %d and %d: the case under test did not happen", a, b)
		}
	})
}

// recoveryMidRendezvous returns the client's and server's endpoints.
func recoveryMidRendezvous(t *testing.T, mod func(*bx.Config)) (*bx.Endpoint, *bx.Endpoint) {
	_, cli, p, sp := pair(t, mod)
	const n = 60
	ctx, wd := hang.For(t, "", 3*time.Minute) // a hang bound (no progress), not a speed bound
	payload := func(i int) []byte { return mixedPayload(i, 8, 30_000+977*i) }
	errc := make(chan error, 5)
	crossStreams(ctx, wd, p, sp, n, payload, errc)
	// The breaker logs: it ends before the test does, also on a failure.
	bctx, stop := context.WithCancel(ctx)
	var breaker sync.WaitGroup
	t.Cleanup(func() { stop(); breaker.Wait() })
	breaker.Go(func() {
		for k := 0; k < 6; k++ {
			// Break a connection that works: a QP failing while recovery
			// rebuilds is a different case (the peer is declared gone).
			for !p.ActiveForTest() || !sp.ActiveForTest() {
				if bctx.Err() != nil {
					errc <- hang.Err(ctx)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond)
			if bctx.Err() != nil {
				errc <- hang.Err(ctx)
				return
			}
			who := p
			if k%2 == 1 {
				who = sp
			}
			// The last break may not be noticed yet when the check
			// above passes (its peer sees the QP failed at its next
			// completion or post), so a recovery may start between the
			// check and this break; then a fresh QP is still in RESET
			// and cannot be moved to ERR: try again.
			if err := who.BreakLanesForTest(); err != nil {
				t.Logf("break %d: %v (recovering; again)", k, err)
				k--
			}
		}
		errc <- nil
	})
	for range 5 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if cli.Stats().Recoveries.Load() == 0 {
		t.Error("no recovery counted")
	}
	t.Logf("recoveries %d, rendezvous %d/%d, split %d/%d, duplicates dropped %d/%d", cli.Stats().Recoveries.Load(),
		cli.Stats().Rendezvous.Load(), sp.Endpoint().Stats().Rendezvous.Load(),
		cli.Stats().Split.Load(), sp.Endpoint().Stats().Split.Load(),
		cli.Stats().Duplicates.Load(), sp.Endpoint().Stats().Duplicates.Load())
	return cli, sp.Endpoint()
}

// mixedPayload is message i of a stream that mixes eager and rendezvous
// messages: every third one small bytes, the others big bytes; its index
// in its first 8 bytes, then a pattern of i.
func mixedPayload(i, small, big int) []byte {
	size := small
	if i%3 != 0 {
		size = big
	}
	b := make([]byte, size)
	for k := range b {
		b[k] = byte(k*13 + i)
	}
	binary.LittleEndian.PutUint64(b, uint64(i))
	return b
}

// crossStreams sends payload(0), ..., payload(n-1) each way between p and
// sp on stream 4, and receives them on both sides, checking that each
// arrives in order and intact. Each of its four goroutines sends one
// result to errc (nil: all done).
func crossStreams(ctx context.Context, wd *hang.Watchdog, p, sp *bx.Peer, n int, payload func(int) []byte, errc chan<- error) {
	send := func(from *bx.Peer) {
		for i := range n {
			if err := from.Stream(4).Send(ctx, payload(i)); err != nil {
				errc <- fmt.Errorf("send %d: %w", i, hang.Cause(ctx, err))
				return
			}
		}
		errc <- nil
	}
	recv := func(at *bx.Peer) {
		for i := range n {
			m, err := at.Stream(4).Recv(ctx)
			if err != nil {
				errc <- fmt.Errorf("message %d: %w", i, hang.Cause(ctx, err))
				return
			}
			wd.Progress()
			if !bytes.Equal(m.Data(), payload(i)) {
				err := fmt.Errorf("message %d: %d bytes, index %d, contents differ", i, len(m.Data()), binary.LittleEndian.Uint64(m.Data()))
				m.Release()
				errc <- err
				return
			}
			m.Release()
		}
		errc <- nil
	}
	go send(p)
	go send(sp)
	go recv(p)
	go recv(sp)
}

// TestHTTP runs net/http over bx Conns.
func TestHTTP(t *testing.T) {
	srv, cli, _, _ := pair(t, nil)
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %d %x", r.Method, len(b), sha256.Sum256(b))
	})
	hs := &http.Server{Handler: mux}
	go hs.Serve(srv.Listener())
	defer hs.Close()
	addr := srv.ListenAddrs()[0].String()
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return cli.DialConn(ctx, addr) },
	}, Timeout: hang.Scale(10 * time.Second)}
	for _, n := range []int{0, 10, 100_000} {
		body := bytes.Repeat([]byte("goverbs "), n/8+1)[:n]
		resp, err := client.Post("http://bx/echo", "application/octet-stream", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("%v (server received %d, client sent %d)", err, srv.Stats().Received.Load(), cli.Stats().Sent.Load())
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("POST %d %x", n, sha256.Sum256(body)); string(got) != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
}

// TestLargeEager: with Config.EagerSize raised on both ends, a call up to
// that size goes in one message each way (no rendezvous) and one above it
// by rendezvous, every payload intact.
func TestLargeEager(t *testing.T) {
	const eager = 64<<10 - bx.HeaderSize
	big := func(c *bx.Config) { c.EagerSize = eager; c.SplitSize = -1 }
	srv, cli, p, _ := pair(t, big)
	srv.HandleInline(1, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		return append([]byte(nil), req.Data()...), nil
	})
	ctx, wd := hang.For(t, "", 30*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	for _, n := range []int{8145, 32 << 10, eager, eager + 1, 100000} {
		before := cli.Stats().Rendezvous.Load() + srv.Stats().Rendezvous.Load()
		for i := range 3 {
			req := make([]byte, n)
			for j := range req {
				req[j] = byte(j*7 + i + n)
			}
			m, err := p.Call(ctx, 1, req)
			if err != nil {
				t.Fatalf("call of %d bytes: %v", n, err)
			}
			if !bytes.Equal(m.Data(), req) {
				t.Fatalf("call of %d bytes: the echo differs (%d bytes back)", n, len(m.Data()))
			}
			m.Release()
			wd.Progress()
		}
		rv := cli.Stats().Rendezvous.Load() + srv.Stats().Rendezvous.Load() - before
		if want := uint64(0); n > eager {
			if rv == 0 {
				t.Errorf("%d bytes, above EagerSize %d: no rendezvous counted", n, eager)
			}
		} else if rv != want {
			t.Errorf("%d bytes, within EagerSize %d: %d rendezvous counted, want none", n, eager, rv)
		}
	}
}

// TestEagerSizeMismatch: endpoints of different EagerSize refuse each
// other at the handshake, with an error naming the setting, and nothing
// stays routed (a larger message than the receiver's buffers would fail
// its QP again after every recovery).
func TestEagerSizeMismatch(t *testing.T) {
	dialMismatched(t, func(c *bx.Config) { c.EagerSize = 32 << 10 }, "Config.EagerSize")
}

// dialMismatched dials between an endpoint configured by mod and one of
// the defaults, each way round: the handshake must fail on both sides
// within the bound with a protocol error naming want, and leave no QP
// routed.
func dialMismatched(t *testing.T, mod func(*bx.Config), want string) {
	t.Helper()
	da, db := rxetest.Pair(t)
	for _, modServer := range []bool{true, false} {
		srvMod, cliMod := mod, func(*bx.Config) {}
		if !modServer {
			srvMod, cliMod = cliMod, srvMod
		}
		srv, cli := newEndpoint(t, db, srvMod), newEndpoint(t, da, cliMod)
		addr, err := srv.Listen(listenAddr(t, db))
		if err != nil {
			t.Fatal(err)
		}
		ctx, wd := hang.For(t, "", 20*time.Second) // a hang bound (no progress), not a speed bound
		_, err = cli.Dial(ctx, addr.String())
		if !errors.Is(err, bx.ErrProtocol) || !strings.Contains(err.Error(), want) {
			t.Errorf("changed server %v: dial between different settings: %v, want a protocol error naming %s", modServer, err, want)
		}
		t.Logf("changed server %v: %v", modServer, err)
		wd.Stop()
		if n := cli.QPsForTest() + srv.QPsForTest(); n != 0 {
			t.Errorf("changed server %v: %d QPs routed after the failed dial", modServer, n)
		}
	}
}
