package bx

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/goverbs/goverbs"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/uverbs"
)

// TestAcceptAfterClose: Accept on a closed endpoint fails with ErrClosed
// even while a peer (which Close shut down) still waits in the accept
// queue. Before, Accept's select chose at random between the queued dead
// peer and the stop channel, and returned the peer with no error about
// half the time. No device needed: the endpoint is only what Accept reads.
func TestAcceptAfterClose(t *testing.T) {
	stopCh, stop := context.WithCancel(context.Background())
	e := &Endpoint{ctx: &uverbs.Context{}, accepted: make(chan *Peer, 1), stopCh: stopCh, stop: stop}
	e.closed.Store(true)
	stop()
	for i := range 64 {
		dead := &Peer{e: e}
		dead.state.Store(stateDead)
		select {
		case e.accepted <- dead:
		default:
		}
		p, err := e.Accept(context.Background())
		if p != nil || !errors.Is(err, ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
			t.Fatalf("Accept %d on a closed endpoint: peer %p, %v; want nil, ErrClosed", i, p, err)
		}
	}
}

// TestQueueNeverBlocks: queue, which the progress goroutine calls holding
// the CQ, returns when every worker is busy and the backlog is full (the
// rest waits in overflow), and the workers take what was queued in order.
// Before, it blocked on the full backlog, and with it every peer of the
// endpoint (TestInlineBacklogFull has a client make it so). No device
// needed: no worker runs (Workers is 0 here), so nothing is sent.
func TestQueueNeverBlocks(t *testing.T) {
	const backlog, n = 2, 7
	stopCh, stop := context.WithCancel(context.Background())
	defer stop()
	e := &Endpoint{work: make(chan work), backlog: make(chan work, backlog), overKick: make(chan struct{}, 1),
		stopCh: stopCh, stop: stop}
	ctx, wd := hang.For(t, "", 10*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			e.queue(work{call: uint64(i)})
		}
	}()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("queue blocked with %d works queued and the backlog (%d) full: %v", len(e.backlog), backlog, hang.Err(ctx))
	}
	for i := range n {
		w, ok := e.next()
		if !ok || w.call != uint64(i) {
			t.Fatalf("work %d: got call %d (%v); want %d, in the order queued", i, w.call, ok, i)
		}
	}
	if _, ok := e.next(); ok {
		t.Error("more work than was queued")
	}
	if got := e.busy.Load(); got != n {
		t.Errorf("busy %d, want %d", got, n)
	}
}

// TestConcurrentRecvWakes: Recvs waiting on one stream each return the
// stream's error when it fails, and each gets a message when as many come
// in one go (deliverAll's batch). The notification holds one wake-up:
// before, a failure (or Close, or the peer's close) woke one Recv and the
// others waited until their contexts ended, for good under
// context.Background; and a second message that came while no Recv was
// blocked on the notification (one polling, the others on their way to
// it) was announced to nobody. Only the failure half fails on the old
// code here: the messages' wake-ups go straight to Recvs already blocked.
// No device needed: the endpoint does not poll (its CQ reads as gone), so
// Recv waits on the notification alone, and the messages are queued as
// toStream queues them.
func TestConcurrentRecvWakes(t *testing.T) {
	const readers = 4
	e := &Endpoint{ctx: &uverbs.Context{}, waitGone: true, resume: make(chan struct{}, 1)}
	p := &Peer{e: e, streams: map[uint32]*Stream{}}
	s := p.Stream(7)
	ctx, wd := hang.For(t, "", 10*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	start := func() chan error {
		ch := make(chan error, readers)
		for range readers {
			go func() {
				_, err := s.Recv(ctx)
				ch <- err
			}()
		}
		for s.readers.Load() != readers {
			if ctx.Err() != nil {
				t.Fatal(hang.Err(ctx))
			}
			time.Sleep(time.Millisecond)
		}
		return ch
	}
	for round := range 20 {
		ch := start()
		for range readers {
			p.toStream(&Msg{p: p, Stream: 7})
		}
		for range readers {
			if err := <-ch; err != nil {
				t.Fatalf("round %d: a Recv with a message queued for it: %v", round, hang.Cause(ctx, err))
			}
		}
		wd.Progress()
	}
	ch := start()
	s.fail(ErrPeerGone)
	for range readers {
		if err := <-ch; !errors.Is(err, ErrPeerGone) {
			t.Fatalf("Recv on a failed stream: %v; want ErrPeerGone", hang.Cause(ctx, err))
		}
	}
}
