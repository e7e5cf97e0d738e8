package bx_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
)

// TestOthersWait: a poller gives its CPU to the kernel only while another
// goroutine of its endpoint waits for what a poll delivers (a second
// Call) or a blocking handler runs on the pool; the pool's count of what
// it holds goes back to 0 when the handlers are done, and inline
// handlers never touch it. A count that leaked would make every poller
// yield again (docs/perf.md, "Thirty-first session").
func TestOthersWait(t *testing.T) {
	srv, cli, p, _ := pair(t, nil)
	started, release := make(chan struct{}, 2), make(chan struct{})
	srv.Handle(9, func(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		started <- struct{}{}
		<-release
		return []byte("done"), nil
	})
	srv.HandleInline(10, func(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		return req.Data(), nil
	})
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()

	for i := range 20 {
		m, err := p.Call(ctx, 10, []byte{byte(i)})
		if err != nil {
			t.Fatal(err)
		}
		m.Release()
		wd.Progress()
	}
	if n := srv.PoolBusyForTest(); n != 0 {
		t.Fatalf("after 20 inline calls the pool holds %d requests, want 0", n)
	}
	for _, self := range []bool{false, true} {
		if srv.OthersWaitForTest(self) || cli.OthersWaitForTest(self) {
			t.Fatalf("idle endpoints (a Call polls: %v): othersWait server %v, client %v, want false",
				self, srv.OthersWaitForTest(self), cli.OthersWaitForTest(self))
		}
	}

	var wg sync.WaitGroup
	errs := make(chan error, 2)
	call := func() {
		defer wg.Done()
		m, err := p.Call(ctx, 9, []byte("block"))
		if err == nil {
			if string(m.Data()) != "done" {
				t.Errorf("blocking call answered %q", m.Data())
			}
			m.Release()
		}
		errs <- err
	}
	// start makes one more blocking call and checks that the pool holds
	// the n handlers then running.
	start := func(n int32) {
		t.Helper()
		wg.Add(1)
		go call()
		waitFor(ctx, t, started)
		wd.Progress()
		if got := srv.PoolBusyForTest(); got != n {
			t.Errorf("%d blocking handlers running: the pool holds %d", n, got)
		}
	}
	start(1)
	if !srv.OthersWaitForTest(false) {
		t.Error("server with a blocking handler running: othersWait false, want true")
	}
	if cli.OthersWaitForTest(true) {
		t.Error("client with one Call waiting, polling: othersWait true, want false (its poller is that Call)")
	}
	if !cli.OthersWaitForTest(false) {
		t.Error("client with one Call waiting, the progress goroutine polling: othersWait false, want true (the Call waits for it)")
	}
	start(2)
	if !cli.OthersWaitForTest(true) {
		t.Error("client with two Calls waiting, one polling: othersWait false, want true")
	}
	close(release)
	wg.Wait()
	wd.Progress()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(hang.Cause(ctx, err))
		}
	}
	// The worker counts its request done after it sent the response, so
	// the client may have it first: wait, bounded by the hang bound.
	for srv.PoolBusyForTest() != 0 {
		if ctx.Err() != nil {
			t.Fatalf("handlers done: the pool still holds %d requests, want 0", srv.PoolBusyForTest())
		}
		time.Sleep(time.Millisecond)
	}
	if cli.OthersWaitForTest(false) || srv.OthersWaitForTest(false) {
		t.Errorf("after the calls: othersWait server %v, client %v, want false", srv.OthersWaitForTest(false), cli.OthersWaitForTest(false))
	}
}

// waitFor receives from ch, failing the test when ctx ends first.
func waitFor(ctx context.Context, t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatalf("handler did not start: %v", hang.Err(ctx))
	}
}
