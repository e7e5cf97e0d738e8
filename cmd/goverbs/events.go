package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/uverbs"
)

// newPingpongCQ makes the CQ of a ping-pong: with events (-e) it gets a
// completion channel of its own, as ibv_create_cq(..., channel, 0) does in
// the rdma-core examples.
func newPingpongCQ(ctx *uverbs.Context, cqe int, events bool) (*cq.CQ, error) {
	if events {
		return cq.CreateWith(ctx, cqe, cq.Options{Events: true})
	}
	return cq.Create(ctx, cqe)
}

// cqPoller is the completion side of the ping-pong loops. Without -e, poll
// busy-polls: it returns what one Poll found, possibly nothing, and the
// loop calls again. With -e it sleeps on the CQ's completion channel when
// the queue is empty, the ibv_req_notify_cq / ibv_get_cq_event pattern of
// the rdma-core examples: cq.Wait arms the CQ, looks at the queue once more
// (so a completion that raced with the arm is not slept through) and parks
// the goroutine in the netpoller until the event.
//
// Nothing here allocates: the context is context.Background(), made once,
// and there are no timers; a hung peer is the user's (or the test's
// deadline's) business, as in C.
type cqPoller struct {
	cq     *cq.CQ
	events bool
	ctx    context.Context
	sleeps int // Waits that slept or returned without a completion
}

func newCQPoller(c *cq.CQ, events bool) *cqPoller {
	return &cqPoller{cq: c, events: events, ctx: context.Background()}
}

// poll moves up to len(wc) completions into wc. With events it returns only
// once there is at least one. The busy loop of rc-pingpong (pingLoop) does
// poll's first step itself, a call less per poll (scripts/bench-instr's rp
// variant), and goes to pollWait for the rest.
func (p *cqPoller) poll(wc []cq.WC) (int, error) {
	n, err := p.cq.Poll(wc)
	if err == nil && (n > 0 || !p.events) {
		return n, nil
	}
	return p.pollWait(wc, err)
}

// pollWait is poll past a failed poll (err) or, with events, an empty one.
func (p *cqPoller) pollWait(wc []cq.WC, err error) (int, error) {
	for {
		if err != nil {
			return 0, fmt.Errorf("poll CQ failed: %v", err)
		}
		if err := p.cq.Wait(p.ctx); err != nil {
			return 0, fmt.Errorf("failed to get cq_event: %v", err)
		}
		p.sleeps++
		var n int
		if n, err = p.cq.Poll(wc); err == nil && n > 0 {
			return n, nil
		}
	}
}

// pingpongDebugEnv, set to 1, makes the ping-pongs report on stderr how many
// heap allocations their timed loop made (the tests want 0) and, with -e,
// how often the CQ was armed and how many events woke the loop. The
// summary on stdout stays as rdma-core prints it.
const pingpongDebugEnv = "GOVERBS_PINGPONG_DEBUG"

// timeLoop runs and times a ping-pong's main loop.
func timeLoop(stderr io.Writer, cmd string, p *cqPoller, loop func() error) (time.Duration, error) {
	debug := os.Getenv(pingpongDebugEnv) == "1"
	var m0, m1 runtime.MemStats
	if debug {
		runtime.ReadMemStats(&m0)
	}
	start := time.Now()
	err := loop()
	elapsed := time.Since(start)
	if debug {
		runtime.ReadMemStats(&m1)
		fmt.Fprintf(stderr, "goverbs %s: loop: %d heap allocations\n", cmd, m1.Mallocs-m0.Mallocs)
		if p.events {
			s := p.cq.Stats()
			fmt.Fprintf(stderr, "goverbs %s: -e: %d CQ arms, %d event wakeups, %d sleeps\n", cmd, s.Arms, s.Wakeups, p.sleeps)
			fmt.Fprintf(stderr, "goverbs %s: -e: %d completion events read from the channel\n", cmd, s.ChannelEvents)
		}
	}
	return elapsed, err
}
