package bx_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
)

// TestEchoBufferOrder checks that a response is built before its request's
// buffer goes back to the shared receive queue. The handler echoes its
// request (the response aliases the receive buffer); with a handful of
// buffers and other traffic keeping them cycling, a buffer released too
// early is refilled by the device while the response is copied out of it.
// The hook widens that window: once the request is released it waits until
// every receive buffer has been refilled (or a while), then the response
// goes out and must still be the request.
//
// Both kinds of handler run: a worker's (Handle) and an inline one
// (HandleInline), whose response goes out from the polling goroutine
// while the hook holds it, so that only the ticker's credit update lets
// the client refill the released buffer; event-driven, a released buffer
// goes back to the receive queue at once (polling, between polls:
// releaseRecv). Two sizes: 4 KiB, and 64 B, posted inline.
func TestEchoBufferOrder(t *testing.T) {
	for _, size := range []int{4 << 10, 64} {
		for _, inline := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d/inline=%v", size, inline), func(t *testing.T) { echoBufferOrder(t, size, inline) })
		}
	}
}

func echoBufferOrder(t *testing.T, size int, inline bool) {
	const credits = 4
	// Inline, the hook holds the polling goroutine: nothing but the
	// ticker's update moves, and most waits run to the deadline.
	var spin time.Duration
	calls, hold := 50, 200*time.Millisecond
	if inline {
		spin, calls, hold = -1, 10, 50*time.Millisecond
	}
	srv, _, p, sp := pair(t, func(c *bx.Config) { c.MaxPeers, c.Credits, c.Spin = 1, credits, spin })
	echo := func(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		return req.Data(), nil
	}
	if inline {
		srv.HandleInline(1, echo)
	} else {
		srv.Handle(1, echo)
	}
	var noiseIn atomic.Int64
	bx.OnServeReleaseForTest(func() {
		start := noiseIn.Load()
		for deadline := time.Now().Add(hold); noiseIn.Load() < start+2*credits && time.Now().Before(deadline); {
			time.Sleep(100 * time.Microsecond)
		}
	})
	defer bx.OnServeReleaseForTest(nil)
	ctx, wd := hang.For(t, "", 3*time.Minute) // a hang bound (no progress), not a speed bound
	const callers = 4
	var wg sync.WaitGroup
	stop := make(chan struct{})
	// Other traffic: a stream the server drains and releases at once.
	noise := bytes.Repeat([]byte{0xee}, size)
	var noiseWG sync.WaitGroup
	for range 2 {
		noiseWG.Add(1)
		go func() {
			defer noiseWG.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := p.Stream(2).Send(ctx, noise); err != nil {
					return
				}
			}
		}()
	}
	noiseWG.Add(1)
	go func() {
		defer noiseWG.Done()
		for {
			m, err := sp.Stream(2).Recv(ctx)
			if err != nil {
				return
			}
			noiseIn.Add(1)
			m.Release()
		}
	}()
	errs := make(chan error, callers)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := make([]byte, size)
			for i := range calls {
				for k := 0; k < size; k += 8 {
					binary.LittleEndian.PutUint64(req[k:], uint64(g)<<48|uint64(i)<<24|uint64(k))
				}
				m, err := p.Call(ctx, 1, req)
				if err != nil {
					errs <- fmt.Errorf("caller %d call %d: %w", g, i, hang.Cause(ctx, err))
					return
				}
				ok := bytes.Equal(m.Data(), req)
				m.Release()
				wd.Progress()
				if !ok {
					errs <- fmt.Errorf("caller %d call %d: the echo differs from the request", g, i)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	reportErrs(t, errs)
	wd.Stop() // ends the noise goroutines
	noiseWG.Wait()
}

// TestPendingHoldsNoCredit: messages that arrive behind a rendezvous still
// waiting for its FIN do not keep their receive buffers. With few credits
// and both sides sending rendezvous and eager messages on one stream,
// held buffers used every credit the FIN needed: each side waited for the
// other's FIN for good (every run hung before the fix). Now they are
// copied out and their buffers go back; every message arrives, in order
// and intact, on both sides.
func TestPendingHoldsNoCredit(t *testing.T) {
	t.Run("region", func(t *testing.T) { pendingHoldsNoCredit(t, func(c *bx.Config) { shared(c); c.Credits = 6 }) })
	t.Run("windows", func(t *testing.T) { pendingHoldsNoCredit(t, func(c *bx.Config) { windowsOn(c); c.Credits = 6 }) })
}

func pendingHoldsNoCredit(t *testing.T, mod func(*bx.Config)) {
	srv, cli, p, sp := pair(t, mod)
	const n = 240
	ctx, wd := hang.For(t, "", 2*time.Minute) // a hang bound (no progress), not a speed bound
	payload := func(i int) []byte { return mixedPayload(i, 16, 20_000+97*i) }
	errc := make(chan error, 4)
	crossStreams(ctx, wd, p, sp, n, payload, errc)
	for range 4 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("copied out behind a rendezvous: %d (client), %d (server)", cli.Stats().Copied.Load(), srv.Stats().Copied.Load())
}
