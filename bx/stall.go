package bx

import (
	"errors"
	"fmt"
	"time"

	"github.com/goverbs/goverbs/qp"
)

// Stalls: a lane's QP that stops sending without an error. RC promises
// that a send either completes or fails (retries exhausted, the QP in
// ERR), and recovery starts on the failure; a QP that neither completes nor
// fails leaves calls waiting for their contexts and the peer alive for
// good: a silent failure. rxe on Linux 6.1 has such a state: when the
// local network stack refuses a packet (the netdev under the device is
// down), the requester rolls the work request back, marks itself as
// waiting for its in-flight packets to drain and stops; the wake-up can
// be lost (a race the kernel later removed with the whole mechanism), and
// a work request that was never sent arms no retransmission timer. The
// chaos suite's link-down scenario failed in CI with that picture: 3 s of
// link down, then 120 s of calls timing out with no QP error, no
// recovery, no retry_exceeded on either device.
//
// So bx watches: every StallTimeout/4 it looks at each lane of each
// active peer. A lane that posted anything since its last probe gets a
// new one: a zero-length RDMA WRITE, signaled. It needs no memory at the
// peer (a zero-length operation checks no rkey, IBTA C9-88) and consumes
// no receive; RC completes work requests in order, so its completion says
// everything posted ahead of it completed: the QP moves, and whatever a
// message still waits for is the peer's (a slow handler, memory for a
// rendezvous, credits). A probe still not complete StallTimeout after it
// was posted, with no other send of the lane completing meanwhile (a deep
// queue draining through retransmissions is slow, not stalled), says the
// QP does not move: the lane is failed as after a QP error, and recovery
// rebuilds the peer's lanes and resends what was not acknowledged. Probing after every post, not only while messages wait
// for their acknowledgement, also covers a lane that carries only
// acknowledgements and credit updates: stalled, it would leave the peer's
// messages waiting on a QP that moves, where the peer's probes see nothing.
//
// Cost: one timer wake-up per StallTimeout/4 per endpoint, and while a
// lane sends, one probe (a doorbell and a packet each way) per look.

// defaultStallTimeout is Config.StallTimeout's default: over 5 times
// what a lost packet costs the default RC retry setup of a lane (7 tries
// of about 67 ms, 0.5 s), and short enough that recovery ends within
// PeerTimeout.
const defaultStallTimeout = 4 * time.Second

// errStalled is the cause of a recovery that the watchdog started.
var errStalled = errors.New("stalled")

// stallWatch is the watchdog's state of one lane, under its mu.
type stallWatch struct {
	q       *qp.QP    // the QP it is about: a new one starts afresh
	covered uint64    // lane.posts when the last probe was posted
	probe   uint64    // the probe outstanding on q; 0: none
	at      time.Time // when it was posted, or the last look that saw a send complete since
	done    uint64    // lane.sendsDone at that time
	n       uint64    // the last probe number taken (never reused: probed compares)
}

// watchStalls looks at every lane every StallTimeout/4.
func (e *Endpoint) watchStalls() {
	defer e.wg.Done()
	every := max(e.cfg.StallTimeout/4, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	var peers []*Peer
	for {
		select {
		case <-e.stopCh.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		peers = e.appendPeers(peers)
		for _, p := range peers {
			p.checkStalls(now)
		}
		clear(peers)
	}
}

// checkStalls looks at p's lanes; a stalled one starts recovery.
func (p *Peer) checkStalls(now time.Time) {
	if p.state.Load() != stateActive {
		return
	}
	for _, l := range p.lanes {
		if l == nil {
			continue
		}
		err := l.checkStall(now, p.e.cfg.StallTimeout)
		if err != nil {
			p.e.stats.Stalls.Add(1)
			p.laneFailed(l, err)
			return // recovery rebuilds every lane
		}
	}
}

// checkStall is one look at l: it reports a stall when the probe
// outstanding is older than limit, and posts a probe when the lane
// posted anything since the last one.
func (l *lane) checkStall(now time.Time, limit time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := &l.watch
	if !l.live || l.qp == nil {
		w.q, w.probe = nil, 0
		return nil
	}
	if w.q != l.qp {
		// A new QP: what it posted is not covered yet.
		w.q, w.probe, w.covered = l.qp, 0, l.posts-1
	}
	if w.probe != 0 {
		if l.probed.Load() < w.probe {
			if d := l.sendsDone.Load(); d != w.done {
				// Slow (a deep queue, retransmissions) but moving.
				w.at, w.done = now, d
				return nil
			}
			if d := now.Sub(w.at); d >= limit {
				return fmt.Errorf("bx: lane %d %w: a probe posted %v ago is not complete, %d messages unacknowledged (the QP reports no error)",
					l.idx, errStalled, d.Round(time.Millisecond), len(l.outs))
			}
			return nil
		}
		w.probe = 0 // everything ahead of it completed: the QP moves
	}
	if l.posts == w.covered {
		return nil
	}
	w.n++
	if err := l.postProbe(w.n); err != nil {
		return fmt.Errorf("bx: lane %d: posting a probe: %w", l.idx, err)
	}
	w.probe, w.at, w.covered, w.done = w.n, now, l.posts, l.sendsDone.Load()
	l.peer.e.stats.Probes.Add(1)
	return nil
}

// postProbe posts probe n on l's QP: a signaled zero-length RDMA WRITE,
// complete only once everything posted ahead of it is. l.mu is held.
func (l *lane) postProbe(n uint64) error {
	l.swr[0] = qp.SendWR{ID: tagProbe | n, Opcode: qp.OpRDMAWrite, Flags: qp.Signaled}
	return l.qp.PostSend(l.swr[:1])
}
