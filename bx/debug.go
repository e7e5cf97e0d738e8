package bx

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// endpoints holds every open Endpoint of the process, for DumpState.
var endpoints sync.Map // *Endpoint -> struct{}

// DumpState writes the flow-control state of every open endpoint of the
// process to w: per peer, its credits and returner, and per lane the
// sequence numbers, unacknowledged messages, pending receives and send
// window; per endpoint, waiting calls, live messages and workers. It is
// for diagnosing a stall (the hang watchdog of the tests calls it): it
// takes each lock briefly and may see a state in motion. It never blocks
// on bx's own locks (the endpoint's, its grants', a peer's, a lane's send
// and receive locks): one still held after lockWait is what the stall may
// be, and the dump says so in that lock's place and goes on. The flow
// package's locks, which are never held across a wait, it takes as it
// finds them (the credits', the returner's, a lane's window).
func DumpState(w io.Writer) {
	if w == nil {
		return
	}
	endpoints.Range(func(k, _ any) bool {
		k.(*Endpoint).dumpState(w)
		return true
	})
}

// lockWait is how long DumpState tries a lock before it reports the lock
// held and skips what it guards.
const lockWait = 200 * time.Millisecond

// tryFor takes a lock with try (a TryLock), retrying until lockWait.
func tryFor(try func() bool) bool {
	end := time.Now().Add(lockWait)
	for !try() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

func (e *Endpoint) dumpState(w io.Writer) {
	fmt.Fprintf(w, "bx endpoint %x on %s: waiting calls %d, caller polls %v, live msgs %d, user buffers %d, workers %d (backlog %d, overflow %d), ticks %d, cq %+v empty %v, kick %d\n",
		e.id, e.cfg.Device, e.waiting.Load(), e.callerPolls.Load(), e.liveMsgs.Load(), e.userBufs.Load(),
		e.workers.Load(), len(e.backlog), e.overN.Load(), e.ticks.Load(), e.cq.Stats(), e.cq.Empty(), len(e.kick))
	if tryFor(e.grants.mu.TryLock) {
		fmt.Fprintf(w, "  rendezvous windows: %d allocated (%d of them lane fences), %d free; %d target regions\n", len(e.grants.all), e.grants.fences, len(e.grants.free), len(e.grants.mrs))
		e.grants.mu.Unlock()
	} else {
		fmt.Fprintf(w, "  rendezvous windows: their lock (grants.mu) held for %v\n", lockWait)
	}
	if !tryFor(e.mu.TryRLock) {
		fmt.Fprintf(w, "  peers: the endpoint's lock (mu) held for %v\n", lockWait)
		return
	}
	// The peers are read under the lock just tried: taking it again
	// (peerList) could wait behind a writer.
	peers := e.appendPeersLocked(nil)
	e.mu.RUnlock()
	for _, p := range peers {
		fmt.Fprintf(w, "  peer %x state %d\n    credits (we send): %v\n    returner (peer sends): %v\n",
			p.id, p.state.Load(), p.credits, p.ret)
		if tryFor(p.mu.TryLock) {
			calls := len(p.calls) + p.slotsWaiting()
			err := p.err
			p.mu.Unlock()
			fmt.Fprintf(w, "    err %v; calls waiting for a response: %d\n", err, calls)
		} else {
			fmt.Fprintf(w, "    the peer's lock (mu) held for %v\n", lockWait)
		}
		for _, l := range p.lanes {
			var next uint64
			var outs int
			var live bool
			fmt.Fprintf(w, "    lane %d", l.idx)
			if tryFor(l.mu.TryLock) {
				next, outs, live = l.nextSeq, len(l.outs), l.live
				l.mu.Unlock()
				fmt.Fprintf(w, " live %v: next seq %d, unacked %d", live, next, outs)
			} else {
				fmt.Fprintf(w, ": its send lock (mu) held for %v", lockWait)
			}
			fmt.Fprintf(w, " (acked %d)", l.acked.Load())
			if tryFor(l.rmu.TryLock) {
				delivered, pending := l.delivered, len(l.pending)
				l.rmu.Unlock()
				fmt.Fprintf(w, ", delivered %d, pending %d", delivered, pending)
			} else {
				fmt.Fprintf(w, ", its receive lock (rmu) held for %v", lockWait)
			}
			msgs, bytes := l.win.Outstanding()
			fmt.Fprintf(w, " (ack sent %d), window %d msgs %d bytes, %+v\n", l.ackSent.Load(), msgs, bytes, l.win.Stats())
		}
	}
}
