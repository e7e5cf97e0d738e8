package bx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Conn adapts a stream to net.Conn, so net/http, net/rpc or gRPC (through
// a context dialer) run over RDMA unchanged. Writes are cut into messages
// of at most EagerSize bytes; Read returns received bytes in order.
type Conn struct {
	s   *Stream
	cur *Msg
	off int
	rmu sync.Mutex
	wmu sync.Mutex
	eof bool
	win uint64 // the window (connWindow)
	// sent: bytes written (under wmu); read: bytes Read returned, told:
	// the count last sent to the peer's writer (under rmu).
	sent       uint64
	read, told uint64
	closed     atomic.Bool
	rdl        atomic.Pointer[time.Time]
	wdl        atomic.Pointer[time.Time]

	// rw and ww are the contexts Reads and Writes wait under. Cancelling
	// rw's wakes a Read blocked in Recv when the read deadline changes
	// (net/http aborts a background read by moving it to the past),
	// ww's a Write blocked in Send (for credits or a window) when the
	// write deadline changes; Close cancels both. Their cancel funcs are
	// set under kmu.
	kmu sync.Mutex
	rw  waitCtx // under rmu
	ww  waitCtx // under wmu
}

// waitCtx is the context a Conn's Reads (or Writes) wait under, kept from
// one to the next while the deadline stays: a context made for each cost
// a Read and a Write two allocations each.
type waitCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
	dl     *time.Time // the deadline it was made for (what the setter stored)
}

// waitCtx returns the context to wait under for the deadline in p, made
// anew when the deadline changed or it ended. The Read's (Write's) lock is
// held.
func (c *Conn) waitCtx(w *waitCtx, p *atomic.Pointer[time.Time]) context.Context {
	for {
		dl := p.Load()
		if w.ctx != nil && w.dl == dl && w.ctx.Err() == nil {
			return w.ctx
		}
		if w.cancel != nil {
			w.cancel()
		}
		var ctx context.Context
		var cancel context.CancelFunc
		if dl != nil && !dl.IsZero() {
			ctx, cancel = context.WithDeadline(context.Background(), *dl)
		} else {
			ctx, cancel = context.WithCancel(context.Background())
		}
		c.kmu.Lock()
		w.cancel = cancel
		c.kmu.Unlock()
		w.ctx, w.dl = ctx, dl
		// A deadline set as this was made: its wake may have missed it.
		// One set from here on cancels it.
		if p.Load() == dl {
			return ctx
		}
	}
}

// Windows. Every Conn and stream to a peer shares the peer's receive
// credits, but a Conn's reader cannot stall its siblings, as a TCP
// connection's cannot stall another's:
//   - its data holds no receive buffer while no Read waits for it: a
//     message that arrives with no Recv waiting on the stream, and the
//     rest of one that a Read took only part of, are copied to the heap
//     and their receive buffers (and with them the peer's credits) go back
//     at once (Msg.spill, counted in Stats.Spilled);
//   - its writer keeps at most connWindow bytes that the reader has not
//     read, so what a reader that stops reading holds on the heap is
//     bounded: the reader tells the writer how much it has read in all
//     (a zero-length message with flagRead, its CallID the count) each
//     time a quarter of the window more was read since it last told.
//
// A writer that waits has a full window, so more than three quarters of
// it is unread or untold, and a reader that reads it all tells: no
// deadlock, whatever the sizes. The count is cumulative, so a message
// resent after a recovery changes nothing. Both ends take the window from
// EagerSize, which a peer must share.

// connWin is a Conn stream's window state, shared by its Conn and the
// goroutine that delivers the peer's flagRead messages.
type connWin struct {
	read atomic.Uint64 // the most the peer's reader said it read
	wake chan struct{} // cap 1: a flagRead came, or the stream closed or failed
}

// poke wakes a Write waiting for the window to look again.
func (cw *connWin) poke() {
	select {
	case cw.wake <- struct{}{}:
	default:
	}
}

// connWindow is the bytes a Conn's writer may have sent that the reader
// has not read: 256 KiB (a socket buffer's order), or four eager messages
// if more.
func connWindow(c *Config) uint64 { return uint64(max(256<<10, 4*c.EagerSize)) }

// newConn makes the Conn of stream s, giving the stream its window state
// before it carries the Conn's data.
func newConn(s *Stream) *Conn {
	cw := &connWin{wake: make(chan struct{}, 1)}
	s.mu.Lock()
	if s.cw == nil {
		s.cw = cw
	}
	s.mu.Unlock()
	return &Conn{s: s, win: connWindow(&s.p.e.cfg)}
}

// connRead takes a flagRead message: the peer's reader of a Conn stream
// has read m.call bytes in all. It runs on the goroutine that delivers.
func (p *Peer) connRead(m *Msg) {
	id, n := m.Stream, m.call
	m.Release()
	p.mu.Lock()
	s := p.streams[id]
	p.mu.Unlock()
	if s == nil {
		return // closed and forgotten here: nothing waits for it
	}
	s.mu.Lock()
	cw := s.cw
	s.mu.Unlock()
	if cw == nil {
		return // not a Conn's stream: a count of nothing
	}
	for {
		old := cw.read.Load()
		if n <= old || cw.read.CompareAndSwap(old, n) {
			break
		}
	}
	cw.poke()
}

// waitWindow waits until k more bytes fit c's window, the context ends,
// or the stream cannot send (closed, by either side, or its peer failed).
// wmu is held.
func (c *Conn) waitWindow(ctx context.Context, k int) error {
	cw := c.s.cw
	for {
		read := min(cw.read.Load(), c.sent) // a count above what we sent says nothing more
		if c.sent-read+uint64(k) <= c.win {
			return nil
		}
		if err := c.s.sendable(ctx); err != nil {
			return err
		}
		if err := c.s.p.Err(); err != nil {
			return err
		}
		select {
		case <-cw.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// tell sends the peer's writer how much was read, when a quarter of the
// window more was read since it last heard. Without waiting: from here if
// a credit is there, else from a worker. rmu is held.
func (c *Conn) tell() {
	if c.read-c.told < c.win/4 {
		return
	}
	s := c.s
	s.mu.Lock()
	open := s.cl.local == nil && !s.cl.peer // else no Write waits for it
	s.mu.Unlock()
	if !open {
		return
	}
	b, err := s.p.e.alloc(0)
	if err != nil {
		return // the pool is at its limit: the next Read tells
	}
	c.told = c.read
	s.p.sendOrQueue(s.id, flagRead, c.read, b)
}

// spillQueued spills the Conn's messages that wait in their receive
// buffers: ones that came while a Recv waited that then ended without
// them (its deadline passed).
func (s *Stream) spillQueued() {
	for {
		var h heldBuf
		found := false
		s.mu.Lock()
		if s.readers.Load() == 0 {
			for _, m := range s.q {
				if !m.spilled {
					h, found = m.spill(0), true
					break
				}
			}
		}
		s.mu.Unlock()
		if !found {
			return
		}
		s.p.giveBack(h)
	}
}

// expired reports whether the deadline in p has passed.
func expired(p *atomic.Pointer[time.Time]) bool {
	t := p.Load()
	return t != nil && !t.IsZero() && !time.Now().Before(*t)
}

// Addr names one end of a Conn: the endpoint's device and the stream.
type Addr struct {
	Device string
	Peer   uint64
	Stream uint32
}

// Network returns "bx".
func (a Addr) Network() string { return "bx" }

func (a Addr) String() string { return fmt.Sprintf("%s/%x/%d", a.Device, a.Peer, a.Stream) }

// connStreams are ids reserved for Conns: the top bit set, then whether the
// dialer or the acceptor of the peer connection opened it.
const connBit = 1 << 31

var connSeq atomic.Uint32

// ErrConnRefused is what DialConn returns when the peer refuses the Conn:
// it has no Listener, or its accept queue is full (the error says which).
var ErrConnRefused = errors.New("bx: conn refused by the peer")

// acceptQueue is how many Conns may wait for Accept; beyond it, a peer's
// DialConn gets ErrConnRefused.
const acceptQueue = 64

// DialConn opens a Conn to the endpoint at addr (its Listen address),
// reusing a connected peer when one was dialed to that address before. It
// returns once the peer queued the Conn for its Listener's Accept, or
// refused it (ErrConnRefused).
//
// Every Conn and stream to one endpoint rides one peer connection and
// shares its receive credits, yet a Conn's reader that stops reading
// stalls only its own writer, as with TCP: its data waits on the heap,
// holding no receive buffer, and its writer stops once 256 KiB (or four
// EagerSize messages, if more) are unread. An unreleased Msg of a
// Stream, by contrast, holds its buffer and credit (Msg).
func (e *Endpoint) DialConn(ctx context.Context, addr string) (net.Conn, error) {
	if e.bad() {
		return nil, errNilEndpoint
	}
	if ctx == nil {
		return nil, fmt.Errorf("bx: DialConn %s: nil context", addr)
	}
	p, err := e.peerFor(ctx, addr)
	if err != nil {
		return nil, err
	}
	id := uint32(connBit) | connSeq.Add(1)&0x3fffffff
	if !p.dialer {
		id |= 1 << 30
	}
	c := newConn(p.Stream(id))
	if refused, err := p.openConn(ctx, id); err != nil {
		c.closed.Store(true)
		if refused {
			// The peer kept nothing of it: nothing to tell.
			c.s.mu.Lock()
			c.s.cl.sent = true
			c.s.mu.Unlock()
		}
		// Otherwise the peer may have queued it (our wait ended first):
		// the close tells it, without waiting for a credit (Close waited
		// up to HandshakeTimeout for one, past the caller's context,
		// when the context had ended for want of one).
		c.s.close(false)
		return nil, fmt.Errorf("bx: DialConn %s: %w", addr, err)
	}
	return c, nil
}

// openConn asks the peer to accept a Conn on stream id: an RPC on that
// stream that its progress goroutine answers (opened). refused says the
// peer answered no.
func (p *Peer) openConn(ctx context.Context, id uint32) (refused bool, err error) {
	b, err := p.e.alloc(0)
	if err != nil {
		return false, err
	}
	call := p.callID.Add(1)
	ch := make(chan *Msg, 1)
	p.mu.Lock()
	if p.state.Load() == stateDead {
		p.mu.Unlock()
		b.Free()
		return false, p.Err()
	}
	p.calls[call] = ch
	p.mapCalls.Add(1)
	p.mu.Unlock()
	if err := p.sendMsg(ctx, id, flagOpen|flagRequest, call, &b); err != nil {
		p.forget(call, ch)
		return false, err
	}
	select {
	case m, ok := <-ch:
		if !ok {
			return false, p.Err()
		}
		defer m.Release()
		if m.flags&flagError != 0 {
			return true, fmt.Errorf("%w: %s", ErrConnRefused, m.Data())
		}
		return false, nil
	case <-ctx.Done():
		p.forget(call, ch)
		return false, ctx.Err()
	}
}

func (e *Endpoint) peerFor(ctx context.Context, addr string) (*Peer, error) {
	e.mu.Lock()
	if e.dialed == nil {
		e.dialed = map[string]*Peer{}
	}
	p := e.dialed[addr]
	e.mu.Unlock()
	if p != nil && p.state.Load() != stateDead {
		return p, nil
	}
	p, err := e.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	if q := e.dialed[addr]; q != nil && q != p && q.state.Load() != stateDead {
		// A DialConn to addr running alongside dialed it too, and was
		// first: share its peer. Kept, ours would be a second peer to
		// addr that no later DialConn reuses and nothing closes until the
		// endpoint does, each holding Lanes QPs and a MaxPeers place
		// there (a net/http Transport's first burst of requests dials
		// once per request).
		e.mu.Unlock()
		p.Close()
		return q, nil
	}
	e.dialed[addr] = p
	e.mu.Unlock()
	return p, nil
}

// Listener returns the endpoint's net.Listener: Accept yields a Conn for
// every stream a peer opens with DialConn. Call Listen first so peers can
// connect. While no Listener is open, or 64 Conns wait for Accept, a
// peer's DialConn fails with ErrConnRefused. Every Listener of an endpoint
// shares one accept queue.
func (e *Endpoint) Listener() net.Listener {
	if e.bad() {
		return &listener{done: closedCh}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.conns == nil {
		e.conns = make(chan *Conn, acceptQueue)
	}
	e.listeners++
	return &listener{e: e, done: make(chan struct{})}
}

var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

type listener struct {
	e    *Endpoint
	once sync.Once
	done chan struct{}
}

func (l *listener) Accept() (net.Conn, error) {
	if l.e == nil {
		return nil, fmt.Errorf("bx: Accept on the Listener of a nil or zero Endpoint: %w", net.ErrClosed)
	}
	select {
	case <-l.done:
		return nil, net.ErrClosed
	default:
	}
	select {
	case c := <-l.e.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-l.e.stopCh.Done():
		return nil, net.ErrClosed
	}
}

// Close stops Accept; the endpoint and its peers stay up. When the last
// Listener closes, the Conns still waiting for Accept are closed (their
// dialers read io.EOF).
func (l *listener) Close() error {
	if l.e == nil {
		return nil
	}
	l.once.Do(func() {
		close(l.done)
		e := l.e
		var pending []*Conn
		e.mu.Lock()
		e.listeners--
		for e.listeners == 0 && len(e.conns) > 0 {
			pending = append(pending, <-e.conns)
		}
		e.mu.Unlock()
		for _, c := range pending {
			c.Close()
		}
	})
	return nil
}

func (l *listener) Addr() net.Addr {
	if l.e == nil {
		return Addr{}
	}
	l.e.mu.RLock()
	defer l.e.mu.RUnlock()
	if len(l.e.lns) > 0 {
		return l.e.lns[0].Addr()
	}
	return Addr{Device: l.e.cfg.Device}
}

// opened answers a peer's DialConn (the request m on the Conn's stream):
// the Conn goes to the accept queue, or is refused with the reason. It
// runs on the progress goroutine and does not wait.
func (p *Peer) opened(m *Msg) {
	id, call, req := m.Stream, m.call, m.flags&flagRequest != 0
	m.Release()
	e := p.e
	c := newConn(p.Stream(id))
	var refuse string
	// Queued under the lock Listener.Close drains under: a Conn is
	// never queued behind the last Listener's back.
	e.mu.RLock()
	if e.conns == nil || e.listeners == 0 {
		refuse = "no Listener open on " + e.cfg.Device
	} else {
		select {
		case e.conns <- c:
		default:
			refuse = fmt.Sprintf("accept queue full (%d Conns waiting for Accept on %s)", cap(e.conns), e.cfg.Device)
		}
	}
	e.mu.RUnlock()
	if refuse != "" {
		c.s.mu.Lock()
		c.s.cl.sent = true // the dialer forgets its side itself
		c.s.mu.Unlock()
		c.closed.Store(true)
		c.s.Close()
	}
	if !req {
		return // an old dialer that waits for no answer
	}
	flags := uint16(flagResponse)
	if refuse != "" {
		flags |= flagError
	}
	b, err := e.alloc(len(refuse))
	if err != nil {
		return // the dialer's context ends its wait
	}
	copy(b.Payload(), refuse)
	p.sendOrQueue(id, flags, call, b)
}

// Read reads received bytes.
func (c *Conn) Read(b []byte) (int, error) {
	if c.bad() {
		return 0, errNilConn
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	// A passed deadline fails the Read even with data buffered, as for
	// the standard library's conns.
	if expired(&c.rdl) {
		return 0, os.ErrDeadlineExceeded
	}
	for c.cur == nil || c.off == len(c.cur.Data()) {
		if expired(&c.rdl) {
			return 0, os.ErrDeadlineExceeded
		}
		if c.cur != nil {
			c.cur.Release()
			c.cur = nil
		}
		if c.eof {
			return 0, io.EOF
		}
		m, err := c.s.Recv(c.waitCtx(&c.rw, &c.rdl))
		if errors.Is(err, context.Canceled) && !c.closed.Load() {
			continue // the deadline moved: look again
		}
		if err != nil {
			// A message that came as the wait ended must not hold its
			// buffer until the next Read.
			c.s.spillQueued()
			switch {
			case errors.Is(err, context.DeadlineExceeded):
				return 0, os.ErrDeadlineExceeded
			case errors.Is(err, io.EOF):
				c.eof = true
				return 0, io.EOF
			case c.closed.Load():
				return 0, net.ErrClosed
			}
			return 0, err
		}
		c.cur, c.off = m, 0
	}
	n := copy(b, c.cur.Data()[c.off:])
	c.off += n
	if c.off < len(c.cur.data) && !c.cur.spilled {
		// The rest waits for the next Read on the heap, not in a buffer.
		c.s.p.giveBack(c.cur.spill(c.off))
		c.off = 0
	}
	c.read += uint64(n)
	c.tell()
	return n, nil
}

// Write sends b, in messages of at most the eager size. A Write blocked
// for credits, the send window or the Conn's window (the reader's
// unread bytes; see DialConn) returns at the write deadline, also one
// set (or moved) while it waits, and at Close; it then reports how much of
// b went out.
func (c *Conn) Write(b []byte) (int, error) {
	if c.bad() {
		return 0, errNilConn
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	e := c.s.p.e
	n := 0
	for n < len(b) || len(b) == 0 {
		if c.closed.Load() {
			return n, net.ErrClosed
		}
		if expired(&c.wdl) {
			return n, os.ErrDeadlineExceeded
		}
		if len(b) == 0 {
			return 0, nil
		}
		k := min(len(b)-n, e.cfg.EagerSize)
		ctx := c.waitCtx(&c.ww, &c.wdl)
		err := c.waitWindow(ctx, k)
		if err == nil {
			err = c.s.Send(ctx, b[n:n+k])
		}
		if err != nil {
			switch {
			case c.closed.Load():
				return n, net.ErrClosed
			case errors.Is(err, context.Canceled):
				continue // the deadline moved: look again (nothing was sent)
			case errors.Is(err, context.DeadlineExceeded):
				return n, os.ErrDeadlineExceeded
			}
			return n, err
		}
		n += k
		c.sent += uint64(k)
	}
	return n, nil
}

// Close tells the peer (its Read returns io.EOF after the data) and
// releases what is buffered: the message being read and every message
// queued behind it, so their receive buffers and the peer's credits come
// back. It does not wait: when the peer holds every credit (it is not
// reading), the close message goes out from a worker once one comes back,
// as a TCP FIN queues behind unread data.
func (c *Conn) Close() error {
	if c.bad() {
		return errNilConn
	}
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	c.wake(true, true)
	err := c.s.close(false)
	c.rmu.Lock()
	if c.cur != nil {
		c.cur.Release()
		c.cur = nil
	}
	c.rmu.Unlock()
	return err
}

// wake wakes a blocked Read (read) and a blocked Write (write) to look at
// the deadlines and the closed flag again.
func (c *Conn) wake(read, write bool) {
	c.kmu.Lock()
	if read && c.rw.cancel != nil {
		c.rw.cancel()
	}
	if write && c.ww.cancel != nil {
		c.ww.cancel()
	}
	c.kmu.Unlock()
}

// LocalAddr names our end.
func (c *Conn) LocalAddr() net.Addr {
	if c.bad() {
		return nil
	}
	return Addr{Device: c.s.p.e.cfg.Device, Peer: c.s.p.e.id, Stream: c.s.id}
}

// RemoteAddr names the peer's end.
func (c *Conn) RemoteAddr() net.Addr {
	if c.bad() {
		return nil
	}
	return Addr{Peer: c.s.p.id, Stream: c.s.id}
}

// SetDeadline sets both deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if c.bad() {
		return errNilConn
	}
	c.wdl.Store(&t)
	c.rdl.Store(&t)
	c.wake(true, true)
	return nil
}

// SetReadDeadline bounds Read, including one already blocked.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.bad() {
		return errNilConn
	}
	c.rdl.Store(&t)
	c.wake(true, false)
	return nil
}

// SetWriteDeadline bounds Write, including one already blocked.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.bad() {
		return errNilConn
	}
	c.wdl.Store(&t)
	c.wake(false, true)
	return nil
}
