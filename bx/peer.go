package bx

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/flow"
	"github.com/goverbs/goverbs/internal/sentinel"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
)

// Errors a caller can tell apart with errors.Is.
var (
	ErrClosed     = sentinel.Closed("bx: closed") // goverbs.ErrClosed for errors.Is
	ErrPeerGone   = errors.New("bx: peer gone")
	ErrRecovering = errors.New("bx: connection recovery in progress")
	ErrTooLarge   = errors.New("bx: message larger than MaxMessage")
	ErrProtocol   = errors.New("bx: protocol violation by peer")
)

// Peer is the connection to one remote endpoint: a TCP control connection
// and Config.Lanes RC QPs carrying any number of streams.
type Peer struct {
	e      *Endpoint
	id     uint64 // the remote endpoint's incarnation
	ctl    net.Conn
	ctlMu  sync.Mutex
	dialer bool
	lanes  []*lane

	credits *flow.Credits  // what the peer lets us send
	ret     *flow.Returner // what we let the peer send
	// splitMax is the largest payload sent to the peer split in parts
	// (Config.SplitSize, less if the peer grants few credits; -1: none).
	splitMax int

	mu      sync.Mutex
	streams map[uint32]*Stream
	calls   map[uint64]chan *Msg // calls without a slot (calls.go) and openConn
	chans   []chan *Msg          // empty call channels for reuse
	// mapCalls counts calls' entries, so that a response delivered to a
	// slot's Call looks at the map (and takes mu) only when it is not
	// empty.
	mapCalls atomic.Int64
	slots    [numSlots]callSlot
	state    atomic.Int32
	down     chan struct{} // closed when the peer is shut down
	err      error
	callID   atomic.Uint64
	ready    chan struct{}

	recovered chan struct{} // closed when a recovery finished
	recCause  error
	recAck    chan setup
	askCh     chan struct{} // dialer: the acceptor asked for another recovery round
	// roundEpoch (dialer): the credit epoch the recovery round under
	// way rebuilds to. An acceptor's request naming an earlier epoch's
	// failure crossed it on the wire: that round answers it. (A request
	// that came before the round set it, the round drains from askCh.)
	roundEpoch atomic.Uint32
	lcm        *peerCM // Config.LaneSetup CM (cmlane.go)
}

const (
	stateActive int32 = iota
	stateRecovering
	stateDead
)

// lane is one RC QP to the peer, with its own sequence space. Messages of
// one stream always use the same lane, so RC ordering keeps them in order.
type lane struct {
	peer *Peer
	idx  int
	qp   *qp.QP
	win  *flow.Window

	mu      sync.Mutex // the QP's send side
	nextSeq uint64
	outs    []out // unacknowledged, in sequence order (pushOut appends)
	outBase []out // the array outs lies in, from its start (pushOut)
	sends   int
	swr     [4]qp.SendWR // under mu: the work requests of a post, kept off the heap
	ssge    [2]qp.SGE
	// Under mu, without Config.SharedTargets: the lane's fence window and the QP it
	// is bound on (grant.go, "The fence").
	fence   *mr.MW
	fenceQP *qp.QP

	live bool // under mu: the QP is connected and resends are done; else sends only queue
	// epoch (under mu): the credit epoch the lane went live in. A message
	// whose credit was taken in another (a recovery ended between its
	// admit and its post: Resync forgave that credit) goes out through
	// drainQueued, which has it pay again; posted directly it would be a
	// message the peer never granted.
	epoch uint32
	// queued: outs from sequence queuedFrom on are not posted on the QP yet
	// (resends after recovery that found no credit, and what was sent
	// behind them); they go out in order as credits come (drainQueued).
	// Written under mu; read without it by the ticker.
	queued     atomic.Bool
	queuedFrom uint64        // under mu
	posts      uint64        // under mu: sends and updates posted (the stall watchdog's cue)
	watch      stallWatch    // under mu: the stall watchdog's view of the lane (stall.go)
	probed     atomic.Uint64 // the number of the last probe that completed
	sendsDone  atomic.Uint64 // signaled sends completed (the stall watchdog's sign of progress)
	cm         *cm.ID        // under mu, Config.LaneSetup CM: the lane's rdma_cm ID, which owns qp (nil qp before it connects)

	rmu       sync.Mutex          // receive side, touched by the progress goroutine and Release
	rqpn      uint32              // the QP whose receives count; older ones' are dropped
	delivered uint64              // highest sequence delivered in order
	pending   []*inbound          // received, not delivered: a rendezvous waiting for its FIN, and what follows it
	targets   map[uint64]*writeOp // our rendezvous the peer sent a CTS for, by the RTS's sequence, until acknowledged
	free      []*inbound          // under rmu: flushed entries for reuse
	ready     []*Msg              // the pollMu holder's: what flush took, to deliver
	acked     atomic.Uint64
	// ackTo is an acknowledgement received with a response and not
	// applied yet (deferAck): the pollMu holder applies it before its
	// next poll, a sender when the window is full.
	ackTo     atomic.Uint64
	ackQueued bool // the pollMu holder's: l is in the endpoint's acks list
	ackSent   atomic.Uint64
	ackWait   uint64           // the ticker's: 1 + ackSent when it last saw an acknowledgement owed (ackIdle)
	scratch   [HeaderSize]byte // credit updates, sent inline
	// The last header posted (under mu) and received (under rmu) on the
	// QP, behind which a data message may go compact (wire.go); both
	// start empty with each new QP.
	sentHdr, rcvdHdr hdrTrack
	// Under rmu: the split message being received (its pending entry,
	// not done until its last part) and the payload bytes in so far.
	split    *inbound
	splitOff int
	// Under mu: the work requests and SGEs of a split message's parts,
	// posted in one doorbell (made at the lane's first split message).
	pwr  []qp.SendWR
	psge []qp.SGE
}

// out is a sent, unacknowledged message: kept for resending after a QP
// failure, freed when the peer acknowledges it.
type out struct {
	seq   uint64
	buf   mr.Buf
	rndv  mr.Buf // an RTS's payload, freed with it
	hasRV bool
	bytes int64
	ctl   bool   // CTS or FIN: outside the send window
	paid  uint32 // 1 + the credit epoch of the credit it consumed
	// A FIN goes behind the RDMA WRITE of the payload, also when resent.
	write *writeOp
	// A CTS binds the window of its grant in the same post (grant.go).
	g *grant
	// A part of a split message: its share of the payload, in the
	// message's buffer (the last part's rndv); buf holds its header.
	part qp.SGE
}

// writeOp is the RDMA WRITE of a rendezvous payload, into the window the
// peer's CTS (or, after recovery, its setup) named. Its fields are under
// the lane's rmu.
type writeOp struct {
	sge  qp.SGE
	addr uint64
	rkey uint32
	inv  bool // a window: the FIN is a SEND_WITH_INV of rkey
}

// inbound is a received message not yet delivered. A rendezvous (msg.large)
// is done when its FIN arrives; CTS and FIN entries have no msg and only
// hold their place in the sequence.
type inbound struct {
	h    header
	msg  *Msg
	done bool
	g    *grant // a rendezvous: the window its payload is written through
}

// Dial connects to the endpoint listening at addr (host:port of its
// control plane).
func (e *Endpoint) Dial(ctx context.Context, addr string) (*Peer, error) {
	if e.bad() {
		return nil, errNilEndpoint
	}
	if ctx == nil {
		return nil, fmt.Errorf("bx: dial %s: nil context", addr)
	}
	if e.closed.Load() {
		return nil, ErrClosed
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("bx: dial %s: %w", addr, err)
	}
	if c, err = e.secureClient(ctx, c, addr); err != nil {
		return nil, fmt.Errorf("bx: dial %s: %w", addr, err)
	}
	p, err := e.handshake(ctx, c, true)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("bx: dial %s: %w", addr, err)
	}
	return p, nil
}

// Listen accepts peers on addr (the TCP control plane). Accepted peers are
// served by the endpoint's handlers and returned by Accept.
func (e *Endpoint) Listen(addr string) (net.Addr, error) {
	if e.bad() {
		return nil, errNilEndpoint
	}
	if e.closed.Load() {
		return nil, ErrClosed
	}
	if err := e.checkServerTLS(); err != nil {
		return nil, fmt.Errorf("bx: listen %s: %w", addr, err)
	}
	if e.lcm != nil {
		if err := e.listenCM(); err != nil {
			return nil, fmt.Errorf("bx: listen %s: %w", addr, err)
		}
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("bx: listen %s: %w", addr, err)
	}
	e.mu.Lock()
	if e.closed.Load() {
		// Close took the listeners before this one: it would stay open.
		e.mu.Unlock()
		l.Close()
		return nil, ErrClosed
	}
	e.lns = append(e.lns, l)
	e.wg.Add(1)
	e.mu.Unlock()
	go func() {
		defer e.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				ctx, cancel := context.WithTimeout(e.stopCh, e.cfg.HandshakeTimeout)
				defer cancel()
				from := c.RemoteAddr()
				c, err := e.secureServer(ctx, c)
				if err != nil {
					e.handshakeFailed(from, err)
					return
				}
				p, err := e.handshake(ctx, c, false)
				if err != nil {
					c.Close()
					e.handshakeFailed(from, err)
					return
				}
				select {
				case e.accepted <- p:
				default:
				}
			}()
		}
	}()
	return l.Addr(), nil
}

// handshakeFailed counts an accepted control connection that did not
// become a peer, and keeps why: nobody calls Accept for it, so this is
// where the acceptor's operator sees a dialer of the wrong token or
// version (Snapshot, and goverbs_bx_handshakes_failed_total). Not while
// the endpoint closes: that failure is its own.
func (e *Endpoint) handshakeFailed(from net.Addr, err error) {
	if e.closed.Load() {
		return
	}
	e.stats.HandshakesFailed.Add(1)
	why := fmt.Sprintf("%v: %v", from, err)
	e.lastHSFail.Store(&why)
}

// ListenAddrs returns the addresses Listen bound.
func (e *Endpoint) ListenAddrs() []net.Addr {
	if e.bad() {
		return nil
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	var a []net.Addr
	for _, l := range e.lns {
		a = append(a, l.Addr())
	}
	return a
}

// Accept returns the next peer that connected to a Listen address.
func (e *Endpoint) Accept(ctx context.Context) (*Peer, error) {
	if e.bad() {
		return nil, errNilEndpoint
	}
	if ctx == nil {
		return nil, errors.New("bx: Accept: nil context")
	}
	// Closed first: Close shuts down the peers still queued here, and a
	// select among ready cases picks one at random, so a closed endpoint's
	// Accept returned such a dead peer with no error about half the time.
	if e.closed.Load() {
		return nil, ErrClosed
	}
	select {
	case p := <-e.accepted:
		if e.closed.Load() {
			return nil, ErrClosed // shut down by Close meanwhile
		}
		return p, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-e.stopCh.Done():
		return nil, ErrClosed
	}
}

func (e *Endpoint) newLanes(p *Peer) error {
	p.lanes = make([]*lane, e.cfg.Lanes)
	for i := range p.lanes {
		p.lanes[i] = &lane{peer: p, idx: i, nextSeq: 1,
			win: e.win.NewChild(flow.Limits{Msgs: e.cfg.LaneMsgs, Bytes: e.cfg.LaneBytes})}
		if e.lcm != nil {
			continue // its QP comes with its rdma_cm connection
		}
		q, err := newLaneQP(e)
		if err != nil {
			return err
		}
		p.lanes[i].qp, p.lanes[i].rqpn = q, q.QPN() // sentHdr, rcvdHdr: empty
	}
	return nil
}

func newLaneQP(e *Endpoint) (*qp.QP, error) {
	return qp.Create(e.pd, laneQPConfig(e))
}

// laneSendWR is a lane's send queue depth: its window of messages, a CTS
// and its window's bind and fence (three local work requests) for each of
// the peer's, a FIN and its WRITE for each of ours, and credit updates.
func laneSendWR(c *Config) int {
	return 7*int(c.LaneMsgs) + c.Credits + 16
}

func (p *Peer) localSetup(epoch uint32) setup {
	s := setup{ID: p.e.id, Epoch: epoch, Grant: uint64(p.e.cfg.Credits), Eager: uint32(p.e.cfg.EagerSize)}
	copy(s.GID[:], p.e.gid.GID.To16())
	for _, l := range p.lanes {
		l.rmu.Lock()
		acked := l.delivered
		next := acked + uint64(len(l.pending)) + 1
		l.rmu.Unlock()
		s.Lanes = append(s.Lanes, laneInfo{QPN: l.qpn(), PSN: rand.Uint32() & 0xffffff, Next: next, Acked: acked})
	}
	return s
}

func (p *Peer) connectLanes(local, remote setup) error {
	if len(remote.Lanes) != len(p.lanes) {
		return fmt.Errorf("%w: peer has %d lanes, we have %d", ErrProtocol, len(remote.Lanes), len(p.lanes))
	}
	if p.e.lcm != nil {
		if err := p.connectCM(local.Epoch); err != nil {
			return err
		}
	}
	for i, l := range p.lanes {
		r := remote.Lanes[i]
		var err error
		if p.e.lcm == nil {
			err = l.qp.Connect(qp.Remote{QPN: r.QPN, PSN: r.PSN, GID: remote.GID[:]},
				// Peers may WRITE into our rendezvous targets and nothing
				// else: the QP allows remote writes, only the target pool is
				// registered for them.
				qp.ConnectOptions{Port: p.e.cfg.Port, PSN: local.Lanes[i].PSN, Access: mr.RemoteWrite,
					// 7 would retry forever on rxe: a lane whose peer QP went
					// to ERR must end in an error completion, which starts
					// recovery.
					RetryCnt: 6})
		}
		if err != nil {
			return err
		}
		if !p.e.cfg.SharedTargets {
			if err := p.bindFence(l); err != nil {
				return fmt.Errorf("lane %d: %w", i, err)
			}
		}
	}
	return nil
}

// handshake authenticates, exchanges lanes and grants, connects the QPs.
// Nothing about QPs, GIDs or keys crosses the wire before the peer proved
// it holds the token.
func (e *Endpoint) handshake(ctx context.Context, c net.Conn, dialer bool) (*Peer, error) {
	// Close, and for Dial the caller's ctx, end a handshake under way. Its
	// reads and writes set deadlines of their own (HandshakeTimeout), so
	// the interrupt closes the connection. It did not: an accepted
	// connection whose dialer said nothing, or a Dial to a listener that
	// never answered, outlived Close (goroutine and descriptor) until
	// HandshakeTimeout (TestGoroutineLeaksHandshake).
	g := hsGuard{ctx: ctx, e: e}
	intr := func() { c.Close() }
	g.stopCtx, g.stopE = context.AfterFunc(ctx, intr), context.AfterFunc(e.stopCh, intr)
	p, err := e.handshakeConn(ctx, c, dialer, &g)
	if !g.settle() && err != nil {
		err = g.cause(err)
	}
	return p, err
}

// hsGuard holds a handshake's interrupts (handshake).
type hsGuard struct {
	ctx          context.Context
	e            *Endpoint
	stopCtx      func() bool
	stopE        func() bool
	done, intact bool
}

// settle stops the interrupts, once; false if one of them fired (the
// connection is closed or about to be).
func (g *hsGuard) settle() bool {
	if !g.done {
		a, b := g.stopCtx(), g.stopE()
		g.done, g.intact = true, a && b
	}
	return g.intact
}

// cause is what an interrupted handshake returns instead of err (the
// error of a read or write on the connection the interrupt closed).
func (g *hsGuard) cause(err error) error {
	switch {
	case g.e.closed.Load() || g.e.stopCh.Err() != nil:
		return ErrClosed
	case g.ctx.Err() != nil:
		return fmt.Errorf("handshake: %w", g.ctx.Err())
	}
	return err
}

// handshakeConn is handshake's work; it settles g before the peer is
// registered, so that an interrupt never closes a peer's connection.
func (e *Endpoint) handshakeConn(ctx context.Context, c net.Conn, dialer bool, g *hsGuard) (*Peer, error) {
	d := e.cfg.HandshakeTimeout
	if dl, ok := ctx.Deadline(); ok {
		d = time.Until(dl)
	}
	var err error
	if dialer {
		err = authClient(c, e.cfg.Token, d)
	} else {
		err = authServer(c, e.cfg.Token, d)
	}
	if err != nil {
		return nil, err
	}
	// A place among MaxPeers is taken here, for the whole handshake:
	// concurrent handshakes that each counted only the registered peers all
	// got in, and each peer beyond MaxPeers was granted receive buffers
	// the SRQ does not have (MaxPeers*Credits are posted) and backlog
	// entries the worker pool's queue has no room for.
	e.mu.Lock()
	if len(e.peers)+e.joining >= e.cfg.MaxPeers {
		e.mu.Unlock()
		// With the reason (both sides are authenticated): the dialer's
		// error said "expected setup, got control message 8".
		err := fmt.Errorf("bx: endpoint full (%d peers)", e.cfg.MaxPeers)
		writeCtl(c, ctlBye, byeReason(err), d)
		return nil, err
	}
	e.joining++
	e.mu.Unlock()
	joined := false
	defer func() {
		if !joined {
			e.mu.Lock()
			e.joining--
			e.mu.Unlock()
		}
	}()
	p := &Peer{e: e, ctl: c, dialer: dialer, streams: map[uint32]*Stream{}, calls: map[uint64]chan *Msg{},
		down: make(chan struct{}), ready: make(chan struct{}), recAck: make(chan setup, 1), askCh: make(chan struct{}, 1)}
	p.initSlots()
	if err := e.newLanes(p); err != nil {
		p.destroyLanes()
		return nil, err
	}
	if e.lcm != nil && !dialer {
		if err := p.cmAwait(); err != nil {
			p.destroyLanes()
			return nil, err
		}
	}
	local := p.localSetup(0)
	local.CM = p.localCM()
	var remote setup
	if dialer {
		if err := writeCtl(c, ctlSetup, local.encode(), d); err != nil {
			p.destroyLanes()
			return nil, err
		}
	}
	m, err := readCtl(c, d)
	if err == nil && m.Type == ctlBye {
		err = fmt.Errorf("%w: the peer refused our setup: %s", ErrProtocol, m.Reason)
	} else if err == nil && m.Type != ctlSetup {
		err = fmt.Errorf("%w: expected setup, got control message %d", ErrProtocol, m.Type)
	}
	if err != nil {
		p.destroyLanes()
		return nil, err
	}
	remote = m.Setup
	err = p.checkCM(remote)
	if err == nil && remote.Eager != uint32(e.cfg.EagerSize) {
		// A message above the receiver's buffers would fail on its QP
		// (a remote invalid request), again after every recovery.
		acc, dial := uint32(e.cfg.EagerSize), remote.Eager
		if dialer {
			acc, dial = dial, acc
		}
		err = fmt.Errorf("%w: the acceptor's Config.EagerSize is %d, the dialer's %d: both ends must use the same", ErrProtocol, acc, dial)
	}
	if err != nil {
		p.destroyLanes()
		writeCtl(c, ctlBye, byeReason(err), d)
		return nil, err
	}
	if remote.Grant < flow.MinGrant || remote.Grant > maxGrant {
		p.destroyLanes()
		return nil, fmt.Errorf("%w: grant %d", ErrProtocol, remote.Grant)
	}
	p.id = remote.ID
	p.credits = flow.NewCredits(flow.CreditsConfig{Initial: remote.Grant, MaxGrant: remote.Grant})
	p.splitMax = e.cfg.splitFor(remote.Grant)
	if p.ret, err = flow.NewReturner(flow.ReturnerConfig{Grant: uint64(e.cfg.Credits)}); err != nil {
		p.destroyLanes()
		return nil, err
	}
	// The lanes are routed before they connect: the peer may send as soon
	// as both ends are in RTS, before this handshake returns, and a
	// message on an unrouted QP would be lost.
	e.mu.Lock()
	for _, l := range p.lanes {
		if l.qp != nil {
			e.byQPN[l.qp.QPN()] = l
		}
	}
	e.publishQPNs()
	e.mu.Unlock()
	// Through rdma_cm the dialer connects the lanes: it needs our setup
	// (the listener and the key) first.
	if !dialer && e.lcm != nil {
		if err := writeCtl(c, ctlSetup, local.encode(), d); err != nil {
			p.destroyLanes()
			return nil, err
		}
	}
	if err := p.connectLanes(local, remote); err != nil {
		p.destroyLanes()
		return nil, err
	}
	for _, l := range p.lanes {
		l.mu.Lock()
		l.live = true
		l.mu.Unlock()
	}
	if !dialer && e.lcm == nil {
		if err := writeCtl(c, ctlSetup, local.encode(), d); err != nil {
			p.destroyLanes()
			return nil, err
		}
	}
	// Both QPs are in RTS once each side has the other's setup; a last
	// round trip makes sure the dialer's are before the acceptor sends.
	if dialer {
		if err := writeCtl(c, ctlPing, nil, d); err != nil {
			p.destroyLanes()
			return nil, err
		}
	} else {
		if m, err := readCtl(c, d); err != nil || m.Type != ctlPing {
			p.destroyLanes()
			return nil, fmt.Errorf("bx: handshake: peer not ready: %v", err)
		}
	}
	if !g.settle() {
		// Interrupted as it finished: the connection is closed.
		p.destroyLanes()
		return nil, g.cause(ErrClosed)
	}
	e.mu.Lock()
	if e.closed.Load() {
		// Close took its list of peers already: this one would outlive
		// the endpoint.
		e.mu.Unlock()
		p.destroyLanes()
		return nil, ErrClosed
	}
	if e.lcm != nil {
		if err := e.lcm.removedErr(); err != nil {
			// The device went while we set up (removal.go): its
			// shutdown of the peers did not see this one.
			e.mu.Unlock()
			p.destroyLanes()
			writeCtl(c, ctlBye, byeReason(err), d)
			return nil, err
		}
	}
	e.peers[p] = struct{}{}
	e.joining--
	joined = true
	e.mu.Unlock()
	close(p.ready)
	go p.control()
	return p, nil
}

func (p *Peer) destroyLanes() {
	p.cmForget()
	for _, l := range p.lanes {
		if l != nil {
			l.mu.Lock()
			p.e.closeFence(l)
			p.e.mu.Lock()
			delete(p.e.byQPN, l.qpn())
			p.e.publishQPNs()
			p.e.mu.Unlock()
			l.closeQP()
			l.mu.Unlock()
		}
	}
}

// Endpoint returns the local endpoint.
func (p *Peer) Endpoint() *Endpoint {
	if p.bad() {
		return nil
	}
	return p.e
}

// ID is the remote endpoint's incarnation: a restarted peer has a new one.
func (p *Peer) ID() uint64 {
	if p.bad() {
		return 0
	}
	return p.id
}

// Done is closed when the peer is gone for good; Err says why. A nil
// Peer's, or a zero one's (not from Dial or Accept), is closed.
func (p *Peer) Done() <-chan struct{} {
	if p.bad() {
		return sentinel.Done
	}
	return p.down
}

// Err returns why the peer went down, or nil.
func (p *Peer) Err() error {
	if p.bad() {
		return errNilPeer
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// control reads the control connection: orderly close, recovery requests,
// or its loss.
func (p *Peer) control() {
	for {
		m, err := readCtl(p.ctl, 0)
		if err != nil {
			p.shutdown(fmt.Errorf("%w: control connection: %v", ErrPeerGone, err), false)
			return
		}
		switch m.Type {
		case ctlBye:
			why := "peer closed the connection"
			if m.Reason != "" {
				why += ": " + m.Reason
			}
			p.shutdown(fmt.Errorf("%w: %s", ErrPeerGone, why), false)
			return
		case ctlRecover:
			p.acceptRecovery(m.Setup)
		case ctlRecAck:
			// Keep the newest: an answer to an abandoned round is stale.
			select {
			case <-p.recAck:
			default:
			}
			select {
			case p.recAck <- m.Setup:
			default:
			}
		case ctlLanesUp:
			p.lanesUp(m.Setup.Epoch)
		case ctlPing:
		}
	}
}

func (p *Peer) writeCtl(typ uint8, body []byte) error {
	p.ctlMu.Lock()
	defer p.ctlMu.Unlock()
	return writeCtl(p.ctl, typ, body, p.e.cfg.HandshakeTimeout)
}

// Close disconnects from the peer.
func (p *Peer) Close() error {
	if p.bad() {
		return errNilPeer
	}
	p.shutdown(ErrClosed, true)
	return nil
}

func (p *Peer) shutdown(why error, bye bool) {
	p.mu.Lock()
	if p.state.Load() == stateDead {
		p.mu.Unlock()
		return
	}
	// Counted before the state says dead: whoever sees a dead peer (Close
	// of the endpoint) can wait for its teardown.
	p.e.downs.Add(1)
	defer p.e.downs.Done()
	p.state.Store(stateDead)
	p.err = why
	calls := p.calls
	p.calls = map[uint64]chan *Msg{}
	p.mapCalls.Store(0)
	// A copy: streams come and go (Stream, Close) while we fail them.
	streams := make([]*Stream, 0, len(p.streams))
	for _, s := range p.streams {
		streams = append(streams, s)
	}
	p.mu.Unlock()
	if bye {
		p.writeCtl(ctlBye, byeReason(why))
	}
	p.ctl.Close()
	close(p.down)
	for _, ch := range calls {
		close(ch)
	}
	p.wakeSlots()
	for _, s := range streams {
		s.fail(why)
	}
	p.credits.Close()
	e := p.e
	e.mu.Lock()
	delete(e.peers, p)
	e.mu.Unlock()
	if f := teardownHook.Load(); f != nil {
		(*f)(p)
	}
	for _, l := range p.lanes {
		// The windows go first: they close the targets to the peer, and
		// a QP with a window bound on it cannot be destroyed.
		p.unbindLane(l)
	}
	p.destroyLanes()
	// The unacknowledged sends' buffers only now, with the QPs gone: a
	// live QP may still read one (rxe retransmits from the buffer), and
	// freed, it is the next Alloc's, of this peer or another: its bytes
	// would go to this peer as the old message's.
	for _, l := range p.lanes {
		l.mu.Lock()
		for i := range l.outs {
			p.freeOut(l, &l.outs[i])
		}
		// Both: outBase's array still holds what was just freed (its
		// buffers, grants, writes), and a dead Peer may be kept long.
		l.outs, l.outBase = nil, nil
		l.mu.Unlock()
		l.win.Close()
	}
	// With the QPs gone nothing writes into rendezvous targets any more.
	for _, l := range p.lanes {
		l.rmu.Lock()
		pending := l.pending
		l.pending, l.split = nil, nil
		l.targets = nil
		// A completion still in the CQ is dropped as stale (received),
		// not added to a pending list no one drains any more.
		l.rqpn, l.rcvdHdr = 0, hdrTrack{}
		l.rmu.Unlock()
		for _, in := range pending {
			p.dropInbound(in)
		}
	}
}

// dropInbound returns the buffer of a message that will not be delivered.
// Its Msg was counted live when it was made: no user ever sees it, so it
// stops counting (a count left over kept the endpoint's pools mapped
// after Close, 65 MiB and more, whenever a peer died with a transfer
// under way).
func (p *Peer) dropInbound(in *inbound) {
	p.e.closeGrant(in.g)
	in.g = nil
	if in.msg != nil {
		p.e.liveMsgs.Add(-1)
	}
	switch {
	case in.msg == nil:
	case in.msg.large:
		p.e.large.Free(in.msg.buf)
	case in.msg.copied:
		p.e.eager.Free(in.msg.buf)
	default:
		p.e.repost(in.msg.buf)
		p.ret.Released(1)
	}
}

func (p *Peer) freeOut(l *lane, o *out) {
	p.e.eager.Free(o.buf)
	if o.hasRV {
		p.e.rndv.Free(o.rndv)
	}
	if !o.ctl {
		l.win.Release(o.bytes)
	}
}

// waitUsable blocks while the peer recovers.
func (p *Peer) waitUsable(ctx context.Context) error {
	for {
		switch p.state.Load() {
		case stateActive:
			return nil
		case stateDead:
			return p.Err()
		}
		p.mu.Lock()
		ch := p.recovered
		p.mu.Unlock()
		if ch == nil {
			continue
		}
		select {
		case <-ch:
		case <-p.down:
			return p.Err()
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrRecovering, ctx.Err())
		}
	}
}

// send posts one message on the stream's lane: window, credit, sequence,
// piggybacked acknowledgement and credits, one doorbell. buf holds the
// header room and (eager) the payload; rv, if set, is a rendezvous source.
func (p *Peer) send(ctx context.Context, s uint32, h header, buf mr.Buf, rv *mr.Buf) error {
	o := out{buf: buf, bytes: int64(buf.Len())}
	if rv != nil {
		o.rndv, o.hasRV = *rv, true
		o.bytes += int64(rv.Len())
	}
	return p.sendOut(ctx, p.lanes[int(s)%len(p.lanes)], s, h, &o)
}

// sendOut sends o on lane l. CTS and FIN (o.ctl) bypass the send window:
// they answer messages the window already admitted, and waiting for it
// could deadlock against the RTSs it holds.
func (p *Peer) sendOut(ctx context.Context, l *lane, s uint32, h header, o *out) error {
	epoch, err := p.admit(ctx, l, 1, o.bytes, o.ctl)
	if err != nil {
		return err
	}
	return p.postOut(l, s, h, o, epoch)
}

// trySendOut is sendOut for the progress goroutine: it sends o only if
// that needs no waiting (the peer active, window and credit available
// now) and reports whether it did; otherwise o is untouched.
func (p *Peer) trySendOut(l *lane, s uint32, h header, o *out) (bool, error) {
	epoch, ok := p.tryAdmit(l, 1, o.bytes, o.ctl)
	if !ok {
		return false, nil
	}
	return true, p.postOut(l, s, h, o, epoch)
}

// admit takes what m messages of bytes in all (the parts of one, or one)
// need before they are sequenced on lane l: the peer usable, their share
// of the window (not for ctl messages) and m credits, whose epoch it
// returns. On error nothing is held.
func (p *Peer) admit(ctx context.Context, l *lane, m int, bytes int64, ctl bool) (uint32, error) {
	if err := p.waitUsable(ctx); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, p.sendErr(err) // as the window's Acquire would
	}
	if !ctl && !l.win.TryAcquireN(int64(m), bytes) {
		// Full: what the peer acknowledged may not be freed yet.
		p.applyAck(l)
		if err := l.win.AcquireN(ctx, int64(m), bytes); err != nil {
			return 0, p.sendErr(err)
		}
	}
	epoch, err := p.credits.AcquireEpoch(ctx, uint64(m))
	if err != nil {
		p.unadmit(l, m, bytes, ctl)
		return 0, p.sendErr(err)
	}
	return epoch, nil
}

// tryAdmit is admit without waiting, for the progress goroutine: false,
// and nothing held, when the peer is not active or the window or the
// credits are short now.
func (p *Peer) tryAdmit(l *lane, m int, bytes int64, ctl bool) (uint32, bool) {
	if p.state.Load() != stateActive {
		return 0, false
	}
	if !ctl && !l.win.TryAcquireN(int64(m), bytes) {
		p.applyAck(l)
		if !l.win.TryAcquireN(int64(m), bytes) {
			return 0, false
		}
	}
	epoch, ok := p.credits.TryAcquireEpoch(uint64(m))
	if !ok {
		p.unadmit(l, m, bytes, ctl)
	}
	return epoch, ok
}

// unadmit gives back the window share admit took for messages not sent.
func (p *Peer) unadmit(l *lane, m int, bytes int64, ctl bool) {
	if !ctl {
		l.win.ReleaseN(int64(m), bytes)
	}
}

// postOut sequences and posts o once its window share and credit
// (consumed in epoch) are taken.
func (p *Peer) postOut(l *lane, s uint32, h header, o *out, epoch uint32) error {
	var err error
	o.paid = epoch + 1
	l.mu.Lock()
	if p.state.Load() == stateDead {
		l.mu.Unlock()
		p.unadmit(l, 1, o.bytes, o.ctl)
		return p.Err()
	}
	o.seq = l.nextSeq
	l.nextSeq++
	h.Stream, h.Seq = s, o.seq
	po := l.pushOut(o)
	switch {
	case l.live && !l.queued.Load() && epoch == l.epoch:
		err = p.post(l, h, po, compactHeaders)
	case l.live:
		// Resends wait for credits ahead of it: it goes out behind them.
		// Or its credit is of an earlier epoch: it pays again first.
		h.encode(o.buf.Bytes()[:HeaderSize])
		l.queueFrom(o.seq)
		err = p.drainQueued(l)
	default:
		// Recovery is rebuilding the lane: finishResend posts it, in
		// order, behind what it resends, from the header kept here.
		h.encode(o.buf.Bytes()[:HeaderSize])
	}
	l.mu.Unlock()
	if err != nil {
		// The message is queued for resending after recovery.
		p.laneFailed(l, err)
	}
	if !o.ctl {
		p.e.stats.Sent.Add(1)
	}
	return nil
}

func (p *Peer) sendErr(err error) error {
	if errors.Is(err, flow.ErrClosed) {
		if e := p.Err(); e != nil {
			return e
		}
		return ErrClosed
	}
	return err
}

// sendFlags counts a send posted on l and returns its flags: every 16th
// is signaled (its completion frees the send queue's slots before it).
// l.mu is held.
func (l *lane) sendFlags() qp.SendFlags {
	l.sends++
	l.posts++
	if l.sends%16 == 0 {
		return qp.Signaled
	}
	return 0
}

// post writes the header (with fresh acknowledgement and credits) into
// o's buffer and posts it, in one doorbell with what goes with it: a FIN
// behind the RDMA WRITE of its payload (and as a SEND_WITH_INV of the
// window it wrote through), a CTS behind the bind of its window (and the
// lane's fence ahead of that) when the window is not bound on this QP
// yet; a CTS names the window its grant has now (recovery may have bound
// another since it was built). A fresh message (not a resend) may go
// compact, its header in the immediate (wire.go); the full header is
// written into its buffer all the same, for a resend. l.mu is held.
func (p *Peer) post(l *lane, h header, o *out, fresh bool) error {
	buf := o.buf
	n := 0
	var w writeOp
	l.rmu.Lock()
	h.Ack = l.delivered
	if g := o.g; g != nil {
		if g.qp != l.qp {
			if !g.prepared {
				if err := p.e.prepare(g); err != nil {
					l.rmu.Unlock()
					return err
				}
			}
			// The fence first: the bind must not run before everything
			// ahead of it on the QP is complete (grant.go).
			if err := p.e.fenceWRs(l, l.swr[:2]); err != nil {
				l.rmu.Unlock()
				return err
			}
			l.swr[2] = g.bindWR(l.qp)
			n = 3
		}
		body := buf.Bytes()[HeaderSize:]
		setCTSRKey(body, g.rkey)
		if hk := p.e.ctsHook.Load(); hk != nil {
			var c cts
			if c.decode(body, p.e.cfg.MaxMessage) == nil {
				(*hk)(&c)
				c.encode(body)
			}
		}
	}
	if o.write != nil {
		w = *o.write
	}
	l.rmu.Unlock()
	if o.g != nil {
		h.Flags |= flagWindow
	}
	h.Credit, h.Epoch = p.ret.PiggybackEpoch()
	l.ackSent.Store(h.Ack)
	h.encode(buf.Bytes()[:HeaderSize])
	var imm uint32
	compact := false
	if fresh && o.write == nil && n == 0 {
		imm, compact = l.sentHdr.compact(&h)
	}
	l.sentHdr.set(&h)
	flags := l.sendFlags()
	if o.write != nil {
		// Unsignaled like most sends; an error still completes (tagWrite).
		l.ssge[0], l.ssge[1] = w.sge, buf.SGE(buf.Len())
		l.swr[0] = qp.SendWR{ID: tagWrite, Opcode: qp.OpRDMAWrite, SGEs: l.ssge[0:1], RemoteAddr: w.addr, RKey: w.rkey}
		l.swr[1] = qp.SendWR{ID: tagSend, Opcode: qp.OpSend, Flags: flags, SGEs: l.ssge[1:2]}
		if w.inv {
			l.swr[1].Opcode, l.swr[1].InvRKey = qp.OpSendWithInv, w.rkey
		}
		return l.qp.PostSend(l.swr[:2])
	}
	l.ssge[0] = buf.SGE(buf.Len())
	sges := l.ssge[0:1]
	if o.part.Length > 0 {
		l.ssge[1], sges = o.part, l.ssge[0:2]
	}
	op := qp.OpSend
	if compact {
		op = qp.OpSendWithImm
		l.ssge[0].Addr += HeaderSize
		l.ssge[0].Length -= HeaderSize
		p.e.stats.Compact.Add(1)
	}
	if len(sges) == 1 && l.ssge[0].Length <= inlineMax && inlineSends {
		flags |= qp.Inline
	}
	l.swr[n] = qp.SendWR{ID: tagSend, Opcode: op, Flags: flags, SGEs: sges, Imm: imm}
	return l.qp.PostSend(l.swr[:n+1])
}

// queueFrom makes seq, the last message sequenced, the first queued
// unless messages are queued already. l.mu is held.
func (l *lane) queueFrom(seq uint64) {
	if !l.queued.Load() {
		l.queuedFrom = seq
		l.queued.Store(true)
	}
}

func (l *lane) deliveredSeq() uint64 {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	return l.delivered
}

// ack frees what the peer acknowledged on the lane.
func (p *Peer) ack(l *lane, seq uint64) {
	if seq <= l.acked.Load() {
		return
	}
	l.mu.Lock()
	n := 0
	for n < len(l.outs) && l.outs[n].seq <= seq {
		if l.outs[n].hasRV {
			// Delivered: no WRITE of it is resent any more.
			l.rmu.Lock()
			delete(l.targets, l.outs[n].seq)
			l.rmu.Unlock()
		}
		p.freeOut(l, &l.outs[n])
		n++
	}
	l.outs = l.outs[n:] // pushOut takes the room back
	l.acked.Store(seq)
	l.mu.Unlock()
}

// pushOut appends o to the lane's unacknowledged messages and returns
// where it went. l.mu is held. ack drops what the peer acknowledged by
// reslicing outs past it: moving the rest down to the array's start, as
// ack did, was a typed copy (write barriers, memmove) of about 85
// instructions per message on each side of a ping-pong
// (scripts/bench-instr). The room so left at the front is taken back
// here, in one move, when outs reaches the end of its array (at least
// outsMin long: a ping-pong, two messages outstanding, moves one of them
// every 15 messages); outBase is that array from its start.
func (l *lane) pushOut(o *out) *out {
	if len(l.outs) == cap(l.outs) {
		if len(l.outs) < cap(l.outBase) {
			n := copy(l.outBase[:cap(l.outBase)], l.outs)
			clear(l.outBase[n:cap(l.outBase)]) // what was freed keeps nothing alive
			l.outs = l.outBase[:n]
		} else {
			grown := make([]out, len(l.outs), max(2*cap(l.outs), outsMin))
			copy(grown, l.outs)
			l.outs, l.outBase = grown, grown[:0]
		}
	}
	l.outs = append(l.outs, *o)
	return &l.outs[len(l.outs)-1]
}

// outsMin is the fewest entries a lane's outs array has (about 2.3 KiB).
const outsMin = 16

// deferAck records acknowledgement seq on l, to be applied by the pollMu
// holder before its next poll (applyAcks): freeing the acknowledged
// messages is then off the path from a response to its Call's return.
// Only the pollMu holder calls it.
func (p *Peer) deferAck(l *lane, seq uint64) {
	if seq <= l.ackTo.Load() || seq <= l.acked.Load() {
		return
	}
	l.ackTo.Store(seq)
	if !l.ackQueued {
		l.ackQueued = true
		p.e.acks = append(p.e.acks, l)
	}
}

// applyAck applies l's deferred acknowledgement, if any.
func (p *Peer) applyAck(l *lane) {
	if seq := l.ackTo.Load(); seq > l.acked.Load() {
		p.ack(l, seq)
	}
}

// maybeUpdate sends an explicit credit/acknowledgement update when flow
// says one is due, or when acknowledgements have waited. It reports
// whether the peer still has something to tell that may become due with
// no new event: the ticker keeps running while any peer has.
func (p *Peer) maybeUpdate(now time.Time) bool {
	switch p.state.Load() {
	case stateDead:
		return false
	case stateRecovering:
		return true // look again once it is active
	}
	due := p.ret.NeedsUpdate(now)
	busy := false
	for _, l := range p.lanes {
		if l.queued.Load() {
			// Messages waiting for credits: a grant may have come.
			l.mu.Lock()
			err := p.drainQueued(l)
			l.mu.Unlock()
			if err != nil {
				p.laneFailed(l, err)
				return true
			}
		}
		if due || l.ackIdle() {
			p.sendUpdate(l)
			due = false
		}
		// An acknowledgement still owed keeps the ticker running only
		// while a data credit could carry it: without one, the next
		// grant's arrival pokes the ticker (received).
		if l.deliveredSeq() > l.ackSent.Load() && p.credits.Available() > 0 {
			busy = true
		}
	}
	return busy || !p.ret.Quiet()
}

// ackIdle reports whether the lane owes the peer an acknowledgement that
// no message of ours carried for a whole tick: the lane is idle on our
// side, so an explicit one is due. While messages flow each carries the
// newest acknowledgement, and an explicit one would be an extra doorbell
// per tick. Only the ticker calls it.
func (l *lane) ackIdle() bool {
	sent := l.ackSent.Load()
	if l.deliveredSeq() <= sent {
		l.ackWait = 0
		return false
	}
	// Owed. Since the last tick, a message of ours would have moved
	// ackSent past what it was.
	if l.ackWait == sent+1 {
		return true
	}
	l.ackWait = sent + 1
	return false
}

// updateCredit takes the credit an explicit update consumes at the peer.
// The peer's last credit (flow.ControlReserve) may go only to an update
// that returns credits, so that its receiver can send again once it
// arrives; an update that only acknowledges takes a data credit or waits.
// Spent on acknowledgements, the reserve ran out on both sides at once:
// each then owed the other credits it could never send (bx
// TestEchoBufferOrder hung so; TestUpdateCredit checks the rule).
func (p *Peer) updateCredit() bool {
	if p.ret.Pending() > 0 {
		return p.credits.TryAcquireControl()
	}
	return p.credits.TryAcquire(1)
}

func (p *Peer) sendUpdate(l *lane) {
	l.mu.Lock()
	if !l.live || !p.updateCredit() {
		l.mu.Unlock()
		return
	}
	// Unsequenced and inline: the device copies the 48 bytes at post
	// time, so the lane's scratch header is free again at once, and an
	// update is never resent (the next one carries newer values).
	h := header{Type: typCredit}
	h.Ack = l.deliveredSeq()
	h.Credit, h.Epoch = p.ret.PiggybackEpoch()
	l.ackSent.Store(h.Ack)
	l.sentHdr.set(&h)
	h.encode(l.scratch[:])
	l.ssge[0] = qp.SGE{Addr: uint64(uintptr(unsafe.Pointer(&l.scratch[0]))), Length: HeaderSize}
	l.swr[0] = qp.SendWR{ID: tagSend, Opcode: qp.OpSend, Flags: qp.Inline, SGEs: l.ssge[0:1]}
	err := l.qp.PostSend(l.swr[:1])
	l.posts++
	l.mu.Unlock()
	p.e.stats.CreditUpdates.Add(1)
	if err != nil {
		p.laneFailed(l, err)
	}
}

// received handles one message that landed in an SRQ buffer through the
// lane's QP qpn. The lane's receive lock is held from the staleness check
// to the message's place in the sequence, so a message of a QP that
// recovery already replaced is dropped whole (the peer resends it): the
// next sequence recovery reports is exact.
func (p *Peer) received(l *lane, b mr.Buf, n int, qpn, inv uint32, imm uint32, compact bool) {
	p.receive(l, b, n, qpn, inv, imm, compact)
	// An acknowledgement or credits to return, sooner or later: the ticker
	// is poked after every change receive makes (Consumed, a control
	// buffer re-posted, the delivered sequence), never before. Poked
	// first, the ticker could take the poke, look before the change, find
	// nothing due and sleep with an update owed and no event left to wake
	// it: two peers starved of credits then waited on each other for good
	// (bx TestEchoBufferOrder hung so, with 4 credits, in about half of
	// the full suite runs). A call after the body, not a defer: receive
	// has too many returns for an open-coded defer, and the runtime's
	// deferreturn cost about 250 instructions a message
	// (scripts/bench-instr, docs/perf.md "Thirty-fourth session").
	p.e.poke()
}

// receive is received's body.
func (p *Peer) receive(l *lane, b mr.Buf, n int, qpn, inv uint32, imm uint32, compact bool) {
	if f := receivedHook.Load(); f != nil {
		(*f)()
	}
	var h header
	data := b.Bytes()[:n]
	l.rmu.Lock()
	if l.rqpn != qpn {
		l.rmu.Unlock()
		p.e.stats.Unrouted.Add(1)
		p.e.repost(b)
		return
	}
	fail := func(err error, consumed bool) {
		l.rmu.Unlock()
		p.e.repost(b)
		if consumed {
			p.ret.Released(1)
		}
		p.shutdown(fmt.Errorf("%w: %v", ErrProtocol, err), true)
	}
	// Everything up to held is here, delivered or pending: a resend of
	// any of it is a duplicate, and a compact message is held+1.
	held := l.delivered + uint64(len(l.pending))
	// A compact message's payload starts the buffer; its header is the
	// last one's with the changes its immediate names (wire.go).
	off := HeaderSize
	if compact {
		off = 0
		if err := l.rcvdHdr.expand(imm, held+1, n, &h); err != nil {
			fail(err, false)
			return
		}
	} else if err := h.decode(data); err != nil {
		fail(err, false)
		return
	}
	l.rcvdHdr.set(&h)
	if err := p.ret.Consumed(1); err != nil {
		fail(err, false)
		return
	}
	if err := p.credits.Grant(h.Credit, h.Epoch); err != nil && errors.Is(err, flow.ErrImpossibleGrant) {
		fail(err, true)
		return
	}
	if h.Type == typCredit {
		l.rmu.Unlock()
		p.ack(l, h.Ack)
		p.e.repost(b)
		p.ret.ReleasedControl(1)
		return
	}
	if h.Type == typData || h.Type == typRndv {
		p.e.stats.Received.Add(1)
	}
	if h.Seq <= held {
		l.rmu.Unlock()
		p.ack(l, h.Ack)
		p.e.repost(b)
		p.ret.Released(1)
		p.e.stats.Duplicates.Add(1)
		return
	}
	if h.Seq != held+1 {
		fail(fmt.Errorf("lane %d sequence %d, expected %d", l.idx, h.Seq, held+1), true)
		return
	}
	if h.Type == typSplit || h.Type == typPart || l.split != nil {
		// A split message's part (split.go); nothing else comes between.
		if protocol, err := p.takePart(l, &h, data); err != nil {
			if protocol {
				fail(err, true)
				return
			}
			l.rmu.Unlock()
			p.e.repost(b)
			p.ret.Released(1)
			p.shutdown(err, true)
			return
		}
		ready := l.flush()
		l.rmu.Unlock()
		p.ack(l, h.Ack)
		p.e.repost(b)
		p.ret.Released(1)
		p.deliverAll(ready)
		return
	}
	if h.Type == typData && len(l.pending) == 0 {
		// In order with nothing pending (the common case): delivered at
		// once, without a pending entry. A request goes to its handler
		// before the acknowledgement frees what it acknowledges, so that
		// an inline handler's response leaves first; a response after it,
		// so that its caller's next Call finds the window free.
		m := p.e.newMsg()
		*m = Msg{p: p, Stream: h.Stream, buf: b, data: data[off:], call: h.CallID, flags: h.Flags}
		p.e.liveMsgs.Add(1)
		l.delivered++
		l.rmu.Unlock()
		if h.Flags&flagRequest != 0 {
			p.deliver(m)
			p.ack(l, h.Ack)
			return
		}
		// A response: its caller returns before what the acknowledgement
		// frees is freed (deferAck).
		p.deliver(m)
		p.deferAck(l, h.Ack)
		return
	}
	in := l.newInbound(h)
	switch h.Type {
	case typRndv:
		var d rndv
		if err := d.decode(data[HeaderSize:], p.e.cfg.MaxMessage); err != nil {
			fail(err, true)
			return
		}
		t, err := p.e.large.Alloc(int(d.Len))
		if err != nil {
			l.rmu.Unlock()
			p.e.repost(b)
			p.ret.Released(1)
			p.shutdown(fmt.Errorf("bx: rendezvous of %d bytes: %w", d.Len, err), true)
			return
		}
		// By default the peer writes t through a window of its own, bound
		// with the CTS (grant.go); with SharedTargets through the pool's rkey.
		var g *grant
		if !p.e.cfg.SharedTargets {
			var err error
			g, err = p.e.newGrant(t, int(d.Len))
			if err == nil {
				err = p.e.prepare(g)
			}
			if err != nil {
				p.e.closeGrant(g)
				p.e.large.Free(t)
				l.rmu.Unlock()
				p.e.repost(b)
				p.ret.Released(1)
				p.shutdown(fmt.Errorf("bx: rendezvous of %d bytes: %w", d.Len, err), true)
				return
			}
		}
		in.g = g
		in.msg = p.e.newMsg()
		*in.msg = Msg{p: p, Stream: h.Stream, buf: t, large: true, data: t.Bytes()[:d.Len], call: h.CallID, flags: h.Flags}
		p.e.liveMsgs.Add(1)
		l.pending = append(l.pending, in)
		// A window's rkey goes in when the CTS is posted: recovery may
		// bind a new window meanwhile.
		c := cts{Ref: h.Seq, Addr: t.Addr(), RKey: t.RKey(), Len: d.Len}
		l.rmu.Unlock()
		// The request's buffer goes back at once; the payload will land
		// in a buffer of our own that the peer WRITEs.
		p.ack(l, h.Ack)
		p.e.repost(b)
		p.ret.Released(1)
		p.e.stats.Rendezvous.Add(1)
		if hk := p.e.ctsHook.Load(); hk != nil && g == nil {
			(*hk)(&c) // a window's CTS is forged as it is posted
		}
		if !p.sendCTS(l, h.Stream, c, g, true) {
			go p.sendCTS(l, h.Stream, c, g, false)
		}
		return
	case typCTS, typFin:
		var c cts
		var f fin
		var err error
		if h.Type == typCTS {
			if err = c.decode(data[HeaderSize:], p.e.cfg.MaxMessage); err == nil {
				err = l.cleared(c, h.Flags&flagWindow != 0)
			}
		} else if err = f.decode(data[HeaderSize:]); err == nil {
			err = l.finished(f.Ref, inv)
		}
		if err != nil {
			fail(err, true)
			return
		}
		// Neither is delivered; each holds its place in the sequence.
		in.done = true
		l.pending = append(l.pending, in)
		ready := l.flush()
		l.rmu.Unlock()
		p.ack(l, h.Ack)
		p.e.repost(b)
		p.ret.Released(1)
		if h.Type == typCTS {
			if hk := p.e.finHook.Load(); hk != nil {
				p.heldFin(*hk, l, h.Stream, c)
			} else if !p.sendFin(l, h.Stream, c, true) {
				go p.sendFin(l, h.Stream, c, false)
			}
		}
		p.deliverAll(ready)
		return
	}
	in.msg = p.e.newMsg()
	*in.msg = Msg{p: p, Stream: h.Stream, buf: b, data: data[off:], call: h.CallID, flags: h.Flags}
	p.e.liveMsgs.Add(1)
	in.done = true
	// Behind a rendezvous whose FIN has not come (pending's head), the
	// message waits: copied out, its receive buffer goes back at once.
	// Held, it would keep a credit, and with every credit so held the
	// peer could not send the FIN that frees them: bx deadlocked so with
	// few credits and both sides sending rendezvous and eager messages
	// (TestPendingHoldsNoCredit).
	copied := len(l.pending) > 0 && p.copyOut(in.msg)
	l.pending = append(l.pending, in)
	ready := l.flush()
	l.rmu.Unlock()
	if copied {
		p.e.repost(b)
		p.ret.Released(1)
	}
	p.ack(l, h.Ack)
	p.deliverAll(ready)
}

// copyOut moves m's payload from its receive buffer into a buffer of the
// eager pool and reports whether it did (not if the pool is out of
// memory: m then keeps its receive buffer).
func (p *Peer) copyOut(m *Msg) bool {
	c, err := p.e.eager.Alloc(len(m.data))
	if err != nil {
		return false
	}
	n := copy(c.Bytes(), m.data)
	m.buf, m.data, m.copied = c, c.Bytes()[:n], true
	p.e.stats.Copied.Add(1)
	return true
}

// teardownHook is a test hook (export_test.go): it runs in a peer's
// shutdown after the peer left the endpoint's peers, before its lanes are
// torn down.
var teardownHook atomic.Pointer[func(*Peer)]

// receivedHook is a test hook (export_test.go): it runs as each message
// starts being handled, before anything of it is recorded.
var receivedHook atomic.Pointer[func()]

// heldFin runs the test hook hk, then sends the FIN, on a goroutine (a
// function of its own: a closure in received would move received's header
// to the heap on every call).
func (p *Peer) heldFin(hk func(cts), l *lane, stream uint32, c cts) {
	go func() {
		hk(c)
		p.sendFin(l, stream, c, false)
	}()
}

// finished marks the rendezvous with sequence ref done: its FIN arrived,
// as a SEND_WITH_INV that closed the transfer's window (inv, 0 if the
// receive did not invalidate). l.rmu is held.
func (l *lane) finished(ref uint64, inv uint32) error {
	for _, in := range l.pending {
		if in.h.Seq == ref {
			if in.h.Type != typRndv || in.msg == nil || !in.msg.large || in.done {
				break
			}
			if in.g == nil {
				// No window (Config.SharedTargets): nothing to invalidate.
				if inv != 0 {
					return fmt.Errorf("lane %d: FIN for sequence %d invalidated rkey %#x, and no window was granted", l.idx, ref, inv)
				}
				in.done = true
				return nil
			}
			if inv != in.g.rkey || inv == 0 {
				// The window may still be open: the peer is shut down,
				// which closes it.
				return fmt.Errorf("lane %d: FIN for sequence %d invalidated rkey %#x, not its window %#x", l.idx, ref, inv, in.g.rkey)
			}
			l.peer.e.finishGrant(in.g)
			in.g = nil
			in.done = true
			return nil
		}
	}
	return fmt.Errorf("lane %d: FIN for sequence %d, which is no rendezvous in progress", l.idx, ref)
}

// cleared records the window the peer's CTS names for our rendezvous: the
// WRITE and the FIN go there, also when resent (recovery may point them at
// a new window, applyRegrants). Recorded under l.rmu, like recovery's
// view of what arrived, so a CTS of a replaced QP never overrides a
// window recovery named. l.rmu is held.
func (l *lane) cleared(c cts, window bool) error {
	if _, dup := l.targets[c.Ref]; dup {
		return fmt.Errorf("lane %d: a second clear-to-send for sequence %d", l.idx, c.Ref)
	}
	if l.targets == nil {
		l.targets = map[uint64]*writeOp{}
	}
	l.targets[c.Ref] = &writeOp{addr: c.Addr, rkey: c.RKey, inv: window}
	return nil
}

// sendCTS tells the peer where to write the payload of its RTS. With try
// (the goroutine polling the CQ, which must not wait) it sends only if that
// needs no waiting and reports whether it did, so that a rendezvous costs
// no goroutine hand-off while credits are there (under TCG a hand-off to
// another thread costs more than the CTS itself); without, on a goroutine
// of its own, it may wait for a credit. The CTS is final: tests forge it
// before the first try.
func (p *Peer) sendCTS(l *lane, stream uint32, c cts, g *grant, try bool) (done bool) {
	if try && !p.canSendNow() {
		return false
	}
	b, err := p.e.eager.Alloc(HeaderSize + ctsSize)
	if err != nil {
		p.shutdown(fmt.Errorf("bx: rendezvous answer: %w", err), true)
		return true
	}
	c.encode(b.Bytes()[HeaderSize:])
	return p.sendCtl(l, stream, header{Type: typCTS, Length: ctsSize}, out{buf: b, ctl: true, g: g}, try)
}

// sendFin writes the payload the peer's CTS asks for and posts the FIN
// behind it; try as for sendCTS.
func (p *Peer) sendFin(l *lane, stream uint32, c cts, try bool) (done bool) {
	if try && !p.canSendNow() {
		return false
	}
	l.mu.Lock()
	var src mr.Buf
	found := false
	for _, o := range l.outs {
		if o.seq == c.Ref {
			src, found = o.rndv, o.hasRV
			break
		}
	}
	var w *writeOp
	if found {
		l.rmu.Lock()
		if w = l.targets[c.Ref]; w != nil {
			w.sge = src.SGE(src.Len())
		}
		l.rmu.Unlock()
	}
	l.mu.Unlock()
	switch {
	case !found || w == nil:
		if p.state.Load() != stateDead {
			p.shutdown(fmt.Errorf("%w: lane %d: clear-to-send for sequence %d, which is no rendezvous of ours", ErrProtocol, l.idx, c.Ref), true)
		}
		return true
	case int(c.Len) != src.Len():
		p.shutdown(fmt.Errorf("%w: lane %d: clear-to-send of %d bytes for a %d-byte rendezvous", ErrProtocol, l.idx, c.Len, src.Len()), true)
		return true
	}
	b, err := p.e.eager.Alloc(HeaderSize + finSize)
	if err != nil {
		p.shutdown(fmt.Errorf("bx: rendezvous FIN: %w", err), true)
		return true
	}
	(&fin{Ref: c.Ref}).encode(b.Bytes()[HeaderSize:])
	o := out{buf: b, ctl: true, write: w}
	return p.sendCtl(l, stream, header{Type: typFin, Length: finSize}, o, try)
}

// canSendNow reports whether a control message could go out without
// waiting: the peer active and a credit there. A cheap pre-check, so that
// a try does not build what it cannot send; trySendOut decides.
func (p *Peer) canSendNow() bool {
	return p.state.Load() == stateActive && p.credits.Available() > 0
}

// sendCtl sends the control message o (its buffer from the eager pool):
// with try only if that needs no waiting (false, o's buffer freed, if it
// would), else waiting for a credit.
func (p *Peer) sendCtl(l *lane, stream uint32, h header, o out, try bool) bool {
	if try {
		sent, err := p.trySendOut(l, stream, h, &o)
		if !sent || err != nil {
			p.e.eager.Free(o.buf)
		}
		return sent
	}
	if err := p.sendOut(p.e.stopCh, l, stream, h, &o); err != nil {
		p.e.eager.Free(o.buf)
	}
	return true
}

// newInbound is a pending entry for h, reused when one is free. l.rmu is
// held.
func (l *lane) newInbound(h header) *inbound {
	if n := len(l.free); n > 0 {
		in := l.free[n-1]
		l.free = l.free[:n-1]
		*in = inbound{h: h}
		return in
	}
	return &inbound{h: h}
}

// flush takes the delivered prefix of the pending list: its messages go
// into l.ready (the pollMu holder's, the only caller), its entries
// back to the free list. l.rmu is held.
func (l *lane) flush() []*Msg {
	n := 0
	for n < len(l.pending) && l.pending[n].done {
		n++
	}
	if n == 0 {
		return nil
	}
	ready := l.ready[:0]
	for _, in := range l.pending[:n] {
		if in.msg != nil {
			ready = append(ready, in.msg)
		}
		*in = inbound{}
		l.free = append(l.free, in)
	}
	l.ready = ready
	k := copy(l.pending, l.pending[n:])
	clear(l.pending[k:])
	l.pending = l.pending[:k]
	l.delivered += uint64(n)
	return ready
}

func (p *Peer) deliverAll(ready []*Msg) {
	for i, m := range ready {
		ready[i] = nil
		p.deliver(m)
	}
}

// laneFailed starts recovery after a QP error.
func (p *Peer) laneFailed(l *lane, err error) {
	if p.state.Load() != stateActive {
		return
	}
	p.startRecovery(err)
}
