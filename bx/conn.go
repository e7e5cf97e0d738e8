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
	s      *Stream
	cur    *Msg
	off    int
	rmu    sync.Mutex
	wmu    sync.Mutex
	eof    bool
	closed atomic.Bool
	rdl    atomic.Pointer[time.Time]
	wdl    atomic.Pointer[time.Time]

	// kick wakes a Read blocked in Recv when the read deadline changes
	// (net/http aborts a background read by moving it to the past).
	kmu  sync.Mutex
	kick context.CancelFunc
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

// DialConn opens a Conn to the endpoint at addr (its Listen address),
// reusing a connected peer when one was dialed to that address before.
func (e *Endpoint) DialConn(ctx context.Context, addr string) (net.Conn, error) {
	p, err := e.peerFor(ctx, addr)
	if err != nil {
		return nil, err
	}
	id := uint32(connBit) | connSeq.Add(1)&0x3fffffff
	if !p.dialer {
		id |= 1 << 30
	}
	c := &Conn{s: p.Stream(id)}
	b, err := e.Alloc(0)
	if err != nil {
		return nil, err
	}
	if err := p.sendMsg(ctx, id, flagOpen, 0, b); err != nil {
		return nil, err
	}
	return c, nil
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
	e.dialed[addr] = p
	e.mu.Unlock()
	return p, nil
}

// Listener returns the endpoint's net.Listener: Accept yields a Conn for
// every stream a peer opens with DialConn. Call Listen first so peers can
// connect.
func (e *Endpoint) Listener() net.Listener {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.conns == nil {
		e.conns = make(chan *Conn, 64)
	}
	return &listener{e: e, done: make(chan struct{})}
}

type listener struct {
	e    *Endpoint
	once sync.Once
	done chan struct{}
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.e.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-l.e.stopCh.Done():
		return nil, net.ErrClosed
	}
}

// Close stops Accept; the endpoint and its peers stay up.
func (l *listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *listener) Addr() net.Addr {
	l.e.mu.RLock()
	defer l.e.mu.RUnlock()
	if len(l.e.lns) > 0 {
		return l.e.lns[0].Addr()
	}
	return Addr{Device: l.e.cfg.Device}
}

// opened is called when a peer's first message on a Conn stream arrives.
func (p *Peer) opened(id uint32) {
	e := p.e
	e.mu.RLock()
	ch := e.conns
	e.mu.RUnlock()
	if ch == nil {
		return
	}
	select {
	case ch <- &Conn{s: p.Stream(id)}:
	default:
	}
}

func deadlineCtx(p *atomic.Pointer[time.Time]) (context.Context, context.CancelFunc) {
	if t := p.Load(); t != nil && !t.IsZero() {
		return context.WithDeadline(context.Background(), *t)
	}
	return context.WithCancel(context.Background())
}

// Read reads received bytes.
func (c *Conn) Read(b []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	for c.cur == nil || c.off == len(c.cur.Data()) {
		if t := c.rdl.Load(); t != nil && !t.IsZero() && !time.Now().Before(*t) {
			return 0, os.ErrDeadlineExceeded
		}
		if c.cur != nil {
			c.cur.Release()
			c.cur = nil
		}
		if c.eof {
			return 0, io.EOF
		}
		ctx, cancel := deadlineCtx(&c.rdl)
		c.kmu.Lock()
		c.kick = cancel
		c.kmu.Unlock()
		m, err := c.s.Recv(ctx)
		c.kmu.Lock()
		c.kick = nil
		c.kmu.Unlock()
		cancel()
		if errors.Is(err, context.Canceled) && !c.closed.Load() {
			continue // the deadline moved: look again
		}
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return 0, os.ErrDeadlineExceeded
			}
			return 0, err
		}
		if m.flags&flagClose != 0 {
			c.eof = true
		}
		c.cur, c.off = m, 0
	}
	n := copy(b, c.cur.Data()[c.off:])
	c.off += n
	return n, nil
}

// Write sends b.
func (c *Conn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	ctx, cancel := deadlineCtx(&c.wdl)
	defer cancel()
	e := c.s.p.e
	n := 0
	for n < len(b) {
		k := min(len(b)-n, e.cfg.EagerSize)
		if err := c.s.Send(ctx, b[n:n+k]); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				err = os.ErrDeadlineExceeded
			}
			return n, err
		}
		n += k
	}
	return n, nil
}

// Close tells the peer (its Read returns io.EOF after the data) and frees
// what is buffered.
func (c *Conn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	p := c.s.p
	if b, err := p.e.Alloc(0); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), p.e.cfg.HandshakeTimeout)
		p.sendMsg(ctx, c.s.id, flagClose, 0, b)
		cancel()
	}
	c.wake()
	c.rmu.Lock()
	if c.cur != nil {
		c.cur.Release()
		c.cur = nil
	}
	c.rmu.Unlock()
	return nil
}

func (c *Conn) wake() {
	c.kmu.Lock()
	if c.kick != nil {
		c.kick()
	}
	c.kmu.Unlock()
}

// LocalAddr names our end.
func (c *Conn) LocalAddr() net.Addr {
	return Addr{Device: c.s.p.e.cfg.Device, Peer: c.s.p.e.id, Stream: c.s.id}
}

// RemoteAddr names the peer's end.
func (c *Conn) RemoteAddr() net.Addr { return Addr{Peer: c.s.p.id, Stream: c.s.id} }

// SetDeadline sets both deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	c.wdl.Store(&t)
	return c.SetReadDeadline(t)
}

// SetReadDeadline bounds Read, including one already blocked.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.rdl.Store(&t)
	c.wake()
	return nil
}

// SetWriteDeadline bounds Write.
func (c *Conn) SetWriteDeadline(t time.Time) error { c.wdl.Store(&t); return nil }
