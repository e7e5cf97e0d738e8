package bx_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/flow"
	"github.com/goverbs/goverbs/internal/hang"
)

// TestDeferredRepost checks the receive buffers a Release leaves to the
// poller (Stats.Deferred): with 4 credits, 3 of them for data (one is the
// control reserve), every message the client sends needs one of them
// re-posted and its credit returned, so a buffer the poller never posted,
// or a credit never counted, stops the client's Send for good (the
// watchdog ends the test). First 200 messages the server releases at once
// while it polls; then 3 it holds until its progress goroutine has gone
// to sleep, while the client waits in its next Send: released then, they
// must still come back.
func TestDeferredRepost(t *testing.T) {
	defer bx.ForcePollForTest(bx.ForcePollForTest(true))
	const credits = 4
	const data = credits - flow.ControlReserve
	srv, _, p, sp := pair(t, func(c *bx.Config) { c.MaxPeers, c.Credits = 1, credits })
	ctx, wd := hang.For(t, "messages", time.Minute) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	msg := func(i int) []byte {
		b := bytes.Repeat([]byte{byte(i)}, 64)
		binary.LittleEndian.PutUint32(b, uint32(i))
		return b
	}
	recv := func(i int) *bx.Msg {
		t.Helper()
		m, err := sp.Stream(3).Recv(ctx)
		if err != nil {
			t.Fatalf("message %d: %v", i, hang.Cause(ctx, err))
		}
		if !bytes.Equal(m.Data(), msg(i)) {
			t.Fatalf("message %d: got % x", i, m.Data()[:8])
		}
		wd.Progress()
		return m
	}
	const n = 200
	sendErr := make(chan error, 1)
	go func() {
		for i := range n + data + 1 {
			if err := p.Stream(3).Send(ctx, msg(i)); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- nil
	}()
	for i := range n {
		recv(i).Release()
	}
	if d := srv.Snapshot().Counters.Deferred; d == 0 {
		t.Errorf("the polling server deferred none of %d releases", n)
	}
	held := make([]*bx.Msg, data)
	for i := range held {
		held[i] = recv(n + i)
	}
	// The client's last Send waits for a credit; the server's progress
	// goroutine stops polling after its spin window.
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-sendErr:
		t.Fatalf("the client sent past its %d data credits (err %v)", data, err)
	default:
	}
	for _, m := range held {
		m.Release()
	}
	recv(n + data).Release()
	if err := <-sendErr; err != nil {
		t.Fatal(hang.Cause(ctx, err))
	}
}

// TestDeferredAck checks the acknowledgements a response carries, which
// the client applies only before its next poll (or when a lane's window
// is full): with a window of 2 messages and one lane, 300 calls need each
// request freed, and once they are done and nothing else moves, the
// client's window must empty (what the last response acknowledged is
// freed by the poller, not left for a next call that never comes).
func TestDeferredAck(t *testing.T) {
	defer bx.ForcePollForTest(bx.ForcePollForTest(true))
	srv, cli, p, _ := pair(t, func(c *bx.Config) { c.Lanes, c.LaneMsgs = 1, 2 })
	srv.HandleInline(1, func(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) { return req.Data(), nil })
	ctx, wd := hang.For(t, "calls", time.Minute) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	for i := range 300 {
		req := []byte(fmt.Sprintf("call %d", i))
		m, err := p.Call(ctx, 1, req)
		if err != nil {
			t.Fatalf("call %d: %v", i, hang.Cause(ctx, err))
		}
		if !bytes.Equal(m.Data(), req) {
			t.Fatalf("call %d: response %q", i, m.Data())
		}
		m.Release()
		wd.Progress()
	}
	for {
		ps := cli.Snapshot().Peers
		if len(ps) != 1 {
			t.Fatalf("client has %d peers", len(ps))
		}
		if ps[0].Window.InFlightMsgs == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the client's window still holds %d messages: %v", ps[0].Window.InFlightMsgs, hang.Cause(ctx, ctx.Err()))
		case <-time.After(time.Millisecond):
		}
	}
}
