package bx

import (
	"errors"
	"fmt"
	"sync"

	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

// Grants: what a peer may write, with Config.Windows (without it every
// target is in one region under one rkey).
//
// A rendezvous payload is written by the sender straight into a target
// buffer of the receiver. No memory of an endpoint is registered for
// remote access: the target pool's regions allow local access only. For
// each transfer the receiver binds a type 2 memory window over the one
// target, on the one QP the sender writes through, and sends its rkey in
// the CTS; the sender's FIN is a SEND_WITH_INV of that rkey, so the
// receiving device closes the window before the FIN completes, and bx
// delivers the message only then. A peer therefore writes exactly the
// target granted to it (a window of another peer's QP, of another
// transfer, or one used after its FIN, is refused by the device with a
// remote access error), and a delivered message can no longer change.
//
// rxe checks a write through a window against the window's memory region,
// not against the window's own range (docs/mw.md). So each target buffer
// gets a memory region of its own (registered once per buffer of the pool
// and kept, LocalWrite|MWBind, no remote access of its own), and the window
// is bound over that region: bytes past the payload but inside the target
// buffer are all a peer can reach beyond what it was granted, and they are
// never delivered. On devices that enforce windows' ranges it is exact.
//
// Windows are recycled: one invalidated by its FIN goes back to a free
// list; one bound on a QP that recovery replaced, or whose bind was
// prepared and never posted, is deallocated (its rkey in the kernel no
// longer matches ours). Recovery binds a new window for every transfer
// still waiting for its FIN and tells the peer the new rkeys in its setup
// message (setup.Grants), before the peer may resend.

// grant is one target opened to one peer for one transfer. Its fields
// change under the lane's rmu (l.mu held too where a post needs them).
type grant struct {
	t    mr.Buf // the target
	mr   *mr.MR // exactly t's memory
	n    int    // bytes opened: the payload
	mw   *mr.MW // nil until prepared
	rkey uint32 // the window's rkey as prepared: what the peer is told
	bind uverbs.MWBind
	// prepared: bind describes a BIND_MW not posted yet. qp: the QP the
	// window is bound on once posted.
	prepared bool
	qp       *qp.QP
}

// grantPool holds an endpoint's target regions and windows.
type grantPool struct {
	mu     sync.Mutex
	mrs    map[uint32]*mr.MR // by target buffer ID (a slot's memory never moves)
	free   []*mr.MW          // unbound windows, their rkeys in step with the kernel's
	all    map[*mr.MW]struct{}
	closed bool
}

var errGrantsClosed = fmt.Errorf("bx: rendezvous target: %w", ErrClosed)

// newGrant opens nothing yet: it finds t's own memory region.
func (e *Endpoint) newGrant(t mr.Buf, n int) (*grant, error) {
	gp := &e.grants
	gp.mu.Lock()
	defer gp.mu.Unlock()
	if gp.closed {
		return nil, errGrantsClosed
	}
	m := gp.mrs[t.ID()]
	if m == nil {
		var err error
		if m, err = mr.Register(e.pd, t.Bytes()[:t.Cap()], mr.LocalWrite|mr.MWBind); err != nil {
			return nil, fmt.Errorf("bx: registering a rendezvous target: %w", err)
		}
		if gp.mrs == nil {
			gp.mrs = map[uint32]*mr.MR{}
		}
		gp.mrs[t.ID()] = m
	}
	return &grant{t: t, mr: m, n: n}, nil
}

// prepare describes a bind of g on an unbound window (a new rkey), not
// posted yet. A window g held before is deallocated: it is bound on a QP
// that is gone, or its rkey is ahead of the kernel's.
func (e *Endpoint) prepare(g *grant) error {
	e.closeGrant(g)
	w, err := e.takeMW()
	if err != nil {
		return err
	}
	b, err := w.Bind(g.mr, 0, g.n, mr.RemoteWrite, uint8(w.RKey())+1)
	if err != nil {
		e.dropMW(w)
		return fmt.Errorf("bx: binding a window over a rendezvous target: %w", err)
	}
	g.mw, g.bind, g.rkey, g.prepared, g.qp = w, b, b.RKey, true, nil
	return nil
}

// bindWR is g's prepared bind as a work request for the lane's QP; the
// window counts as bound there from now on.
func (g *grant) bindWR(q *qp.QP) qp.SendWR {
	g.prepared, g.qp = false, q
	return qp.SendWR{ID: tagSend, Opcode: qp.OpBindMW, Bind: g.bind}
}

// closeGrant deallocates g's window, bound on a QP or only prepared, if it
// has one: the peer is gone, the transfer was dropped, or its QP is being
// replaced. g opens nothing until it is prepared again.
func (e *Endpoint) closeGrant(g *grant) {
	if g != nil && g.mw != nil {
		e.dropMW(g.mw)
		g.mw, g.prepared, g.qp = nil, false, nil
	}
}

// finishGrant ends g after its FIN invalidated the window: the window is
// unbound and its rkey in step, so it serves the next transfer.
func (e *Endpoint) finishGrant(g *grant) {
	w := g.mw
	if w == nil {
		return
	}
	g.mw = nil
	gp := &e.grants
	gp.mu.Lock()
	closed := gp.closed
	if !closed {
		gp.free = append(gp.free, w)
	}
	gp.mu.Unlock()
	if closed {
		e.dropMW(w)
	}
}

func (e *Endpoint) takeMW() (*mr.MW, error) {
	gp := &e.grants
	gp.mu.Lock()
	defer gp.mu.Unlock()
	if gp.closed {
		return nil, errGrantsClosed
	}
	if n := len(gp.free); n > 0 {
		w := gp.free[n-1]
		gp.free = gp.free[:n-1]
		return w, nil
	}
	w, err := mr.AllocMW(e.pd, mr.MWType2)
	if err != nil {
		return nil, fmt.Errorf("bx: memory window for a rendezvous target: %w", err)
	}
	if gp.all == nil {
		gp.all = map[*mr.MW]struct{}{}
	}
	gp.all[w] = struct{}{}
	return w, nil
}

// dropMW deallocates w: a bound window stops opening its range.
func (e *Endpoint) dropMW(w *mr.MW) {
	gp := &e.grants
	gp.mu.Lock()
	delete(gp.all, w)
	gp.mu.Unlock()
	w.Close()
}

// closeGrants deallocates every window, then the targets' regions (a
// region with a window bound to it cannot be deregistered). Endpoint.Close
// calls it once the peers are shut down.
func (e *Endpoint) closeGrants() error {
	gp := &e.grants
	gp.mu.Lock()
	gp.closed = true
	ws := make([]*mr.MW, 0, len(gp.all))
	for w := range gp.all {
		ws = append(ws, w)
	}
	gp.all, gp.free = nil, nil
	ms := gp.mrs
	gp.mrs = nil
	gp.mu.Unlock()
	var errs []error
	for _, w := range ws {
		if err := w.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, m := range ms {
		if err := m.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// unbindLane deallocates the windows of l's transfers in progress: a
// window bound on a QP holds it (without this the QP was not freed and
// closing the endpoint failed on its CQ with EBUSY). Recovery binds new
// ones (prepareRegrants); a shutdown drops the transfers.
func (p *Peer) unbindLane(l *lane) {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	for _, in := range l.pending {
		p.e.closeGrant(in.g)
	}
}

// regrant is a transfer's new window after recovery, for the peer's setup.
type regrant struct {
	Lane uint8
	Ref  uint64 // the RTS's sequence
	RKey uint32
}

// prepareRegrants gives every transfer still waiting for its FIN a new
// window for the lanes' new QPs (bound by bindPrepared once they are
// connected) and lists the new rkeys for the peer.
func (p *Peer) prepareRegrants() ([]regrant, error) {
	var rs []regrant
	for _, l := range p.lanes {
		l.mu.Lock()
		l.rmu.Lock()
		for _, in := range l.pending {
			if in.g == nil || in.done {
				continue
			}
			if err := p.e.prepare(in.g); err != nil {
				l.rmu.Unlock()
				l.mu.Unlock()
				return nil, err
			}
			rs = append(rs, regrant{Lane: uint8(l.idx), Ref: in.h.Seq, RKey: in.g.rkey})
		}
		l.rmu.Unlock()
		l.mu.Unlock()
	}
	if len(rs) > maxGrants {
		return nil, fmt.Errorf("bx: %d rendezvous transfers in progress, more than a setup carries (%d)", len(rs), maxGrants)
	}
	return rs, nil
}

// bindPrepared posts the binds prepareRegrants prepared, on the connected
// new QPs, before the peer is told it may resend.
func (p *Peer) bindPrepared() error {
	for _, l := range p.lanes {
		l.mu.Lock()
		l.rmu.Lock()
		var err error
		for _, in := range l.pending {
			if in.g == nil || in.done || !in.g.prepared {
				continue
			}
			l.swr[0] = in.g.bindWR(l.qp)
			if err = l.qp.PostSend(l.swr[:1]); err != nil {
				break
			}
		}
		l.rmu.Unlock()
		l.mu.Unlock()
		if err != nil {
			return fmt.Errorf("lane %d: binding the windows of transfers in progress: %w", l.idx, err)
		}
	}
	return nil
}

// applyRegrants points our unfinished WRITEs at the windows the peer
// bound for them in recovery.
func (p *Peer) applyRegrants(rs []regrant) {
	for _, r := range rs {
		if int(r.Lane) >= len(p.lanes) {
			continue // decodeSetup checks; not reached
		}
		l := p.lanes[r.Lane]
		l.rmu.Lock()
		if w := l.targets[r.Ref]; w != nil {
			w.rkey = r.RKey
		}
		l.rmu.Unlock()
	}
}
