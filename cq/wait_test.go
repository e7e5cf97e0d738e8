package cq_test

import (
	"context"
	"errors"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/procstat"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

// loop is two RC QPs on one device connected to each other, with separate
// event-driven CQs for the sender and the receiver.
type loop struct {
	ctx      *uverbs.Context
	m        *mr.MR
	scq, rcq *cq.CQ
	sqp, rqp *qp.QP
	sendWR   []qp.SendWR
	recvWR   []qp.RecvWR
	wc       []cq.WC
	mem      *mr.Memory
}

func newLoop(t *testing.T, rcqOpts cq.Options) *loop {
	t.Helper()
	return newLoopOn(t, rxetest.Open(t, rxetest.One(t)), rcqOpts)
}

func TestWaitWakesOnCompletion(t *testing.T) {
	l := newLoop(t, cq.Options{Events: true})
	for i := range 5 {
		if err := l.rqp.PostRecv(l.recvWR); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(20*time.Second)) // a hang bound
			defer cancel()
			for {
				n, err := l.rcq.Poll(l.wc)
				if err != nil || n > 0 {
					if err == nil {
						err = l.wc[0].Err()
					}
					done <- err
					return
				}
				if err := l.rcq.Wait(ctx); err != nil {
					done <- err
					return
				}
			}
		}()
		// Let the waiter park first (the common case), then send.
		time.Sleep(20 * time.Millisecond)
		if err := l.sqp.PostSend(l.sendWR); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		// The sender's CQ is event driven too.
		drain(t, l.scq, l.wc)
	}
	st := l.rcq.Stats()
	if st.Arms == 0 || st.Wakeups == 0 {
		t.Errorf("stats %+v: want arms and event wakeups", st)
	}
}

// drain waits for one completion with Wait and Poll.
func drain(t *testing.T, c *cq.CQ, wc []cq.WC) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(20*time.Second)) // a hang bound
	defer cancel()
	for {
		n, err := c.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			if err := wc[0].Err(); err != nil {
				t.Fatal(err)
			}
			return
		}
		if err := c.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWaitRaceCompletionBeforeArm: a completion that is already queued when
// Wait arms raises no event; Wait must still return at once.
func TestWaitRaceCompletionBeforeArm(t *testing.T) {
	l := newLoop(t, cq.Options{Events: true})
	if err := l.rqp.PostRecv(l.recvWR); err != nil {
		t.Fatal(err)
	}
	if err := l.sqp.PostSend(l.sendWR); err != nil {
		t.Fatal(err)
	}
	drain(t, l.scq, l.wc) // the receive has arrived once the send completed
	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(2*time.Second))
	defer cancel()
	if err := l.rcq.Wait(ctx); err != nil {
		t.Fatalf("Wait with a queued completion: %v", err)
	}
	if n, _ := l.rcq.Poll(l.wc); n != 1 {
		t.Fatalf("polled %d after Wait, want 1", n)
	}
}

func TestWaitContext(t *testing.T) {
	l := newLoop(t, cq.Options{Events: true})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := l.rcq.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with a deadline: %v", err)
	}
	if d := time.Since(start); d > hang.Scale(5*time.Second) {
		t.Errorf("deadline of 50 ms honoured after %v", d)
	}
	ctx, cancel = context.WithCancel(context.Background())
	go func() { time.Sleep(30 * time.Millisecond); cancel() }()
	if err := l.rcq.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait cancelled: %v", err)
	}
	// A CQ without a channel cannot Wait.
	plain, err := cq.Create(l.ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Wait(context.Background()); !errors.Is(err, cq.ErrNoChannel) {
		t.Errorf("Wait without a channel: %v", err)
	}
	if err := plain.Notify(false); !errors.Is(err, cq.ErrNoChannel) {
		t.Errorf("Notify without a channel: %v", err)
	}
	// A closed CQ says so.
	if err := l.rqp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.rcq.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.rcq.Wait(context.Background()); !errors.Is(err, cq.ErrClosed) {
		t.Errorf("Wait after Close: %v", err)
	}
}

// TestWaitNilContext: a nil context is refused by the waits, not
// dereferenced (they panicked).
func TestWaitNilContext(t *testing.T) {
	l := newLoop(t, cq.Options{Events: true})
	var nilCtx context.Context
	if err := l.rcq.Wait(nilCtx); err == nil || !strings.Contains(err.Error(), "nil context") {
		t.Errorf("Wait(nil): %v", err)
	}
	if err := l.rcq.WaitSolicited(nilCtx); err == nil || !strings.Contains(err.Error(), "nil context") {
		t.Errorf("WaitSolicited(nil): %v", err)
	}
	ch, err := l.ctx.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Own(); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Next(nilCtx); err == nil || !strings.Contains(err.Error(), "nil context") {
		t.Errorf("CompChannel.Next(nil): %v", err)
	}
}

// TestCreateOnClosedChannel: a CQ is not created on a closed completion
// channel (its old descriptor number went to the kernel, where it may be
// another file's by then).
func TestCreateOnClosedChannel(t *testing.T) {
	ctx := rxetest.Open(t, rxetest.One(t))
	ch, err := ctx.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	if ch.Fd() != -1 {
		t.Errorf("Fd of a closed channel: %d, want -1", ch.Fd())
	}
	q, err := cq.CreateWith(ctx, 4, cq.Options{Channel: ch})
	if err == nil {
		q.Close()
		t.Fatal("CQ created on a closed completion channel")
	}
	if !strings.Contains(err.Error(), "channel is closed") {
		t.Errorf("CQ on a closed channel: %v; want it to say so", err)
	}
}

func TestSharedChannel(t *testing.T) {
	ctx := rxetest.Open(t, rxetest.One(t))
	ch, err := ctx.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	// The receive CQ shares the channel with an idle CQ.
	idle, err := cq.CreateWith(ctx, 4, cq.Options{Channel: ch})
	if err != nil {
		t.Fatal(err)
	}
	l := newLoopOn(t, ctx, cq.Options{Channel: ch})
	if err := l.rqp.PostRecv(l.recvWR); err != nil {
		t.Fatal(err)
	}
	posted := make(chan error, 1)
	go func() {
		time.Sleep(20 * time.Millisecond)
		posted <- l.sqp.PostSend(l.sendWR)
	}()
	drain(t, l.rcq, l.wc)
	if err := <-posted; err != nil {
		t.Fatal(err)
	}
	// The idle CQ saw no event.
	tctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := idle.Wait(tctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("idle CQ on a shared channel woke: %v", err)
	}
	if ch.Events() == 0 {
		t.Error("the shared channel counted no event")
	}
}

// newLoopOn is newLoop on an already open context.
func newLoopOn(t *testing.T, ctx *uverbs.Context, rcqOpts cq.Options) *loop {
	t.Helper()
	l := &loop{ctx: ctx, wc: make([]cq.WC, 8)}
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if l.mem, err = mr.Alloc(1 << 16); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.mem.Close() })
	if l.m, err = mr.Register(pd, l.mem.Bytes(), mr.LocalWrite); err != nil {
		t.Fatal(err)
	}
	if l.scq, err = cq.CreateWith(ctx, 16, cq.Options{Events: true}); err != nil {
		t.Fatal(err)
	}
	if l.rcq, err = cq.CreateWith(ctx, 16, rcqOpts); err != nil {
		t.Fatal(err)
	}
	mk := func(c *cq.CQ) *qp.QP {
		q, err := qp.Create(pd, qp.Config{SendCQ: c, RecvCQ: c, MaxSendWR: 8, MaxRecvWR: 8})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	l.sqp, l.rqp = mk(l.scq), mk(l.rcq)
	g, err := ctx.DefaultGID(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.sqp.Connect(qp.Remote{QPN: l.rqp.QPN(), GID: g.GID}, qp.ConnectOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := l.rqp.Connect(qp.Remote{QPN: l.sqp.QPN(), GID: g.GID}, qp.ConnectOptions{}); err != nil {
		t.Fatal(err)
	}
	s, _ := l.m.SGE(0, 64)
	r, _ := l.m.SGE(4096, 64)
	l.sendWR = []qp.SendWR{{ID: 1, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{s}}}
	l.recvWR = []qp.RecvWR{{ID: 2, SGEs: []qp.SGE{r}}}
	return l
}

func threads(t *testing.T) int {
	n, err := procstat.Field("Threads")
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// TestManyWaitersFewThreads parks 1000 goroutines, each in Wait on its own
// CQ and channel, and counts the process's threads: parked waiters must
// not hold an OS thread each.
func TestManyWaitersFewThreads(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 200
	}
	ctx := rxetest.Open(t, rxetest.One(t))
	before := threads(t)
	cqs := make([]*cq.CQ, n)
	for i := range cqs {
		c, err := cq.CreateWith(ctx, 1, cq.Options{Events: true})
		if err != nil {
			t.Fatalf("CQ %d: %v", i, err)
		}
		cqs[i] = c
	}
	wctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, c := range cqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- c.Wait(wctx)
		}()
	}
	time.Sleep(2 * time.Second)
	during := threads(t)
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("waiter returned %v, want context.Canceled", err)
		}
	}
	t.Logf("threads: %d before, %d with %d goroutines waiting", before, during, n)
	if during-before > 20 {
		t.Errorf("%d waiters took %d more OS threads", n, during-before)
	}
	for _, c := range cqs {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWaitAllocs: a CQ with a channel of its own is woken without a reader
// goroutine in between (Wait reads the channel itself), and a round of
// Wait and Poll on it allocates nothing once Wait has seen its ctx. Every
// wake-up reads exactly one event: the channel's event count and the CQ's
// wake-ups move together. The send comes from another goroutine a moment
// after the receiver parks, so that Wait really sleeps (in one process
// rxe completes a send inside the sender's doorbell).
func TestWaitAllocs(t *testing.T) {
	l := newLoop(t, cq.Options{Events: true})
	ctx, wd := hang.For(t, "send/Wait rounds", 20*time.Second)
	defer wd.Stop()
	trigger, sent := make(chan struct{}), make(chan error)
	defer close(trigger)
	go func() {
		for range trigger {
			time.Sleep(2 * time.Millisecond) // let the receiver park
			sent <- l.sqp.PostSend(l.sendWR)
		}
	}()
	var ferr error
	wait := func(c *cq.CQ) bool {
		for {
			n, err := c.Poll(l.wc)
			if err == nil && n > 0 {
				err = l.wc[0].Err()
			}
			if err != nil {
				ferr = err
				return false
			}
			if n > 0 {
				return true
			}
			if err := c.Wait(ctx); err != nil {
				ferr = hang.Cause(ctx, err)
				return false
			}
		}
	}
	round := func() {
		if ferr != nil {
			return
		}
		if err := l.rqp.PostRecv(l.recvWR); err != nil {
			ferr = err
			return
		}
		trigger <- struct{}{}
		if !wait(l.rcq) {
			return
		}
		if err := <-sent; err != nil {
			ferr = err
			return
		}
		if wait(l.scq) {
			wd.Progress()
		}
	}
	for range 10 {
		round()
	}
	if a := testing.AllocsPerRun(50, round); a != 0 {
		t.Errorf("%v allocations per Wait/Poll round", a)
	}
	if ferr != nil {
		t.Fatal(ferr)
	}
	// No goroutine reads the channels: each Wait reads its own.
	var stacks strings.Builder
	pprof.Lookup("goroutine").WriteTo(&stacks, 1)
	if strings.Contains(stacks.String(), "CompChannel).read") {
		t.Errorf("a channel reader goroutine runs for CQs with a channel of their own:\n%s", stacks.String())
	}
	st := l.rcq.Stats()
	t.Logf("receiver CQ: %+v", st)
	if st.Wakeups < 30 || st.ChannelEvents != st.Wakeups {
		t.Errorf("stats %+v after 60 rounds: want most rounds woken by an event, each wake-up from one channel event", st)
	}
}

// TestCloseEndsWait: a Wait parked on a CQ ends with ErrClosed when the
// CQ closes, on its own channel and on one it shares with another CQ (the
// shared channel goes on serving the other, so its closing could not end
// the wait; before, the Wait waited for its context).
func TestCloseEndsWait(t *testing.T) {
	dev := rxetest.One(t)
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	c, err := uverbs.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, err := c.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	other, err := cq.CreateWith(c, 16, cq.Options{Channel: ch})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for _, o := range []cq.Options{{Channel: ch}, {Events: true}} {
		q, err := cq.CreateWith(c, 16, o)
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- q.Wait(ctx) }()
		for parkedWaits() < 1 {
			select {
			case err := <-errc:
				t.Fatalf("Wait returned before the close: %v", err)
			default:
			}
			if ctx.Err() != nil {
				t.Fatalf("the Wait never parked: %v", hang.Err(ctx))
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errc:
			if !errors.Is(err, cq.ErrClosed) {
				t.Errorf("%+v: Wait when its CQ closed: %v, want ErrClosed", o, err)
			}
		case <-ctx.Done():
			t.Fatalf("%+v: a Wait did not end with its CQ's Close: %v", o, hang.Err(ctx))
		}
		wd.Progress()
	}
}
