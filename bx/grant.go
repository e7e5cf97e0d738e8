package bx

import (
	"errors"
	"fmt"
	"sync"

	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

// Grants: what a peer may write, by default (with Config.SharedTargets
// every target is in one region under one rkey).
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

// The fence: rxe (Linux 6.1, and the newer rxe_req.c read too) executes
// a BIND_MW when its requester reaches it, marks it done, and leaves it in
// the send queue until every work request ahead of it is acknowledged. An RC
// retransmission (req_retry, after a NAK or a timeout) rewinds the
// requester to the oldest work request not yet complete and walks forward
// again, and rxe_requester executes every local operation it meets,
// including the done BIND_MW: its window is bound already and its rkey has
// moved, so rxe_bind_mw fails (-EINVAL). On 6.1 that error only sets the
// requester's state to ERROR (no rxe_qp_error: the QP still reads RTS, no
// async event); the completer waits for the acknowledgement of the
// retransmission ahead of the bind, the retransmit timer is no longer
// re-armed in that state, and every later work request of the lane is
// flushed into a queue that never completes: the lane stalls with no error
// anywhere (docs/reliability.md has the trace).
//
// So a bind never sits behind work requests that are not complete: ahead
// of every bind of a grant bx posts a LOCAL_INV of the lane's fence
// window and a bind of it again. rxe holds a LOCAL_INV back until all work
// requests ahead of it are complete (rxe_wqe_is_fenced: "local invalidate
// fence", mandatory in rxe); then the LOCAL_INV, the fence's bind and the
// grant's bind run one after the other and the completer retires them
// before it can start a retry for anything behind them. The fence window
// is bound first of all on every new lane QP, when nothing is posted on it
// yet; it covers a small region of its own with remote read only, which
// the lane QPs do not allow, so it opens nothing. The cost: a CTS waits
// for the acknowledgement of what its lane sent before it.

// fenceLen is the size of the fence windows' region.
const fenceLen = 64

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
	// The fence windows' region, registered on first use, and how many
	// of all are lanes' fence windows.
	fenceMem *mr.Memory
	fenceMR  *mr.MR
	fences   int
	// dropErrs counts windows the kernel refused to deallocate when they
	// were dropped; dropErr is the first error.
	dropErrs int
	dropErr  error
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

// fenceRegion returns the region the fence windows are bound over.
func (e *Endpoint) fenceRegion() (*mr.MR, error) {
	gp := &e.grants
	gp.mu.Lock()
	defer gp.mu.Unlock()
	if gp.closed {
		return nil, errGrantsClosed
	}
	if gp.fenceMR != nil {
		return gp.fenceMR, nil
	}
	mem, err := mr.Alloc(fenceLen)
	if err != nil {
		return nil, fmt.Errorf("bx: fence region: %w", err)
	}
	m, err := mr.Register(e.pd, mem.Bytes()[:fenceLen], mr.MWBind)
	if err != nil {
		mem.Close()
		return nil, fmt.Errorf("bx: fence region: %w", err)
	}
	gp.fenceMem, gp.fenceMR = mem, m
	return m, nil
}

// bindFence binds a fence window on l's QP, just connected: nothing is
// posted on it yet, so this bind has nothing ahead of it.
func (p *Peer) bindFence(l *lane) error {
	e := p.e
	m, err := e.fenceRegion()
	if err != nil {
		return err
	}
	w, err := e.takeMW()
	if err != nil {
		return err
	}
	b, err := fenceBind(w, m)
	if err != nil {
		e.dropMW(w)
		return err
	}
	e.grants.mu.Lock()
	e.grants.fences++
	e.grants.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	e.closeFence(l)
	l.fence, l.fenceQP = w, l.qp
	l.swr[0] = qp.SendWR{ID: tagSend, Opcode: qp.OpBindMW, Bind: b}
	if err := l.qp.PostSend(l.swr[:1]); err != nil {
		return fmt.Errorf("bx: binding a fence window: %w", err)
	}
	return nil
}

// fenceWRs fills wrs[0:2] with the fence a grant's bind goes behind: a
// LOCAL_INV of the lane's fence window, which rxe runs only once every
// work request ahead of it is complete, and a bind of the window again
// for the next fence. l.mu is held.
func (e *Endpoint) fenceWRs(l *lane, wrs []qp.SendWR) error {
	w := l.fence
	if w == nil || l.fenceQP != l.qp {
		return fmt.Errorf("bx: lane %d has no fence window on its QP", l.idx)
	}
	e.grants.mu.Lock()
	m := e.grants.fenceMR
	e.grants.mu.Unlock()
	if m == nil {
		return errGrantsClosed
	}
	cur := w.RKey()
	b, err := fenceBind(w, m)
	if err != nil {
		return err
	}
	wrs[0] = qp.SendWR{ID: tagSend, Opcode: qp.OpLocalInv, InvRKey: cur}
	wrs[1] = qp.SendWR{ID: tagSend, Opcode: qp.OpBindMW, Bind: b}
	return nil
}

// fenceBind is the bind of fence window w over the fence region m, read
// only, with the next rkey.
func fenceBind(w *mr.MW, m *mr.MR) (uverbs.MWBind, error) {
	b, err := w.Bind(m, 0, fenceLen, mr.RemoteRead, uint8(w.RKey())+1)
	if err != nil {
		return b, fmt.Errorf("bx: binding a fence window: %w", err)
	}
	return b, nil
}

// closeFence deallocates l's fence window (never recycled: a post that
// failed leaves its rkey ahead of the kernel's). l.mu is held.
func (e *Endpoint) closeFence(l *lane) {
	if l.fence != nil {
		e.grants.mu.Lock()
		e.grants.fences--
		e.grants.mu.Unlock()
		e.dropMW(l.fence)
		l.fence, l.fenceQP = nil, nil
	}
}

// dropMW deallocates w: a bound window stops opening its range.
//
// A window the kernel did not deallocate stays in all, for closeGrants
// to try again (and report): it may still be bound.
func (e *Endpoint) dropMW(w *mr.MW) {
	err := w.Close()
	gp := &e.grants
	gp.mu.Lock()
	defer gp.mu.Unlock()
	if err == nil {
		delete(gp.all, w)
		return
	}
	gp.dropErrs++
	if gp.dropErr == nil {
		gp.dropErr = err
	}
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
	fmem, fmr := gp.fenceMem, gp.fenceMR
	gp.fenceMem, gp.fenceMR = nil, nil
	fences := gp.fences
	var errs []error
	if gp.dropErr != nil {
		errs = append(errs, fmt.Errorf("bx: %d windows were not deallocated when dropped: %w", gp.dropErrs, gp.dropErr))
	}
	gp.mu.Unlock()
	for _, w := range ws {
		if err := w.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for id, m := range ms {
		if err := m.Close(); err != nil {
			errs = append(errs, fmt.Errorf("bx: rendezvous target region %d (%d windows allocated, %d fences): %w", id, len(ws), fences, err))
		}
	}
	if fmr != nil {
		if err := fmr.Close(); err != nil {
			errs = append(errs, fmt.Errorf("bx: fence region (%d windows allocated, %d fences): %w", len(ws), fences, err))
		} else if err := fmem.Close(); err != nil {
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
