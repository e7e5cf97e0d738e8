package bx

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// Call slots: how a response reaches the Call that waits for it without a
// lock, a map or a channel operation on the way (eRPC's session slots, in
// spirit). Call id i owns slot i mod numSlots while it waits; a Call whose
// slot is taken by an older one still waiting falls back to the peer's
// calls map and a channel, as does openConn.
//
// A slot's state is 0 (free), the id of the call that owns it (waiting),
// or that id with slotDone set (its response is in m). The owner claims
// the slot (0 -> id) and frees it (take, forgetSlot); deliverSlot, run
// only by the holder of the endpoint's pollMu, so never by two at once,
// moves it from id to id|slotDone. A waiter that found nothing while
// polling sleeps on wake after setting asleep and looking once more;
// deliverSlot and shutdown (wakeSlots) look at asleep after their change,
// so a wake-up cannot be lost.
const (
	numSlots = 256
	slotDone = 1 << 63
)

type callSlot struct {
	state  atomic.Uint64
	m      atomic.Pointer[Msg]
	asleep atomic.Bool
	wake   chan struct{} // capacity 1
	done   func() bool   // the response is here (made once: polling for it allocates nothing)
}

// initSlots makes the peer's call slots ready (handshake).
func (p *Peer) initSlots() {
	for i := range p.slots {
		s := &p.slots[i]
		s.wake = make(chan struct{}, 1)
		s.done = func() bool { return s.state.Load()&slotDone != 0 }
	}
}

// claimSlot takes call id's slot, if it is free.
func (p *Peer) claimSlot(id uint64) (*callSlot, bool) {
	s := &p.slots[id%numSlots]
	return s, s.state.CompareAndSwap(0, id)
}

// deliverSlot hands response m to the Call waiting in its slot, and
// reports whether there was one. The pollMu holder calls it.
func (p *Peer) deliverSlot(m *Msg) bool {
	s := &p.slots[m.call%numSlots]
	if s.state.Load() != m.call {
		return false
	}
	s.m.Store(m)
	if !s.state.CompareAndSwap(m.call, m.call|slotDone) {
		// The Call gave up meanwhile (forgetSlot): it is not waiting
		// any more, and no newer call's response can come while we
		// hold pollMu.
		s.m.CompareAndSwap(m, nil)
		m.Release()
		return true
	}
	if s.asleep.Load() {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// take frees the slot of a Call whose response is there, and returns it.
func (s *callSlot) take() *Msg {
	m := s.m.Swap(nil)
	s.state.Store(0)
	return m
}

// forgetSlot withdraws a Call that gives up: a response that came
// meanwhile is released.
func (s *callSlot) forgetSlot(id uint64) {
	if s.state.CompareAndSwap(id, 0) {
		return
	}
	if m := s.take(); m != nil {
		m.Release()
	}
}

// waitSlot waits for call id's response in slot s (the Call started at
// start): polling the CQ while the endpoint polls (pollUntilAt), else
// asleep until deliverSlot or a shutdown wakes it.
func (p *Peer) waitSlot(ctx context.Context, s *callSlot, id uint64, start time.Time) (*Msg, error) {
	if p.e.pollUntilAt(ctx, start, s.done) {
		return p.answerMsg(s.take())
	}
	for {
		if s.done() {
			return p.answerMsg(s.take())
		}
		if p.state.Load() == stateDead {
			s.forgetSlot(id)
			return nil, p.Err()
		}
		s.asleep.Store(true)
		if s.done() || p.state.Load() == stateDead {
			s.asleep.Store(false)
			continue
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
		}
		s.asleep.Store(false)
		if ctx.Err() != nil && !s.done() {
			s.forgetSlot(id)
			if p.state.Load() == stateRecovering {
				return nil, fmt.Errorf("%w: %w", ErrRecovering, ctx.Err())
			}
			return nil, ctx.Err()
		}
	}
}

// answerMsg is what a Call returns for its response m.
func (p *Peer) answerMsg(m *Msg) (*Msg, error) {
	if m.remote != "" || m.flags&flagError != 0 {
		err := &RemoteError{Msg: m.remote}
		m.Release()
		return nil, err
	}
	return m, nil
}

// wakeSlots wakes every Call asleep in a slot (shutdown, after the state
// says dead).
func (p *Peer) wakeSlots() {
	for i := range p.slots {
		s := &p.slots[i]
		if s.asleep.Load() {
			select {
			case s.wake <- struct{}{}:
			default:
			}
		}
	}
}

// slotsWaiting counts the Calls waiting in slots (debug).
func (p *Peer) slotsWaiting() int {
	n := 0
	for i := range p.slots {
		if st := p.slots[i].state.Load(); st != 0 && st&slotDone == 0 {
			n++
		}
	}
	return n
}
