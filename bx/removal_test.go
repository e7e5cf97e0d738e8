package bx_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// removalPair connects an endpoint on rxe1 (gone) and one on rxe0 (kept),
// the one on rxe1 the acceptor (dialer false) or the dialer, and returns
// both endpoints and their peers. It registers rxe1's delete and restore
// first, so the endpoints' Close cleanups run before the restore.
func removalPair(t *testing.T, mod func(*bx.Config), goneDials bool) (r *rxetest.Removal, gone, kept *bx.Endpoint, gp, kp *bx.Peer) {
	t.Helper()
	rxetest.Pair(t)
	r = rxetest.RemoveDevice(t, "rxe1")
	gone, kept = newEndpoint(t, "rxe1", mod), newEndpoint(t, "rxe0", mod)
	acc, dial := gone, kept
	accDev := "rxe1"
	if goneDials {
		acc, dial, accDev = kept, gone, "rxe0"
	}
	addr, err := acc.Listen(listenAddr(t, accDev))
	if err != nil {
		t.Fatal(err)
	}
	ctx, wd := hang.For(t, "", 20*time.Second)
	defer wd.Stop()
	dp, err := dial.Dial(ctx, addr.String())
	if err != nil {
		t.Fatal(err)
	}
	ap, err := acc.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gp, kp = ap, dp
	if goneDials {
		gp, kp = dp, ap
	}
	for _, e := range []*bx.Endpoint{gone, kept} {
		e.Handle(7, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) { return req.Data(), nil })
	}
	for _, p := range []*bx.Peer{gp, kp} {
		m, err := p.Call(ctx, 7, []byte("before"))
		if err != nil {
			t.Fatal(err)
		}
		m.Release()
	}
	return r, gone, kept, gp, kp
}

// waitDown waits, hang-bounded, for p to go down and returns its error.
func waitDown(ctx context.Context, t *testing.T, what string, p *bx.Peer) error {
	t.Helper()
	select {
	case <-p.Done():
		return p.Err()
	case <-ctx.Done():
		t.Fatalf("%s: peer still up: %v", what, hang.Err(ctx))
		return nil
	}
}

// TestRemoveDeviceCM deletes rxe1 under connected endpoints whose lanes
// use rdma_cm, the one on rxe1 the acceptor and then the dialer. The
// peer on rxe1 goes down at once (no recovery) with an error matching
// ErrPeerGone and cm.ErrDeviceRemoved that names the device; the peer on
// rxe0 with ErrPeerGone carrying that reason (the bye); the delete waits
// for the endpoint on rxe1 and finishes once its Close returned.
func TestRemoveDeviceCM(t *testing.T) {
	needCM(t)
	for _, dials := range []bool{false, true} {
		t.Run(map[bool]string{false: "acceptor", true: "dialer"}[dials], func(t *testing.T) {
			r, gone, kept, gp, kp := removalPair(t, cmOn, dials)
			ctx, _ := hang.For(t, "", 20*time.Second)
			r.Delete(t)
			err := waitDown(ctx, t, "peer on rxe1", gp)
			t.Logf("%6.2fs peer on rxe1: %v", time.Since(r.Start).Seconds(), err)
			if !errors.Is(err, bx.ErrPeerGone) || !errors.Is(err, cm.ErrDeviceRemoved) || !strings.Contains(err.Error(), "rxe1") {
				t.Errorf("peer on rxe1 went down with %v, want ErrPeerGone and cm.ErrDeviceRemoved naming rxe1", err)
			}
			if _, err := gp.Call(ctx, 7, []byte("after")); !errors.Is(err, cm.ErrDeviceRemoved) {
				t.Errorf("call on rxe1 after the removal: %v, want cm.ErrDeviceRemoved", err)
			}
			err = waitDown(ctx, t, "peer on rxe0", kp)
			t.Logf("%6.2fs peer on rxe0: %v", time.Since(r.Start).Seconds(), err)
			if !errors.Is(err, bx.ErrPeerGone) || !strings.Contains(err.Error(), "device removed") {
				t.Errorf("peer on rxe0 went down with %v, want ErrPeerGone saying the device was removed", err)
			}
			if n := gone.Stats().Recoveries.Load() + kept.Stats().Recoveries.Load(); n != 0 {
				t.Errorf("%d recoveries, want none", n)
			}
			if r.Finished() {
				t.Fatal("rdma link delete rxe1 returned with the endpoint on rxe1 open; the kernel waits for its uverbs descriptor")
			}
			closeEndpoint(t, gone)
			if !r.WaitFinished(20 * time.Second) {
				t.Fatalf("rdma link delete rxe1 still blocked after the endpoint on rxe1 closed:\n%s", rxetest.Table())
			}
			t.Logf("%6.2fs delete finished", time.Since(r.Start).Seconds())
		})
	}
}

// TestRemoveDeviceExchange deletes rxe1 under connected endpoints whose
// lanes were set up by exchange (the default). No rdma_cm ID tells of the
// removal and rxe's QPs go on working while the delete waits, so calls
// keep succeeding both ways (logged); the delete waits for the endpoint on
// rxe1, whose Close returns and lets it finish; the peer on rxe0 then
// fails with ErrPeerGone (the bye), and the closed one with ErrClosed.
func TestRemoveDeviceExchange(t *testing.T) {
	for _, dials := range []bool{false, true} {
		t.Run(map[bool]string{false: "acceptor", true: "dialer"}[dials], func(t *testing.T) {
			r, gone, _, gp, kp := removalPair(t, nil, dials)
			ctx, wd := hang.For(t, "", 20*time.Second)
			r.Delete(t)
			for i := range 5 {
				for name, p := range map[string]*bx.Peer{"rxe1": gp, "rxe0": kp} {
					m, err := p.Call(ctx, 7, []byte("after"))
					if err != nil {
						t.Logf("call %d from %s after the delete began: %v", i, name, err)
						continue
					}
					m.Release()
					wd.Progress()
				}
			}
			if r.Finished() {
				t.Fatal("rdma link delete rxe1 returned with the endpoint on rxe1 open; the kernel waits for its uverbs descriptor")
			}
			closeEndpoint(t, gone)
			if !r.WaitFinished(20 * time.Second) {
				t.Fatalf("rdma link delete rxe1 still blocked after the endpoint on rxe1 closed:\n%s", rxetest.Table())
			}
			err := waitDown(ctx, t, "peer on rxe0", kp)
			if !errors.Is(err, bx.ErrPeerGone) {
				t.Errorf("peer on rxe0 went down with %v, want ErrPeerGone", err)
			}
			if _, err := kp.Call(ctx, 7, nil); !errors.Is(err, bx.ErrPeerGone) {
				t.Errorf("call from rxe0 after rxe1's endpoint closed: %v, want ErrPeerGone", err)
			}
			if _, err := gp.Call(ctx, 7, nil); !errors.Is(err, bx.ErrClosed) {
				t.Errorf("call on the closed endpoint: %v, want ErrClosed", err)
			}
			t.Logf("%6.2fs delete finished; peer on rxe0: %v", time.Since(r.Start).Seconds(), err)
		})
	}
}
