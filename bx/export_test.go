package bx

import (
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/goverbs/goverbs/qp"
)

// BreakLanesForTest forces every QP to the peer to ERR, as a failed link or
// an outside `ibv_modify_qp` would.
//
// It breaks all lanes or none: with every lane's lock held (recovery
// replaces a lane's QP under it) and the peer active. It broke the lanes
// one at a time, so a recovery that started between the caller's check
// and the break could find lane 0 broken and lane 1 without a QP: a QP
// failing while recovery rebuilds, which declares the peer gone
// (TestCMRecoveryMidRendezvous failed so about 1 run in 4 in a loop).
func (p *Peer) BreakLanesForTest() error {
	for _, l := range p.lanes {
		l.mu.Lock()
		defer l.mu.Unlock()
	}
	if p.state.Load() != stateActive {
		return fmt.Errorf("the peer is not active (recovering)")
	}
	for _, l := range p.lanes {
		if l.qp == nil {
			return fmt.Errorf("lane %d has no QP (rdma_cm lanes, recovering)", l.idx)
		}
	}
	for _, l := range p.lanes {
		if err := l.qp.ToError(); err != nil {
			return err
		}
	}
	return nil
}

// SendRndvForTest sends a hand-made rendezvous request (RTS) for n bytes,
// as a faulty or hostile peer could.
func (p *Peer) SendRndvForTest(stream uint32, n uint32) error {
	b, err := p.e.eager.Alloc(HeaderSize + rndvSize)
	if err != nil {
		return err
	}
	d := rndv{Len: n}
	d.encode(b.Bytes()[HeaderSize:])
	return p.send(p.e.stopCh, stream, header{Type: typRndv, Length: rndvSize}, b, nil)
}

// LiveMsgsForTest is how many received messages the endpoint counts as
// not released: while any is, Close leaves its pools mapped.
func (e *Endpoint) LiveMsgsForTest() int64 { return e.liveMsgs.Load() }

// TeardownsDoneForTest waits until every peer shutdown under way has
// torn its lanes down (as Close does before it unmaps the pools): a
// peer's Done is closed before that, and the transfers it had pending
// stop counting as live messages only then.
func (e *Endpoint) TeardownsDoneForTest() { e.downs.Wait() }

// SendFinForTest sends a FIN for lane sequence ref, whether or not it names
// a rendezvous.
func (p *Peer) SendFinForTest(stream uint32, ref uint64) error {
	b, err := p.e.eager.Alloc(HeaderSize + finSize)
	if err != nil {
		return err
	}
	(&fin{Ref: ref}).encode(b.Bytes()[HeaderSize:])
	return p.sendOut(p.e.stopCh, p.lanes[int(stream)%len(p.lanes)], stream, header{Type: typFin, Length: finSize}, &out{buf: b, ctl: true})
}

// ForgeCTSForTest makes the endpoint alter every clear-to-send it sends
// (target address, key, length) before it goes out.
func (e *Endpoint) ForgeCTSForTest(f func(addr *uint64, rkey, n *uint32)) {
	h := func(c *cts) { f(&c.Addr, &c.RKey, &c.Len) }
	e.ctsHook.Store(&h)
}

// ActiveForTest reports whether the peer is connected and not recovering.
func (p *Peer) ActiveForTest() bool { return p.state.Load() == stateActive }

// OnServeReleaseForTest makes every RPC serve call f right after it released
// the request's buffer to the receive queue: for a blocking handler
// (Handle) before it sends the response, for an inline one after it posted
// the response.
// A nil f removes the hook.
func OnServeReleaseForTest(f func()) {
	if f == nil {
		serveReleased.Store(nil)
		return
	}
	serveReleased.Store(&f)
}

// OnTeardownForTest makes every peer's shutdown call f with the peer after
// it left its endpoint's list of peers, before its lanes, windows and QPs
// are torn down (a nil f removes the hook).
func OnTeardownForTest(f func(*Peer)) {
	if f == nil {
		teardownHook.Store(nil)
		return
	}
	teardownHook.Store(&f)
}

// OnDialerRoundForTest makes every dialer's recovery round call f with
// the peer as it starts, its epoch set, before it rebuilds anything (a
// nil f removes the hook).
func OnDialerRoundForTest(f func(*Peer)) {
	if f == nil {
		dialerRoundHook.Store(nil)
		return
	}
	dialerRoundHook.Store(&f)
}

// OnRecoveryForTest makes every peer call f with its cause as it starts
// a recovery (a nil f removes the hook).
func OnRecoveryForTest(f func(*Peer, error)) {
	if f == nil {
		recoveryHook.Store(nil)
		return
	}
	recoveryHook.Store(&f)
}

// Causes of recovery that tests tell apart: the watchdog found a lane
// stalled; the acceptor asked the dialer (its own cause is its own).
var (
	ErrStalledForTest      = errStalled
	ErrPeerReportedForTest = errPeerReported
)

// OnAskForTest makes every acceptor's recovery call f with the peer just
// before it asks the dialer for a round (a nil f removes the hook).
func OnAskForTest(f func(*Peer)) {
	if f == nil {
		askHook.Store(nil)
		return
	}
	askHook.Store(&f)
}

// OnAcceptResendForTest makes every acceptor's recovery round call f with
// the peer once the dialer confirmed the round's lanes, just before the
// acceptor resends (a nil f removes the hook).
func OnAcceptResendForTest(f func(*Peer)) {
	if f == nil {
		acceptResendHook.Store(nil)
		return
	}
	acceptResendHook.Store(&f)
}

// FailLanesForTest forces every lane's QP to ERR whatever the peer's
// state (a link that fails again in the middle of a recovery round).
func (p *Peer) FailLanesForTest() error {
	for _, l := range p.lanes {
		l.mu.Lock()
		var err error
		if l.qp != nil {
			err = l.qp.ToError()
		}
		l.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// EpochForTest is the peer's credit epoch: the recovery round its lanes
// belong to (0 before any recovery).
func (p *Peer) EpochForTest() uint32 { return p.ret.Epoch() }

// OnReceivedForTest makes the endpoint call f as it starts handling each
// message that arrived, before it records anything of it (a nil f removes
// the hook): a delay there widens the time between a message's arrival
// and its effects.
func OnReceivedForTest(f func()) {
	if f == nil {
		receivedHook.Store(nil)
		return
	}
	receivedHook.Store(&f)
}

// SetTickForTest sets how often every endpoint's credit/ack ticker looks
// while it runs (0: the default) and returns the previous setting.
func SetTickForTest(d time.Duration) time.Duration {
	return time.Duration(tickNS.Swap(int64(d)))
}

// ForcePollForTest makes every endpoint poll (Config.Spin) even when it is
// not the process's only one, and returns the previous setting.
func ForcePollForTest(on bool) bool { return forcePoll.Swap(on) }

// TicksForTest is how many rounds the endpoint's credit/ack ticker ran.
func (e *Endpoint) TicksForTest() uint64 { return e.ticks.Load() }

// UnackedForTest is how many sent messages the peer has not acknowledged.
func (p *Peer) UnackedForTest() int {
	n := 0
	for _, l := range p.lanes {
		l.mu.Lock()
		n += len(l.outs)
		l.mu.Unlock()
	}
	return n
}

// HeldForTest is how many of our receive buffers the peer's messages hold
// now: consumed and not yet released (queued in streams, being read,
// waiting for a handler).
func (p *Peer) HeldForTest() uint64 {
	st := p.ret.Stats()
	return st.Consumed - st.Released - st.Control
}

// QPsForTest is how many QPs the endpoint routes completions for: its
// peers' lanes.
func (e *Endpoint) QPsForTest() int {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return len(e.byQPN)
}

// ControlTLSForTest reports whether the peer's control connection runs
// over TLS.
func (p *Peer) ControlTLSForTest() bool {
	_, ok := p.ctl.(*tls.Conn)
	return ok
}

// CreditsForTest is the credit conservation sum of one direction: the
// credits this side may still use to send to the peer (the control
// reserve included) plus those the peer re-posted and has not told yet.
// With every message of the direction arrived and released, it is the
// peer's grant: a credit lost on the way lowers it.
func (p *Peer) CreditsForTest(peer *Peer) uint64 {
	_, granted, consumed := p.credits.State()
	return granted - consumed + peer.ret.Pending()
}

func (p *Peer) CreditStateForTest(peer *Peer) string {
	a, granted, consumed := p.credits.State()
	return fmt.Sprintf("epoch %d granted %d consumed %d pending-at-peer %d", a, granted, consumed, peer.ret.Pending())
}

// GrantForTest is the receive credits e grants each peer (Config.Credits):
// what CreditsForTest of a direction into e comes back to once every
// message of it arrived and was released.
func (e *Endpoint) GrantForTest() uint64 { return uint64(e.cfg.Credits) }

// BeforeFinForTest makes the endpoint call f with every clear-to-send it
// receives (the target's address, rkey and length) before it writes the
// payload and sends the FIN; f runs on a goroutine of its own and may
// block to hold the transfer back.
func (e *Endpoint) BeforeFinForTest(f func(addr uint64, rkey, n uint32)) {
	h := func(c cts) { f(c.Addr, c.RKey, c.Len) }
	e.finHook.Store(&h)
}

// ForgeWriteForTest posts an RDMA WRITE of data to addr/rkey on the
// stream's lane, outside any rendezvous: what a peer that kept or
// guessed a target could do. A refused WRITE completes in error, which
// the endpoint treats as for a real one.
func (p *Peer) ForgeWriteForTest(stream uint32, addr uint64, rkey uint32, data []byte) error {
	src, err := p.e.rndv.Alloc(len(data))
	if err != nil {
		return err
	}
	copy(src.Bytes(), data)
	l := p.lanes[int(stream)%len(p.lanes)]
	l.mu.Lock()
	l.ssge[0] = src.SGE(len(data))
	l.swr[0] = qp.SendWR{ID: tagWrite, Opcode: qp.OpRDMAWrite, Flags: qp.Signaled, SGEs: l.ssge[0:1], RemoteAddr: addr, RKey: rkey}
	err = l.qp.PostSend(l.swr[:1])
	l.mu.Unlock()
	go func() {
		// The device reads src until the WRITE completes: free it once
		// the peer is gone or surely done.
		select {
		case <-p.down:
		case <-time.After(10 * time.Second):
		}
		p.e.rndv.Free(src)
	}()
	return err
}

// WindowsForTest reports the endpoint's memory windows for transfers:
// allocated, and free (unbound, for the next transfer); and the target
// regions registered. The lanes' fence windows are not counted.
func (e *Endpoint) WindowsForTest() (all, free, regions int) {
	e.grants.mu.Lock()
	defer e.grants.mu.Unlock()
	return len(e.grants.all) - e.grants.fences, len(e.grants.free), len(e.grants.mrs)
}

// FencesForTest reports the lanes' fence windows allocated.
func (e *Endpoint) FencesForTest() int {
	e.grants.mu.Lock()
	defer e.grants.mu.Unlock()
	return e.grants.fences
}

// LaneCountForTest reports how many lanes (QPs) the peer has.
func (p *Peer) LaneCountForTest() int { return len(p.lanes) }

// RegisterPollerForTest registers the process in the pollers registry dir
// (pollers.go) and keeps it registered until the process ends.
func RegisterPollerForTest(dir string) error {
	f, err := registerIn(dir)
	if err == nil {
		heldPollerFile = f
	}
	return err
}

var heldPollerFile any

// The pollers registry (pollers.go), for tests.
func RegisterEndpointPollerForTest()   { registerPoller() }
func UnregisterEndpointPollerForTest() { unregisterPoller() }
func PollersDirForTest() string        { return pollersDir() }

// MachinePollersForTest counts the registry now and reports the count
// and whether it leaves a core to every poller.
func MachinePollersForTest() (int, bool) {
	pollers.next.Store(0)
	n := machinePollers(time.Now())
	return n, spareCores(time.Now())
}

// StallLanesForTest moves the peer's lane QPs to SQD (send queue drain):
// the kernel stops taking new send work requests from them and reports no
// error, a QP that stalls as rxe's does when its packets were refused
// (stall.go).
func (p *Peer) StallLanesForTest() error {
	for _, l := range p.lanes {
		l.mu.Lock()
		defer l.mu.Unlock()
	}
	if p.state.Load() != stateActive {
		return fmt.Errorf("the peer is not active (recovering)")
	}
	for _, l := range p.lanes {
		if l.qp == nil {
			return fmt.Errorf("lane %d has no QP", l.idx)
		}
		if err := l.qp.Modify(&qp.Attr{State: qp.SQD}, qp.MaskState); err != nil {
			return fmt.Errorf("lane %d to SQD: %w", l.idx, err)
		}
	}
	return nil
}

// ProbeLanesForTest posts a stall probe (stall.go) on every lane of the
// peer and returns their numbers, for ProbedForTest.
func (p *Peer) ProbeLanesForTest() ([]uint64, error) {
	var ns []uint64
	for _, l := range p.lanes {
		l.mu.Lock()
		if l.qp == nil || !l.live {
			l.mu.Unlock()
			return nil, fmt.Errorf("lane %d has no live QP", l.idx)
		}
		l.watch.n++
		n := l.watch.n
		err := l.postProbe(n)
		l.mu.Unlock()
		if err != nil {
			return nil, err
		}
		ns = append(ns, n)
	}
	return ns, nil
}

// ProbedForTest reports whether the probes ProbeLanesForTest posted all
// completed.
func (p *Peer) ProbedForTest(ns []uint64) bool {
	for i, l := range p.lanes {
		if l.probed.Load() < ns[i] {
			return false
		}
	}
	return true
}

// PoolBusyForTest returns how many requests the worker pool holds (queued
// or running).
func (e *Endpoint) PoolBusyForTest() int32 { return e.busy.Load() }

// OthersWaitForTest reports what a poller asks before it gives its CPU
// away (othersWait): the progress goroutine (callPolls false) or a
// waiting Call polling for itself (true).
func (e *Endpoint) OthersWaitForTest(callPolls bool) bool {
	if callPolls {
		return e.othersWait(1)
	}
	return e.othersWait(0)
}

// ConfigForTest is the endpoint's configuration, its defaults filled in.
func (e *Endpoint) ConfigForTest() Config { return e.cfg }

// SetSpinGrowthForTest sets the adaptive spin window's cap (in Spins)
// and returns the previous one. Set it before the endpoints start and
// restore it after they closed (t.Cleanup registered first).
func SetSpinGrowthForTest(n int) int {
	prev := int(maxSpinGrowth)
	maxSpinGrowth = time.Duration(n)
	return prev
}

// ParksForTest is how many times the progress goroutine's timed wait
// for a waiter holding the CQ ran out (it looked again).
func (e *Endpoint) ParksForTest() uint64 { return e.parks.Load() }

// TickerWakesForTest is how many times a poke woke the endpoint's
// credit/ack ticker from its sleep.
func (e *Endpoint) TickerWakesForTest() uint64 { return e.tickerSleeps.Load() }

// HoldLaneForTest takes lane i's send lock (as a goroutine stuck while
// holding it would) and returns its release.
func (p *Peer) HoldLaneForTest(i int) func() {
	l := p.lanes[i]
	l.mu.Lock()
	return l.mu.Unlock
}

// ConnWindowForTest is the bytes a Conn's writer may have unread
// (connWindow).
func (e *Endpoint) ConnWindowForTest() int { return int(connWindow(&e.cfg)) }

// ConnPeerForTest is the peer a Conn of this package rides on.
func ConnPeerForTest(c net.Conn) *Peer { return c.(*Conn).s.p }

// ConnReadersForTest is how many Reads wait on a Conn of this package.
func ConnReadersForTest(c net.Conn) int32 { return c.(*Conn).s.readers.Load() }

// OpenLaneQPsForTest is how many of p's lanes hold a QP not closed.
func (p *Peer) OpenLaneQPsForTest() int {
	n := 0
	for _, l := range p.lanes {
		l.mu.Lock()
		if l.qp != nil && !l.qp.IsClosed() {
			n++
		}
		l.mu.Unlock()
	}
	return n
}

// SendAcrossRecoveryForTest sends data on stream s as Stream.Send does,
// but calls between once the message holds its window share and credit,
// before it is sequenced and posted: a sender preempted there while a
// recovery runs.
func (p *Peer) SendAcrossRecoveryForTest(s uint32, data []byte, between func()) error {
	b, err := p.e.eager.Alloc(HeaderSize + len(data))
	if err != nil {
		return err
	}
	copy(b.Bytes()[HeaderSize:], data)
	l := p.lanes[int(s)%len(p.lanes)]
	o := out{buf: b, bytes: int64(b.Len())}
	epoch, err := p.admit(p.e.stopCh, l, 1, o.bytes, false)
	if err != nil {
		p.e.eager.Free(b)
		return err
	}
	between()
	return p.postOut(l, s, header{Type: typData, Length: uint32(len(data))}, &o, epoch)
}

// ReadersForTest is how many Recvs wait on the stream.
func (s *Stream) ReadersForTest() int32 { return s.readers.Load() }
