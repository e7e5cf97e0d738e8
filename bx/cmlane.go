package bx

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/qp"
)

// Lanes through the connection manager (Config.LaneSetup = LaneSetupCM).
//
// The control connection is set up and authenticated as always (token
// challenge, TLS if configured); what changes is how each lane's RC QP is
// connected. The accepting endpoint listens on rdma_cm at its device's IP
// address (the address its RoCE v2 GID carries) and tells the dialer, in
// its setup message, that address and a random 16-byte key for this peer.
// The dialer makes one rdma_cm connection per lane: an ID resolved from
// its own device's address to that one, the lane's QP created on the ID,
// and a connect request whose private data is the key, the recovery epoch
// and the lane's index. The acceptor accepts only a request that carries
// the key of a peer it is setting up, for the epoch it is in and a lane
// not connected yet in it; any other request (a stranger's, a replay, a
// stale epoch's) is rejected, and the peers already connected do not
// notice. Recovery closes every lane's ID (which destroys its QP) and
// connects new ones the same way, in a new epoch.

// LaneSetup is how an endpoint connects the RC QPs of its lanes to a peer.
// Both ends of a connection must use the same.
type LaneSetup uint8

const (
	// LaneSetupExchange: each side creates its QPs, the control connection
	// carries QP numbers, PSNs and GIDs, and each side moves its own QPs
	// to RTS (the default).
	LaneSetupExchange LaneSetup = iota
	// LaneSetupCM: each lane is an rdma_cm connection (package cm) from
	// the dialer to a listener of the acceptor on its device's IP address,
	// bound to the authenticated control session by a key in the connect
	// request's private data. It needs the rdma_ucm module and a device
	// with an IP-based GID (RoCE v2).
	LaneSetupCM
)

func (s LaneSetup) String() string {
	switch s {
	case LaneSetupExchange:
		return "exchange"
	case LaneSetupCM:
		return "cm"
	}
	return fmt.Sprintf("LaneSetup(%d)", uint8(s))
}

// cmSetup is what a setup message says about rdma_cm lanes: a dialer sends
// an empty one (it uses rdma_cm), an acceptor its listener and the key.
type cmSetup struct {
	Addr netip.AddrPort
	Key  [16]byte
}

// cmSetupSize is the encoded trailer of a setup: a marker, the address (16
// bytes, IPv4 mapped), the port, the key.
const cmSetupSize = 1 + 16 + 2 + 16

func (c *cmSetup) encode() []byte {
	b := make([]byte, cmSetupSize)
	b[0] = 'C'
	if c.Addr.IsValid() {
		a := c.Addr.Addr().As16()
		copy(b[1:17], a[:])
		binary.LittleEndian.PutUint16(b[17:], c.Addr.Port())
	}
	copy(b[19:], c.Key[:])
	return b
}

func decodeCMSetup(b []byte) (*cmSetup, error) {
	if len(b) != cmSetupSize || b[0] != 'C' {
		return nil, fmt.Errorf("bx: setup with %d bytes of rdma_cm data", len(b))
	}
	c := &cmSetup{}
	if port := binary.LittleEndian.Uint16(b[17:]); port != 0 {
		c.Addr = netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[1:17])).Unmap(), port)
	}
	copy(c.Key[:], b[19:])
	return c, nil
}

// Private data of a lane's connect request.
const (
	cmMagic    = "bxL1"
	cmDataSize = 4 + 16 + 4 + 1 // magic, key, epoch, lane
)

func cmConnectData(key [16]byte, epoch uint32, lane int) []byte {
	b := make([]byte, cmDataSize)
	copy(b, cmMagic)
	copy(b[4:], key[:])
	binary.LittleEndian.PutUint32(b[20:], epoch)
	b[24] = uint8(lane)
	return b
}

// endpointCM is an endpoint's rdma_cm state.
type endpointCM struct {
	ch   *cm.Channel
	src  netip.Addr // the device's IP address (from its GID)
	once sync.Once

	mu    sync.Mutex
	ln    *cm.ID
	addr  netip.AddrPort       // the listener's address, once listening
	waits map[[16]byte]*cmWait // peers being set up or recovered, by key

	removed error // the device's removal (removal.go), once reported
}

// cmWait is an acceptor's peer that may get lane connections: while it
// connects the lanes of epoch (open), requests with its key and that epoch
// go to reqs. Its fields but reqs are under endpointCM.mu.
type cmWait struct {
	reqs  chan cmReq
	open  bool
	epoch uint32
}

type cmReq struct {
	id    *cm.ID
	epoch uint32
	lane  int
}

// peerCM is a peer's rdma_cm state: the acceptor's listener address and
// the key of the connection (both sides), and on the dialer the
// acceptor's confirmations that its lanes of a recovery epoch are up.
type peerCM struct {
	addr netip.AddrPort
	key  [16]byte
	up   chan uint32 // dialer: epochs the acceptor confirmed (ctlLanesUp)
}

// openCM opens the endpoint's rdma_cm channel (Config.LaneSetup CM).
func (e *Endpoint) openCM() error {
	ip, ok := netip.AddrFromSlice(e.gid.GID.To16())
	ip = ip.Unmap()
	if !ok || ip.Is6() && ip.IsLinkLocalUnicast() {
		return fmt.Errorf("Config.LaneSetup %v: the GID %v of %s is no IP address (rdma_cm lanes need RoCE v2)", LaneSetupCM, e.gid.GID, e.cfg.Device)
	}
	ch, err := cm.Open()
	if err != nil {
		return fmt.Errorf("Config.LaneSetup %v: %w", LaneSetupCM, err)
	}
	e.lcm = &endpointCM{ch: ch, src: ip, waits: map[[16]byte]*cmWait{}}
	return nil
}

// closeCM destroys every rdma_cm ID left (the listener; lanes' IDs are
// destroyed with their peers) and the channel. The peers are shut down.
func (e *Endpoint) closeCM() error {
	if e.lcm == nil {
		return nil
	}
	return e.lcm.ch.Close()
}

// listenCM makes the endpoint's rdma_cm listener, once, on its device's
// address (port chosen by the kernel), and serves its connect requests.
func (e *Endpoint) listenCM() error {
	c := e.lcm
	var err error
	c.once.Do(func() {
		var ln *cm.ID
		if ln, err = c.ch.CreateID(cm.TCP); err != nil {
			return
		}
		if err = ln.Bind(netip.AddrPortFrom(c.src, 0)); err == nil {
			err = ln.Listen(2 * maxLanes * e.cfg.MaxPeers)
		}
		var rt cm.Route
		if err == nil {
			rt, err = ln.Query()
		}
		if err == nil && rt.Src.Port() == 0 {
			err = errors.New("the kernel reports port 0 for the listener")
		}
		if err != nil {
			ln.Close()
			err = fmt.Errorf("rdma_cm listener on %v: %w", c.src, err)
			return
		}
		c.mu.Lock()
		c.ln, c.addr = ln, netip.AddrPortFrom(c.src, rt.Src.Port())
		c.mu.Unlock()
		e.wg.Add(1)
		go e.serveCM(ln)
	})
	if err == nil && !e.cmAddr().IsValid() {
		err = errors.New("rdma_cm listener failed")
	}
	return err
}

func (e *Endpoint) cmAddr() netip.AddrPort {
	e.lcm.mu.Lock()
	defer e.lcm.mu.Unlock()
	return e.lcm.addr
}

// Reject reasons' private data (what a refused dialer reads).
var (
	cmRejectUnknown = []byte("bx: no such lane session")
	cmRejectBusy    = []byte("bx: lane session busy")
)

// serveCM takes the listener's connect requests: one that carries the key
// of a peer being set up goes to it, any other is rejected and destroyed.
func (e *Endpoint) serveCM(ln *cm.ID) {
	defer e.wg.Done()
	for {
		ev, err := ln.GetRequest(e.stopCh)
		if err != nil {
			if errors.Is(err, cm.ErrDeviceRemoved) {
				e.deviceRemoved()
				return
			}
			var ee *cm.EventError
			if errors.As(err, &ee) && e.stopCh.Err() == nil {
				continue // an error event of the listener's: it keeps listening
			}
			return // closed, stopped, or the channel failed
		}
		id, d := ev.ID, ev.PrivateData
		var key [16]byte
		ok := len(d) >= cmDataSize && bytes.Equal(d[:4], []byte(cmMagic)) &&
			int(d[24]) < maxLanes
		epoch := binary.LittleEndian.Uint32(d[20:])
		why := cmRejectUnknown // the reason given, nil once handed over
		if ok {
			copy(key[:], d[4:20])
			// Handed over under the lock: cmForget deletes the key under
			// it and then drains what was handed over, so a request is
			// either drained there or never handed to a forgotten peer
			// (where nothing would take it, nor reject it).
			e.lcm.mu.Lock()
			// Not connecting lanes of that epoch now: a replay, or stale.
			if w := e.lcm.waits[key]; w != nil && w.open && w.epoch == epoch {
				select {
				case w.reqs <- cmReq{id: id, epoch: epoch, lane: int(d[24])}:
					why = nil
				default:
					why = cmRejectBusy
				}
			}
			e.lcm.mu.Unlock()
		}
		if why != nil {
			e.stats.CMRejected.Add(1)
			id.Reject(why, 0)
			id.Close()
		}
	}
}

// cmAwait registers the acceptor's peer p for lane connections under a new
// key.
func (p *Peer) cmAwait() error {
	var key [16]byte
	if _, err := rand.Read(key[:]); err != nil {
		return err
	}
	c := p.e.lcm
	c.mu.Lock()
	// Open for the handshake's lanes (epoch 0) before the dialer learns
	// the key.
	c.waits[key] = &cmWait{reqs: make(chan cmReq, 2*maxLanes), open: true}
	c.mu.Unlock()
	p.lcm = &peerCM{addr: p.e.cmAddr(), key: key}
	return nil
}

// cmExpect opens the acceptor's registration for the lanes of a recovery
// epoch: before the dialer has our answer, which makes it connect them (a
// request that came before would be refused as stale). acceptLanes closes
// it.
func (p *Peer) cmExpect(epoch uint32) {
	c := p.e.lcm
	c.mu.Lock()
	if w := c.waits[p.lcm.key]; w != nil {
		w.open, w.epoch = true, epoch
	}
	c.mu.Unlock()
}

// cmForget ends p's registration: its key is refused from now on. The
// requests it had not taken are rejected.
func (p *Peer) cmForget() {
	if p.lcm == nil || p.dialer {
		return
	}
	c := p.e.lcm
	c.mu.Lock()
	w := c.waits[p.lcm.key]
	delete(c.waits, p.lcm.key)
	c.mu.Unlock()
	if w == nil {
		return
	}
	for {
		select {
		case r := <-w.reqs:
			r.id.Reject(cmRejectUnknown, 0)
			r.id.Close()
		default:
			return
		}
	}
}

// localCM is what our setup says about rdma_cm lanes, or nil.
func (p *Peer) localCM() *cmSetup {
	if p.e.lcm == nil {
		return nil
	}
	if p.dialer {
		return &cmSetup{}
	}
	return &cmSetup{Addr: p.lcm.addr, Key: p.lcm.key}
}

// checkCM compares the peer's lane setup with ours and, on the dialer,
// keeps the acceptor's listener and key.
func (p *Peer) checkCM(remote setup) error {
	if (p.e.lcm != nil) != (remote.CM != nil) {
		ours, theirs := LaneSetupExchange, LaneSetupCM
		if p.e.lcm != nil {
			ours, theirs = theirs, ours
		}
		acc, dial := ours, theirs
		if p.dialer {
			acc, dial = dial, acc
		}
		return fmt.Errorf("%w: the acceptor sets lanes up with Config.LaneSetup %v, the dialer with %v", ErrProtocol, acc, dial)
	}
	if p.e.lcm != nil {
		if err := p.e.lcm.removedErr(); err != nil {
			return err
		}
	}
	if p.e.lcm != nil && p.dialer {
		if !remote.CM.Addr.IsValid() {
			return fmt.Errorf("%w: the acceptor names no rdma_cm listener", ErrProtocol)
		}
		p.lcm = &peerCM{addr: remote.CM.Addr, key: remote.CM.Key, up: make(chan uint32, 1)}
	}
	return nil
}

// laneQPConfig is the configuration of a lane's QP.
func laneQPConfig(e *Endpoint) qp.Config {
	return qp.Config{SendCQ: e.cq, RecvCQ: e.cq, SRQ: e.srq,
		MaxSendWR: uint32(laneSendWR(&e.cfg)), MaxInline: inlineMax,
		MaxSendSGE: 2} // a part of a split message: its header, its share of the payload
}

// inlineMax is the largest message (header and payload) a lane posts
// inline: the device copies it from the work request at post time, with
// no lookup of the buffer's memory region (rxe's copy from the region is
// what a small send spends most of its kernel time on after the packet's
// own work). Every lane QP is created to take it.
const inlineMax = 256

// inlineSends: GOVERBS_BX_INLINE=0 posts every message from its buffer
// (A/B).
var inlineSends = os.Getenv("GOVERBS_BX_INLINE") != "0"

// qpn is the lane's QP number, 0 while it has no QP (rdma_cm lanes between
// recovery's teardown and their new connection).
func (l *lane) qpn() uint32 {
	if l.qp == nil {
		return 0
	}
	return l.qp.QPN()
}

// closeQP destroys the lane's QP, and with rdma_cm lanes its ID (which
// disconnects it). l.mu is held or the lane is no one else's.
func (l *lane) closeQP() {
	if l.cm != nil {
		l.cm.Close() // the QP first, then the ID
		l.cm = nil
	} else if l.qp != nil {
		l.qp.Close()
	}
}

// setQP makes q the lane's QP: routed, and the QP whose receives count.
// It is not live yet. l.mu is held.
func (l *lane) setQP(q *qp.QP) {
	l.qp, l.live, l.sentHdr = q, false, hdrTrack{}
	l.rmu.Lock()
	l.rqpn, l.rcvdHdr = q.QPN(), hdrTrack{}
	l.rmu.Unlock()
	e := l.peer.e
	e.mu.Lock()
	e.byQPN[q.QPN()] = l
	e.publishQPNs()
	e.mu.Unlock()
}

// install makes q (on id) the lane's QP (setQP).
func (l *lane) install(id *cm.ID, q *qp.QP) {
	l.mu.Lock()
	l.cm = id
	l.setQP(q)
	l.mu.Unlock()
}

// cmConnParam is what both sides of a lane's connection ask for: no RDMA
// READ (bx never reads; 1 is the least the connection manager takes), the
// retry count and ACK timeout of lanes set up by exchange (6: 7 would
// retry forever on rxe; 14, 67 ms, where the kernel's for the route is 19,
// 2.1 s, so a peer's dead QP would be noticed only after about 15 s).
func cmConnParam(data []byte) cm.ConnParam {
	return cm.ConnParam{PrivateData: data, ResponderResources: 1, InitiatorDepth: 1, RetryCount: 6, ACKTimeout: 14}
}

// connectCM connects the lanes of epoch through rdma_cm: the dialer
// connects each to the acceptor's listener, the acceptor accepts the
// dialer's requests. The lanes have no QP before (newLanes, rebuild).
func (p *Peer) connectCM(epoch uint32) error {
	d := p.e.cfg.HandshakeTimeout
	if epoch > 0 {
		// A recovery round: the acceptor waits for the lanes on its
		// control goroutine, deaf to the dialer's next round meanwhile,
		// and every round must fit in PeerTimeout.
		d = min(d, p.e.cfg.PeerTimeout/2)
	}
	ctx, cancel := context.WithTimeout(p.e.stopCh, d)
	defer cancel()
	if !p.dialer {
		return p.acceptLanes(ctx, epoch)
	}
	// The acceptor's side of the round failed (it asks for another): the
	// connects it will not answer are abandoned at once.
	stop, exited := make(chan struct{}), make(chan struct{})
	asked := false
	go func() {
		defer close(exited)
		select {
		case <-p.askCh:
			asked = true
			cancel()
		case <-p.down:
			cancel()
		case <-stop:
		}
	}()
	var err error
	for _, l := range p.lanes {
		if err = p.dialLane(ctx, l, epoch); err != nil {
			err = fmt.Errorf("lane %d: %w", l.idx, err)
			break
		}
	}
	close(stop)
	<-exited
	switch {
	case asked && err != nil:
		return &retryError{fmt.Errorf("peer failed its side of recovery epoch %d", epoch)}
	case asked:
		// Every lane connected just as the ask came: the round's next
		// step (awaitLanesUp) sees it.
		select {
		case p.askCh <- struct{}{}:
		default:
		}
	}
	return err
}

func (p *Peer) dialLane(ctx context.Context, l *lane, epoch uint32) error {
	e := p.e
	id, err := e.lcm.ch.CreateID(cm.TCP)
	if err != nil {
		return err
	}
	if err := id.ResolveAddr(ctx, e.lcm.src, p.lcm.addr); err != nil {
		id.Close()
		return err
	}
	if err := id.ResolveRoute(ctx); err != nil {
		id.Close()
		return err
	}
	q, err := id.CreateQP(e.pd, laneQPConfig(e))
	if err != nil {
		id.Close()
		return err
	}
	// Routed before it connects: the acceptor may send as soon as it has
	// our RTU.
	l.install(id, q)
	if _, err := id.Connect(ctx, cmConnParam(cmConnectData(p.lcm.key, epoch, l.idx))); err != nil {
		return err // the lane's ID goes with the lane (closeQP)
	}
	e.watchLane(id)
	return nil
}

// acceptLanes takes the dialer's connect requests for the lanes of epoch
// and accepts each on a new QP.
func (p *Peer) acceptLanes(ctx context.Context, epoch uint32) error {
	c := p.e.lcm
	c.mu.Lock()
	w := c.waits[p.lcm.key]
	c.mu.Unlock()
	if w == nil {
		return ErrClosed
	}
	defer func() {
		c.mu.Lock()
		w.open = false
		c.mu.Unlock()
	}()
	done := make([]bool, len(p.lanes))
	for left := len(p.lanes); left > 0; {
		var r cmReq
		select {
		case r = <-w.reqs:
		case <-p.down:
			return p.Err()
		case <-ctx.Done():
			return fmt.Errorf("rdma_cm: %d of %d lanes not connected by the dialer: %w", left, len(p.lanes), ctx.Err())
		}
		if r.epoch != epoch || r.lane >= len(p.lanes) || done[r.lane] {
			// A stale round's, or a replay: the lane's own request is
			// still to come.
			p.e.stats.CMRejected.Add(1)
			r.id.Reject(cmRejectUnknown, 0)
			r.id.Close()
			continue
		}
		l := p.lanes[r.lane]
		q, err := r.id.CreateQP(p.e.pd, laneQPConfig(p.e))
		if err != nil {
			r.id.Reject(nil, 0)
			r.id.Close()
			return fmt.Errorf("lane %d: %w", r.lane, err)
		}
		l.install(r.id, q)
		if _, err := r.id.Accept(ctx, cmConnParam(nil)); err != nil {
			// The dialer's connect fails now rather than at its timeout.
			r.id.Reject(nil, 0)
			return fmt.Errorf("lane %d: %w", r.lane, err)
		}
		p.e.watchLane(r.id)
		done[r.lane] = true
		left--
	}
	return nil
}

// awaitLanesUp is the dialer waiting, in a recovery round of epoch, for the
// acceptor to say its lanes are accepted and its windows bound: before
// that a resent WRITE could reach a window not bound yet.
func (p *Peer) awaitLanesUp(epoch uint32, deadline time.Time) error {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for {
		select {
		case got := <-p.lcm.up:
			if got == epoch {
				return nil
			}
		case <-p.askCh:
			return &retryError{fmt.Errorf("peer failed its side of recovery epoch %d", epoch)}
		case <-p.down:
			return p.Err()
		case <-t.C:
			return fmt.Errorf("no confirmation of the peer's rdma_cm lanes of epoch %d within %v", epoch, p.e.cfg.PeerTimeout)
		}
	}
}

// lanesUp hands the acceptor's confirmation to a waiting dialer round
// (the control goroutine; the newest is kept).
func (p *Peer) lanesUp(epoch uint32) {
	if p.lcm == nil || p.lcm.up == nil {
		return
	}
	select {
	case <-p.lcm.up:
	default:
	}
	select {
	case p.lcm.up <- epoch:
	default:
	}
}
