package bx

import (
	"fmt"
	"time"
)

// Recovery, when a QP fails (the peer's QP went to error, retries ran out,
// someone forced it to ERR): the TCP control connection is still there, so
// the dialer side rebuilds every lane of the peer over it. Each side tells
// the other, per lane, the next sequence number it expects; the sender
// drops what that acknowledges and resends the rest on the new QP; the
// receiver delivers by sequence, so a resent message it already has is
// dropped, not delivered twice. Credits restart in a new epoch from the
// receive buffers the peer may use. Calls in flight wait, bounded by their
// contexts, and complete exactly once; a peer that stays unreachable for
// Config.PeerTimeout is declared gone.

func (p *Peer) startRecovery(cause error) {
	p.mu.Lock()
	if p.state.Load() != stateActive {
		p.mu.Unlock()
		return
	}
	p.state.Store(stateRecovering)
	p.recovered = make(chan struct{})
	p.recCause = cause
	p.mu.Unlock()
	p.e.stats.Recoveries.Add(1)
	go p.recover()
}

// recover runs on both sides: the dialer drives, the acceptor answers
// (acceptRecovery); an acceptor that noticed the failure first asks the
// dialer with an empty recovery request.
func (p *Peer) recover() {
	deadline := time.Now().Add(p.e.cfg.PeerTimeout)
	if !p.dialer {
		// Ask the dialer to rebuild; it answers with its new lanes.
		p.writeCtl(ctlRecover, (&setup{ID: p.e.id, Lanes: []laneInfo{{}}}).encode())
		select {
		case <-p.recDone:
		case <-p.down:
		case <-time.After(time.Until(deadline)):
			p.shutdown(fmt.Errorf("%w: no recovery within %v (%v)", ErrPeerGone, p.e.cfg.PeerTimeout, p.recCause), true)
		}
		return
	}
	if err := p.rebuild(); err != nil {
		p.shutdown(fmt.Errorf("%w: recovery: %v", ErrPeerGone, err), true)
		return
	}
	local, err := p.resyncSetup(p.ret.Epoch() + 1)
	if err == nil {
		err = p.writeCtl(ctlRecover, local.encode())
	}
	if err != nil {
		p.shutdown(fmt.Errorf("%w: recovery: %v", ErrPeerGone, err), false)
		return
	}
	var remote setup
	select {
	case remote = <-p.recAck:
	case <-p.down:
		return
	case <-time.After(time.Until(deadline)):
		p.shutdown(fmt.Errorf("%w: no recovery answer within %v (%v)", ErrPeerGone, p.e.cfg.PeerTimeout, p.recCause), true)
		return
	}
	if err := p.finishConnect(local, remote); err != nil {
		p.shutdown(fmt.Errorf("%w: recovery: %v", ErrPeerGone, err), true)
		return
	}
	if err := p.writeCtl(ctlPing, nil); err != nil {
		p.shutdown(fmt.Errorf("%w: recovery: %v", ErrPeerGone, err), false)
		return
	}
	if err := p.finishResend(remote); err != nil {
		p.shutdown(fmt.Errorf("%w: recovery: %v", ErrPeerGone, err), true)
	}
}

// resyncSetup moves our receive side to epoch and describes our new lanes.
func (p *Peer) resyncSetup(epoch uint32) (setup, error) {
	granted, consumed, err := p.ret.Resync(epoch)
	if err != nil {
		return setup{}, err
	}
	s := p.localSetup(epoch)
	s.Grant, s.Consumed = granted, consumed
	return s, nil
}

// acceptRecovery is the acceptor's side: rebuild, connect to the dialer's
// new lanes, answer with ours.
func (p *Peer) acceptRecovery(remote setup) {
	if p.dialer {
		// The acceptor asks us to recover.
		p.startRecovery(fmt.Errorf("peer reported a QP failure"))
		return
	}
	p.mu.Lock()
	if p.state.Load() == stateActive {
		p.state.Store(stateRecovering)
		p.recovered = make(chan struct{})
		p.e.stats.Recoveries.Add(1)
	}
	p.mu.Unlock()
	fail := func(err error) { p.shutdown(fmt.Errorf("%w: recovery: %v", ErrPeerGone, err), true) }
	if err := p.rebuild(); err != nil {
		fail(err)
		return
	}
	local, err := p.resyncSetup(remote.Epoch)
	if err != nil {
		fail(err)
		return
	}
	if err := p.finishConnect(local, remote); err != nil {
		fail(err)
		return
	}
	if err := p.writeCtl(ctlRecAck, local.encode()); err != nil {
		fail(err)
		return
	}
	// The dialer connects its new lanes, then says so: only then can our
	// resends reach a QP that takes them.
	if m, err := readCtl(p.ctl, p.e.cfg.PeerTimeout); err != nil || m.Type != ctlPing {
		fail(fmt.Errorf("dialer did not confirm its new lanes: %v", err))
		return
	}
	if err := p.finishResend(remote); err != nil {
		fail(err)
		return
	}
	select {
	case p.recDone <- struct{}{}:
	default:
	}
}

// rebuild replaces every lane's QP with a new one in RESET. Unacknowledged
// messages stay queued on the lane.
func (p *Peer) rebuild() error {
	e := p.e
	for _, l := range p.lanes {
		l.mu.Lock()
		old := l.qp
		e.mu.Lock()
		delete(e.byQPN, old.QPN())
		e.mu.Unlock()
		old.Close()
		q, err := newLaneQP(e)
		if err != nil {
			l.mu.Unlock()
			return err
		}
		l.qp = q
		l.rmu.Lock()
		// Messages waiting behind a rendezvous read lost with the old QP
		// are dropped: the peer resends them (they are unacknowledged).
		for _, in := range l.pending {
			if in.msg.large {
				e.large.Free(in.msg.buf)
			} else {
				e.repost(in.msg.buf)
				p.ret.Released(1)
			}
		}
		l.pending = nil
		l.rmu.Unlock()
		e.mu.Lock()
		e.byQPN[q.QPN()] = l
		e.mu.Unlock()
		l.mu.Unlock()
	}
	return nil
}

// finishConnect connects the new lanes and applies the peer's view of our
// credits in the new epoch.
func (p *Peer) finishConnect(local, remote setup) error {
	if err := p.connectLanes(local, remote); err != nil {
		return err
	}
	if err := p.credits.Resync(remote.Epoch, remote.Grant, remote.Consumed); err != nil {
		return err
	}
	for i, l := range p.lanes {
		if next := remote.Lanes[i].Next; next > 0 {
			p.ack(l, next-1)
		}
	}
	return nil
}

// finishResend resends what the peer does not have, then lets senders in.
func (p *Peer) finishResend(remote setup) error {
	for _, l := range p.lanes {
		l.mu.Lock()
		for _, o := range l.outs {
			var h header
			if err := h.decode(o.buf.Bytes()[:o.buf.Len()]); err != nil {
				continue
			}
			// A resend needs a credit like any message; the peer's
			// buffers were just re-granted in full but for what it holds.
			if !p.credits.TryAcquire(1) {
				l.mu.Unlock()
				return fmt.Errorf("no credit to resend lane %d sequence %d", l.idx, o.seq)
			}
			if err := p.post(l, h, o.buf); err != nil {
				l.mu.Unlock()
				return err
			}
		}
		l.mu.Unlock()
	}
	p.mu.Lock()
	p.state.Store(stateActive)
	close(p.recovered)
	p.mu.Unlock()
	return nil
}
