package bx

import (
	"errors"
	"fmt"
	"sync/atomic"
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
	// The failed QPs are the current epoch's: taken now, since by the time
	// the goroutine asks, the control goroutine may have begun the
	// dialer's round and moved the epoch on (recover).
	failed := p.ret.Epoch()
	done := p.recovered
	p.mu.Unlock()
	p.e.stats.Recoveries.Add(1)
	if f := recoveryHook.Load(); f != nil {
		(*f)(p, cause)
	}
	go p.recover(failed, done)
}

// recover runs on both sides: the dialer drives, the acceptor answers
// (acceptRecovery); an acceptor that noticed the failure first asks the
// dialer with an empty recovery request. A round whose new QPs fail before
// it is done (the link flapped again, a QP was forced to ERR) is followed
// by another, in a new epoch, until Config.PeerTimeout. failed is the
// epoch whose QPs failed; done is the recovery's recovered channel, which
// an acceptor waits for.
func (p *Peer) recover(failed uint32, done chan struct{}) {
	deadline := time.Now().Add(p.e.cfg.PeerTimeout)
	if !p.dialer {
		// Ask the dialer to rebuild; it answers with its new lanes.
		// The request names the credit epoch whose QPs failed: the
		// dialer ignores it if it recovered past that epoch already (its
		// own recovery crossed our request on the wire). Not the epoch
		// now: the dialer's round may have crossed our failure and moved
		// it on already, and an ask naming the dialer's round would make
		// it abandon that round, whose connects we then wait for, deaf
		// on the control goroutine, for PeerTimeout/2 (a recovery of
		// TestCMRecoveryMidRendezvous took 5.5 s so, and in CI ran out of
		// PeerTimeout).
		if f := askHook.Load(); f != nil {
			(*f)(p)
		}
		p.writeCtl(ctlRecover, (&setup{ID: p.e.id, Epoch: failed, Lanes: []laneInfo{{}}}).encode())
		// Closed when the recovery ends (setActive): every wait of the
		// acceptor's for it ends with it. An acceptor whose own round
		// failed waits a second time (acceptRecovery), and a signal of one
		// token for the round that succeeded left one of the two waiting,
		// to declare the recovered peer gone at its deadline
		// (TestAcceptorRetryKeepsPeer).
		select {
		case <-done:
		case <-p.down:
		case <-time.After(time.Until(deadline)):
			select {
			case <-done:
			default:
				p.shutdown(fmt.Errorf("%w: no recovery within %v (%v)", ErrPeerGone, p.e.cfg.PeerTimeout, p.recCause), true)
			}
		}
		return
	}
	for {
		err := p.dialerRound(deadline)
		if err == nil {
			// An acceptor whose side of this round failed asked for
			// another while we were busy.
			select {
			case <-p.askCh:
				continue
			default:
			}
			p.setActive()
			return
		}
		var again *retryError
		if !errors.As(err, &again) || time.Now().After(deadline) {
			p.shutdown(fmt.Errorf("%w: recovery: %v", ErrPeerGone, err), true)
			return
		}
	}
}

// dialerRoundHook is a test hook (export_test.go): it runs at the start
// of each dialer round, once the round's epoch is set.
var dialerRoundHook atomic.Pointer[func(*Peer)]

// recoveryHook is a test hook (export_test.go): it runs as a peer
// starts a recovery, with its cause.
var recoveryHook atomic.Pointer[func(*Peer, error)]

// acceptResendHook is a test hook (export_test.go): it runs in each
// acceptor's recovery round once the dialer confirmed its new lanes,
// just before the acceptor resends.
var acceptResendHook atomic.Pointer[func(*Peer)]

// askHook is a test hook (export_test.go): it runs in an acceptor's
// recovery just before it asks the dialer for a round.
var askHook atomic.Pointer[func(*Peer)]

// errPeerReported is the cause of a dialer's recovery that the acceptor
// asked for: the failure the acceptor saw is its own recovery's cause.
var errPeerReported = errors.New("peer reported a QP failure")

// retryError is a recovery round that failed on its new QPs: another round
// may succeed.
type retryError struct{ err error }

func (e *retryError) Error() string { return e.err.Error() + " (recovering again)" }
func (e *retryError) Unwrap() error { return e.err }

// dialerRound rebuilds every lane and connects it to the acceptor's new
// ones, then resends.
func (p *Peer) dialerRound(deadline time.Time) error {
	epoch := p.ret.Epoch() + 1
	p.roundEpoch.Store(epoch)
	p.e.stats.RecoveryRounds.Add(1)
	select {
	case <-p.askCh: // this round answers it
	default:
	}
	if f := dialerRoundHook.Load(); f != nil {
		(*f)(p)
	}
	if err := p.rebuild(); err != nil {
		return err
	}
	local, err := p.resyncSetup(epoch)
	if err != nil {
		return err
	}
	if err := p.writeCtl(ctlRecover, local.encode()); err != nil {
		return err
	}
	var remote setup
	for {
		select {
		case remote = <-p.recAck:
		case <-p.askCh:
			// The acceptor failed to set up its side: start over.
			return &retryError{fmt.Errorf("peer failed its side of recovery epoch %d", local.Epoch)}
		case <-p.down:
			return p.Err()
		case <-time.After(time.Until(deadline)):
			return fmt.Errorf("no recovery answer within %v (%v)", p.e.cfg.PeerTimeout, p.recCause)
		}
		if remote.Epoch == local.Epoch {
			break
		}
		// An answer to an earlier round: not ours.
	}
	if err := p.finishConnect(local, remote); err != nil {
		return &retryError{err}
	}
	// Our new windows are bound before the acceptor may resend a WRITE.
	if err := p.bindPrepared(); err != nil {
		return &retryError{err}
	}
	if err := p.writeCtl(ctlPing, nil); err != nil {
		return err
	}
	if p.lcm != nil {
		if err := p.awaitLanesUp(local.Epoch, deadline); err != nil {
			return err
		}
	}
	if err := p.finishResend(remote); err != nil {
		return &retryError{err}
	}
	return nil
}

// setActive ends a recovery: senders go on.
func (p *Peer) setActive() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state.Load() != stateRecovering {
		return // shut down meanwhile: stays dead
	}
	p.state.Store(stateActive)
	p.e.poke() // updates held back while recovering may be due
	close(p.recovered)
}

// resyncSetup moves our receive side to epoch and describes our new lanes.
func (p *Peer) resyncSetup(epoch uint32) (setup, error) {
	granted, consumed, err := p.ret.Resync(epoch)
	if err != nil {
		return setup{}, err
	}
	s := p.localSetup(epoch)
	s.Grant, s.Consumed = granted, consumed
	// Transfers waiting for their FIN get windows for the new QPs.
	if s.Grants, err = p.prepareRegrants(); err != nil {
		return setup{}, err
	}
	return s, nil
}

// acceptRecovery is the acceptor's side: rebuild, connect to the dialer's
// new lanes, answer with ours. It runs on the control goroutine.
func (p *Peer) acceptRecovery(remote setup) {
	if p.dialer {
		// The acceptor asks us to recover, unless a recovery to a newer
		// epoch than the one it saw fail happened since.
		if remote.Epoch < p.ret.Epoch() {
			return
		}
		if p.state.Load() == stateRecovering {
			if remote.Epoch < p.roundEpoch.Load() {
				// It saw the failure of an epoch before the one our
				// round under way rebuilds to (both sides noticed the
				// same failure): that round answers it. Taken as an
				// ask for another round, it would abandon this one,
				// whose connects the acceptor is already waiting for.
				return
			}
			select {
			case p.askCh <- struct{}{}:
			default:
			}
			return
		}
		p.startRecovery(errPeerReported)
		return
	}
	p.mu.Lock()
	if p.state.Load() == stateActive {
		p.state.Store(stateRecovering)
		p.recovered = make(chan struct{})
		p.e.stats.Recoveries.Add(1)
	}
	p.mu.Unlock()
	for {
		next, err := p.acceptRound(remote)
		switch {
		case err == nil && next == nil:
			p.setActive()
			return
		case next != nil:
			// The dialer started over (its side failed): so do we.
			remote = *next
			continue
		}
		var again *retryError
		if errors.As(err, &again) {
			// Our new QPs failed: ask the dialer for another round and
			// wait for it, bounded by PeerTimeout.
			p.mu.Lock()
			done := p.recovered
			p.mu.Unlock()
			go p.recover(remote.Epoch, done)
			return
		}
		p.shutdown(fmt.Errorf("%w: recovery: %v", ErrPeerGone, err), true)
		return
	}
}

// acceptRound is one round on the acceptor. It returns the dialer's next
// recovery request if one came instead of the confirmation.
func (p *Peer) acceptRound(remote setup) (*setup, error) {
	p.e.stats.RecoveryRounds.Add(1)
	if err := p.rebuild(); err != nil {
		return nil, err
	}
	local, err := p.resyncSetup(remote.Epoch)
	if err != nil {
		return nil, err
	}
	// Through rdma_cm the dialer connects the new lanes once it has our
	// answer; it resends once we confirm them (ctlLanesUp).
	cmLanes := p.lcm != nil
	if cmLanes {
		p.cmExpect(local.Epoch)
		if err := p.writeCtl(ctlRecAck, local.encode()); err != nil {
			return nil, err
		}
	}
	err = p.finishConnect(local, remote)
	if err == nil {
		// Our new windows are bound before the dialer may resend a WRITE
		// (it resends once it has our answer).
		err = p.bindPrepared()
	}
	if err != nil {
		if !cmLanes {
			if werr := p.writeCtl(ctlRecAck, local.encode()); werr != nil {
				return nil, werr
			}
		}
		return nil, &retryError{err}
	}
	done := uint8(ctlRecAck)
	if cmLanes {
		done = ctlLanesUp
	}
	if err := p.writeCtl(done, local.encode()); err != nil {
		return nil, err
	}
	// The dialer connects its new lanes, then says so: only then can our
	// resends reach a QP that takes them.
	m, err := readCtl(p.ctl, p.e.cfg.PeerTimeout)
	switch {
	case err != nil:
		return nil, fmt.Errorf("dialer did not confirm its new lanes: %v", err)
	case m.Type == ctlRecover && len(m.Setup.Lanes) == len(p.lanes) && m.Setup.Epoch > remote.Epoch:
		return &m.Setup, nil
	case m.Type != ctlPing:
		return nil, fmt.Errorf("%w: control message %d while waiting for the recovery confirmation", ErrProtocol, m.Type)
	}
	if f := acceptResendHook.Load(); f != nil {
		(*f)(p)
	}
	if err := p.finishResend(remote); err != nil {
		return nil, &retryError{err}
	}
	return nil, nil
}

// rebuild replaces every lane's QP with a new one in RESET. Unacknowledged
// messages stay queued on the lane.
func (p *Peer) rebuild() error {
	e := p.e
	for _, l := range p.lanes {
		l.mu.Lock()
		if p.state.Load() == stateDead {
			// shutdown marks the peer dead before it destroys the lanes
			// (under l.mu): a QP made here now would outlive it.
			l.mu.Unlock()
			return p.Err()
		}
		e.mu.Lock()
		delete(e.byQPN, l.qpn())
		e.publishQPNs()
		e.mu.Unlock()
		// The QP stops taking the peer's WRITEs before their windows go:
		// the peer may still be writing through them (a round after one
		// whose resends reached it), and a WRITE that found its window
		// gone would be refused as the peer's protocol violation instead
		// of failing its QP into the next round.
		if l.qp != nil {
			_ = l.qp.ToError() // closed next: an error changes nothing
		}
		p.unbindLane(l)
		p.e.closeFence(l)
		l.closeQP()
		if e.lcm != nil {
			// Its new QP comes with its new rdma_cm connection.
			l.qp, l.live, l.sentHdr = nil, false, hdrTrack{}
			l.rmu.Lock()
			l.rqpn, l.rcvdHdr = 0, hdrTrack{}
			l.rmu.Unlock()
			l.mu.Unlock()
			continue
		}
		q, err := newLaneQP(e)
		if err != nil {
			l.mu.Unlock()
			return err
		}
		// Messages received but not delivered (behind a rendezvous whose
		// FIN has not come) stay: the peer resends only from the first
		// one we lack, so a rendezvous target is written again only while
		// it is still ours.
		l.setQP(q)
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
		if remote.Lanes[i].Next > 0 {
			p.ack(l, remote.Lanes[i].Acked)
		}
	}
	return nil
}

// finishResend resends what the peer does not have, then lets senders in.
// A resend needs a credit like any message, and the peer's buffers may
// not cover every message to resend at once (messages queued during
// recovery may have taken credits of the new epoch ahead of them): what
// finds no credit stays queued and goes out in order as the peer's grants
// come (drainQueued). The lane is live either way: a recovery round that
// failed here, after some resends reached the peer, would rebuild the
// QPs that the peer's WRITEs are already using.
func (p *Peer) finishResend(remote setup) error {
	// Our WRITEs of transfers in progress go to the windows the peer
	// bound for them on its new QPs.
	p.applyRegrants(remote.Grants)
	for i, l := range p.lanes {
		l.mu.Lock()
		l.queuedFrom = remote.Lanes[i].Next
		l.queued.Store(true)
		err := p.drainQueued(l)
		l.live, l.epoch = true, remote.Epoch // finishConnect resynced the credits to it
		l.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// drainQueued posts l's queued messages (from l.queuedFrom, in sequence)
// while credits last. A message of an earlier epoch's credit pays again:
// Resync forgave what never arrived. l.mu is held.
func (p *Peer) drainQueued(l *lane) error {
	if !l.queued.Load() {
		return nil
	}
	epoch, _, _ := p.credits.State()
	for k := range l.outs {
		o := &l.outs[k]
		if o.seq < l.queuedFrom {
			continue // the peer has it, or it is posted on this QP
		}
		var h header
		if err := h.parse(o.buf.Bytes()[:o.buf.Len()], o.buf.Len()+int(o.part.Length)); err != nil {
			return fmt.Errorf("lane %d sequence %d queued without a valid header: %v", l.idx, o.seq, err)
		}
		if o.paid != epoch+1 && !p.credits.TryAcquire(1) {
			// A message queued behind it may hold a credit (taken as it
			// was sent): the first in sequence goes first. Without
			// this, messages sent during recovery could hold every
			// credit the peer granted, unposted behind a resend that
			// has none, and the peer, receiving nothing, would grant
			// no more.
			if !l.stealCredit(k, epoch) {
				l.queuedFrom = o.seq
				return nil // the next grant drains on
			}
		}
		o.paid = epoch + 1
		if err := p.post(l, h, o, false); err != nil {
			l.queuedFrom = o.seq + 1 // queued for the next recovery with the rest
			return err
		}
	}
	l.queued.Store(false)
	return nil
}

// stealCredit moves a credit of epoch to l.outs[k] from the last queued
// message after it that holds one, if any. l.mu is held.
func (l *lane) stealCredit(k int, epoch uint32) bool {
	for j := len(l.outs) - 1; j > k; j-- {
		if l.outs[j].paid == epoch+1 {
			l.outs[j].paid = 0
			return true
		}
	}
	return false
}
