package bx_test

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
)

// TestAcceptorRetryKeepsPeer: the acceptor notices a QP failure first (it
// asks the dialer for a round and waits for the recovery), and its side
// of the first round fails (its new QPs go to ERR just before it resends):
// it asks for another round, which succeeds. The message it sent across
// the failure arrives once, and the peer, recovered, stays up past
// Config.PeerTimeout. The acceptor's two waits (its own ask's and the
// failed round's) shared one signal of the recovery's end: the one left
// waiting declared the healthy peer gone at its deadline.
func TestAcceptorRetryKeepsPeer(t *testing.T) {
	peerTimeout := hang.Scale(6 * time.Second)
	srv, _, p, sp := pair(t, func(c *bx.Config) { c.PeerTimeout = peerTimeout })
	srv.Handle(7, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) { return req.Data(), nil })
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	var rounds atomic.Int32
	bx.OnAcceptResendForTest(func(q *bx.Peer) {
		if q == sp && rounds.Add(1) == 1 {
			if err := q.FailLanesForTest(); err != nil {
				t.Error(err)
			}
		}
	})
	defer bx.OnAcceptResendForTest(nil)
	if err := sp.BreakLanesForTest(); err != nil {
		t.Fatal(err)
	}
	// Sent on the broken lanes: the acceptor starts the recovery, and the
	// message waits for its resend.
	if err := sp.Stream(4).Send(ctx, []byte("from the acceptor")); err != nil {
		t.Fatal(err)
	}
	m, err := p.Stream(4).Recv(ctx)
	if err != nil {
		t.Fatal(hang.Cause(ctx, err))
	}
	if string(m.Data()) != "from the acceptor" {
		t.Fatalf("received %q", m.Data())
	}
	m.Release()
	wd.Progress()
	for !p.ActiveForTest() || !sp.ActiveForTest() {
		if ctx.Err() != nil {
			t.Fatal(hang.Err(ctx))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := rounds.Load(); n < 2 {
		t.Fatalf("%d acceptor rounds resent: the failed round under test did not happen", n)
	}
	// Past the deadline of every wait the recovery began.
	until := time.Now().Add(peerTimeout + hang.Scale(2*time.Second))
	for time.Now().Before(until) {
		select {
		case <-sp.Done():
			t.Fatalf("acceptor: peer gone after its recovery succeeded: %v", sp.Err())
		case <-p.Done():
			t.Fatalf("dialer: peer gone after its recovery succeeded: %v", p.Err())
		case <-time.After(50 * time.Millisecond):
		}
		wd.Progress()
	}
	r, err := p.Call(ctx, 7, []byte("after"))
	if err != nil {
		t.Fatal(hang.Cause(ctx, err))
	}
	if string(r.Data()) != "after" {
		t.Fatalf("call answered %q", r.Data())
	}
	r.Release()
	// Exactly once: nothing more came on the stream.
	short, cancel := context.WithTimeout(ctx, hang.Scale(200*time.Millisecond)) // a window to look in, passed when it ends
	defer cancel()
	if m, err := p.Stream(4).Recv(short); !errors.Is(err, context.DeadlineExceeded) {
		if m != nil {
			t.Fatalf("a second message on the stream: %q", m.Data())
		}
		t.Fatalf("recv: %v", err)
	}
}

// TestStaleCreditPaysAgain: a message that took its credit before a
// recovery and is posted after it (its sender preempted between the two)
// pays a credit of the new epoch. Resync forgave the old one, so posted
// as it was it reached the peer uncounted: the sender went on with one
// credit more than the peer granted (the credits came back one over the
// grant), and the peer, once the sender used them all, saw an overrun.
func TestStaleCreditPaysAgain(t *testing.T) {
	srv, cli, p, sp := pair(t, nil)
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	pools, credits := baseline(srv, cli, p, sp)
	before := p.EpochForTest()
	err := p.SendAcrossRecoveryForTest(3, []byte("stale credit"), func() {
		if err := p.BreakLanesForTest(); err != nil {
			t.Error(err)
			return
		}
		for p.EpochForTest() == before || !p.ActiveForTest() || !sp.ActiveForTest() {
			if ctx.Err() != nil {
				t.Error(hang.Err(ctx))
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	if err != nil || t.Failed() {
		t.Fatalf("send across the recovery: %v", err)
	}
	rs := sp.Stream(3)
	for i, want := range []string{"stale credit", "after"} {
		if i == 1 {
			if err := p.Stream(3).Send(ctx, []byte(want)); err != nil {
				t.Fatal(err)
			}
		}
		m, err := rs.Recv(ctx)
		if err != nil {
			t.Fatal(hang.Cause(ctx, err))
		}
		if string(m.Data()) != want {
			t.Fatalf("message %d: %q, want %q (once each, in order)", i, m.Data(), want)
		}
		m.Release()
		wd.Progress()
	}
	if p.EpochForTest() == before {
		t.Fatal("no recovery happened")
	}
	if err := p.Stream(3).Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.Recv(ctx); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv after the two messages and the close: %v, want io.EOF", hang.Cause(ctx, err))
	}
	if err := rs.Close(); err != nil {
		t.Fatal(err)
	}
	settled(t, srv, cli, p, sp, pools, credits)
}
