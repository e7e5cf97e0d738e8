package bx

import (
	"fmt"
	"io"
	"sync"
)

// endpoints holds every open Endpoint of the process, for DumpState.
var endpoints sync.Map // *Endpoint -> struct{}

// DumpState writes the flow-control state of every open endpoint of the
// process to w: per peer, its credits and returner, and per lane the
// sequence numbers, unacknowledged messages, pending receives and send
// window; per endpoint, waiting calls, live messages and workers. It is
// for diagnosing a stall (the hang watchdog of the tests calls it): it
// takes each lock briefly and may see a state in motion.
func DumpState(w io.Writer) {
	if w == nil {
		return
	}
	endpoints.Range(func(k, _ any) bool {
		k.(*Endpoint).dumpState(w)
		return true
	})
}

func (e *Endpoint) dumpState(w io.Writer) {
	fmt.Fprintf(w, "bx endpoint %x on %s: waiting calls %d, caller polls %v, live msgs %d, user buffers %d, workers %d (backlog %d), ticks %d, cq %+v empty %v, kick %d\n",
		e.id, e.cfg.Device, e.waiting.Load(), e.callerPolls.Load(), e.liveMsgs.Load(), e.userBufs.Load(),
		e.workers.Load(), len(e.backlog), e.ticks.Load(), e.cq.Stats(), e.cq.Empty(), len(e.kick))
	e.grants.mu.Lock()
	fmt.Fprintf(w, "  rendezvous windows: %d allocated (%d of them lane fences), %d free; %d target regions\n", len(e.grants.all), e.grants.fences, len(e.grants.free), len(e.grants.mrs))
	e.grants.mu.Unlock()
	for _, p := range e.peerList() {
		fmt.Fprintf(w, "  peer %x state %d err %v\n    credits (we send): %v\n    returner (peer sends): %v\n",
			p.id, p.state.Load(), p.Err(), p.credits, p.ret)
		p.mu.Lock()
		calls := len(p.calls) + p.slotsWaiting()
		p.mu.Unlock()
		fmt.Fprintf(w, "    calls waiting for a response: %d\n", calls)
		for _, l := range p.lanes {
			l.mu.Lock()
			next, outs, live := l.nextSeq, len(l.outs), l.live
			l.mu.Unlock()
			l.rmu.Lock()
			delivered, pending := l.delivered, len(l.pending)
			l.rmu.Unlock()
			msgs, bytes := l.win.Outstanding()
			fmt.Fprintf(w, "    lane %d live %v: next seq %d, unacked %d (acked %d), delivered %d (ack sent %d), pending %d, window %d msgs %d bytes, %+v\n",
				l.idx, live, next, outs, l.acked.Load(), delivered, l.ackSent.Load(), pending, msgs, bytes, l.win.Stats())
		}
	}
}
