package bx_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
)

// TestCallAllocs checks that a Call allocates nothing in steady state, on
// either end (both endpoints are in this process): request and response
// buffers, call slots, work requests and messages are all reused or carved
// from slabs. Both an inline handler and the worker pool are covered.
func TestCallAllocs(t *testing.T) {
	srv, _, p, _ := pair(t, nil)
	echo := func(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) { return req.Data(), nil }
	srv.HandleInline(1, echo)
	srv.Handle(2, echo)
	ctx, wd := hang.For(t, "calls", 2*time.Minute) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	for _, stream := range []uint32{1, 2} {
		for _, n := range []int{64, 4 << 10} {
			t.Run(fmt.Sprintf("stream%d/%d", stream, n), func(t *testing.T) {
				req := make([]byte, n)
				var err error
				call := func() {
					m, cerr := p.Call(ctx, stream, req)
					if cerr != nil {
						err = hang.Cause(ctx, cerr)
						return
					}
					m.Release()
					wd.Progress()
				}
				for range 200 {
					call()
				}
				a := testing.AllocsPerRun(300, call)
				if err != nil {
					t.Fatal(err)
				}
				if a != 0 {
					t.Errorf("%v allocations per call", a)
				}
			})
		}
	}
}
