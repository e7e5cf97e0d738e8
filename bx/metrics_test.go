package bx_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
)

// eventually polls cond until it holds or 5 s (scaled to the machine)
// pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	limit := hang.Scale(5 * time.Second)
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v (%s)", what, limit, hang.How())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func pool(s bx.Snapshot, name string) bx.PoolSnapshot {
	for _, p := range s.Pools {
		if p.Pool == name {
			return p
		}
	}
	return bx.PoolSnapshot{}
}

func class(s bx.Snapshot, name string) bx.ClassSnapshot {
	for _, c := range s.Classes {
		if c.Class == name {
			return c
		}
	}
	return bx.ClassSnapshot{}
}

// TestSnapshot: after known RPC work, the snapshot's counters are that
// work: calls per stream class, remote errors, messages, rendezvous, pools.
func TestSnapshot(t *testing.T) {
	srv, cli, p, sp := pair(t, nil)
	if err := cli.SetStreamClass(func(s uint32) string { return map[uint32]string{5: "small", 6: "large"}[s] }); err != nil {
		t.Fatal(err)
	}
	echo := func(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		if bytes.Equal(req.Data(), []byte("fail")) {
			return nil, errors.New("asked to fail")
		}
		return req.Data(), nil
	}
	srv.Handle(5, echo)
	srv.Handle(6, echo)
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	const small, large, fails = 40, 5, 3
	big := bytes.Repeat([]byte("x"), 100_000) // above EagerSize: rendezvous both ways
	var wg sync.WaitGroup
	errs := make(chan error, small+large)
	for i := range small + large {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, req := uint32(5), []byte("hello")
			if i >= small {
				st, req = 6, big
			}
			m, err := p.Call(ctx, st, req)
			if err != nil {
				errs <- hang.Cause(ctx, err)
				return
			}
			if !bytes.Equal(m.Data(), req) {
				errs <- errors.New("wrong echo")
			}
			m.Release()
			wd.Progress()
		}()
	}
	wg.Wait()
	fatalErrs(t, errs)
	for range fails {
		if _, err := p.Call(ctx, 5, []byte("fail")); !bx.IsRemote(err) {
			t.Fatalf("failing call: %v", err)
		}
	}
	// A call that times out before it is sent counts as a failure.
	done, cancelDone := context.WithCancel(ctx)
	cancelDone()
	if _, err := p.Call(done, 6, []byte("late")); err == nil {
		t.Fatal("call with a done context succeeded")
	}

	calls := uint64(small + large + fails)
	s := cli.Snapshot()
	t.Logf("client: %+v", s.Counters)
	if s.Device != cli.Device() || s.ID != cli.ID() || s.Closed {
		t.Errorf("identity %q %x closed %v", s.Device, s.ID, s.Closed)
	}
	if c := class(s, "small"); c.Latency.Count != small+fails || c.RemoteErrors != fails || c.Failures != 0 || c.Latency.Sum <= 0 {
		t.Errorf("class small: %+v, want %d calls, %d remote errors", c, small+fails, fails)
	}
	if c := class(s, "large"); c.Latency.Count != large || c.RemoteErrors != 0 || c.Failures != 1 {
		t.Errorf("class large: %+v, want %d calls, 1 failure", c, large)
	}
	if len(s.Classes) != 2 {
		t.Errorf("classes %+v, want small and large", s.Classes)
	}
	if s.Counters.Sent != calls || s.Counters.Received != calls || s.Counters.Recoveries != 0 || s.Counters.Duplicates != 0 {
		t.Errorf("client counters %+v, want %d sent and received", s.Counters, calls)
	}
	// Large requests went by rendezvous (the server read them), large
	// responses too (the client read them).
	if s.Counters.Rendezvous != large {
		t.Errorf("client rendezvous %d, want %d", s.Counters.Rendezvous, large)
	}
	if len(s.Peers) != 1 || s.Peers[0].ID != srv.ID() || !s.Peers[0].Dialer || s.Peers[0].State != "active" || s.Peers[0].Recoveries != 0 {
		t.Fatalf("client peers %+v", s.Peers)
	}
	ps := s.Peers[0]
	if ps.Credits.Acquired < calls || ps.Window.Acquired != calls || ps.Window.Limits.Msgs != 2*64 {
		t.Errorf("client peer: credits acquired %d, window acquired %d (limit %d), want >= %d, %d (128)",
			ps.Credits.Acquired, ps.Window.Acquired, ps.Window.Limits.Msgs, calls, calls)
	}
	if ps.CreditsAvailable == 0 || ps.CreditsAvailable > 63 {
		t.Errorf("client peer: %d credits available, want 1..63", ps.CreditsAvailable)
	}
	if s.Window.Acquired != calls || s.Window.Limits.Msgs != 1024 {
		t.Errorf("endpoint window %+v", s.Window)
	}
	// Every receive buffer is an eager buffer in use.
	if e := pool(s, "eager"); e.InUseBytes <= 0 || e.Registered < e.InUseBytes || e.Allocs < calls {
		t.Errorf("eager pool %+v", e.AllocatorStats)
	}
	if r := pool(s, "rndv"); r.Allocs != large || r.Failures != 0 {
		t.Errorf("rndv pool: %d allocs, want %d", r.Allocs, large)
	}
	if l := pool(s, "large"); l.Allocs != large {
		t.Errorf("large pool: %d allocs, want %d (responses read)", l.Allocs, large)
	}
	// Acknowledgements drain the windows and free the rendezvous sources.
	eventually(t, "client in flight drains", func() bool {
		s := cli.Snapshot()
		return s.Window.InFlightMsgs == 0 && s.Peers[0].Window.InFlightMsgs == 0 && s.Peers[0].Window.InFlightBytes == 0 &&
			pool(s, "rndv").InUse == 0 && pool(s, "large").InUse == 0
	})

	// The server: it made no calls, sent one response per call.
	eventually(t, "server counters", func() bool {
		s := srv.Snapshot()
		return s.Counters.Received == calls && s.Counters.Sent == calls
	})
	ss := srv.Snapshot()
	if len(ss.Classes) != 0 || ss.Counters.Rendezvous != large || len(ss.Peers) != 1 || ss.Peers[0].ID != cli.ID() || ss.Peers[0].Dialer {
		t.Errorf("server snapshot: classes %+v, rendezvous %d, peers %+v", ss.Classes, ss.Counters.Rendezvous, ss.Peers)
	}
	if r := pool(ss, "rndv"); r.Allocs != large {
		t.Errorf("server rndv pool: %d allocs, want %d (large responses)", r.Allocs, large)
	}
	_ = sp

	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	if s := cli.Snapshot(); !s.Closed || len(s.Peers) != 0 || class(s, "small").Latency.Count != small+fails {
		t.Errorf("after Close: closed %v, %d peers, classes %+v", s.Closed, len(s.Peers), s.Classes)
	}
}

// TestSnapshotStalls: concurrent calls against a slow handler must wait
// for credits (2 data credits, a roomy window) or for window room (a lane
// of 1 message), and the snapshot says so. Each limit gets a run of its
// own: with both tight, which one a call waits for depends on when
// acknowledgements and credits come back.
func TestSnapshotStalls(t *testing.T) {
	for _, c := range []struct {
		name     string
		credits  int
		laneMsgs int64
		window   bool // the window stalls, else the credits
	}{
		{"credits", 3, 64, false},
		{"window", 64, 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, cli, p, _ := pair(t, func(cfg *bx.Config) { cfg.Credits, cfg.Lanes, cfg.LaneMsgs = c.credits, 1, c.laneMsgs })
			srv.Handle(1, func(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
				time.Sleep(2 * time.Millisecond)
				return []byte("ok"), nil
			})
			ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
			const g, per = 8, 5
			var wg sync.WaitGroup
			errs := make(chan error, g)
			for range g {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range per {
						m, err := p.Call(ctx, 1, []byte("x"))
						if err != nil {
							errs <- hang.Cause(ctx, err)
							return
						}
						m.Release()
						wd.Progress()
					}
				}()
			}
			wg.Wait()
			fatalErrs(t, errs)
			s := cli.Snapshot()
			ps := s.Peers[0]
			t.Logf("credits %+v (available %d), window %+v", ps.Credits, ps.CreditsAvailable, ps.Window)
			if ps.Window.Waiting != 0 || ps.Window.Limits.Msgs != c.laneMsgs {
				t.Errorf("window: %+v, want none waiting now, limit %d", ps.Window, c.laneMsgs)
			}
			if ps.Credits.Waiting != 0 {
				t.Errorf("credits: %+v, want none waiting now", ps.Credits)
			}
			if c.window && (ps.Window.Stalls == 0 || ps.Window.WaitTime <= 0) {
				t.Errorf("window: %+v, want stalls with wait time", ps.Window)
			}
			if !c.window {
				if ps.Credits.Stalls == 0 || ps.Credits.WaitTime <= 0 {
					t.Errorf("credits: %+v, want stalls with wait time", ps.Credits)
				}
				if ps.CreditsAvailable > 2 {
					t.Errorf("%d credits available of 2", ps.CreditsAvailable)
				}
			}
			if cl := class(s, "1"); cl.Latency.Count != g*per || cl.Latency.Quantile(0.5) < time.Millisecond {
				t.Errorf("class 1: %d calls, p50 %v; want %d, >= 1ms (the handler sleeps 2ms)", cl.Latency.Count, cl.Latency.Quantile(0.5), g*per)
			}
		})
	}
}

// TestSnapshotRecovery: a forced QP failure is one recovery, on the
// endpoint and on the peer, on both sides.
func TestSnapshotRecovery(t *testing.T) {
	srv, cli, p, sp := pair(t, nil)
	srv.Handle(2, func(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) { return req.Data(), nil })
	ctx, _ := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	call := func() {
		t.Helper()
		m, err := p.Call(ctx, 2, []byte("ping"))
		if err != nil {
			t.Fatal(err)
		}
		m.Release()
	}
	call()
	if err := p.BreakLanesForTest(); err != nil {
		t.Fatal(err)
	}
	call() // waits out the recovery
	for _, e := range []struct {
		name string
		ep   *bx.Endpoint
	}{{"client", cli}, {"server", srv}} {
		eventually(t, e.name+" recovered", func() bool {
			s := e.ep.Snapshot()
			return len(s.Peers) == 1 && s.Peers[0].State == "active" && s.Peers[0].Recoveries >= 1
		})
		s := e.ep.Snapshot()
		if s.Counters.Recoveries != 1 || s.Peers[0].Recoveries != 1 {
			t.Errorf("%s: endpoint recoveries %d, peer recoveries %d, want 1 and 1", e.name, s.Counters.Recoveries, s.Peers[0].Recoveries)
		}
	}
	if c := class(cli.Snapshot(), "2"); c.Latency.Count != 2 || c.Failures != 0 {
		t.Errorf("class 2 %+v, want 2 calls", c)
	}
	_ = sp
}
