package ps

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goverbs/goverbs/bx"
)

// rdmaClient: one bx endpoint per client, one peer per server, calls spread
// over Streams stream ids (and so over the peer's lanes). Requests are
// built in place in allocator buffers (CallBuffer); responses are read in
// place in the buffers they landed in, then released.
type rdmaClient struct {
	ep       *bx.Endpoint
	addrs    []string
	mu       []sync.Mutex
	peers    []atomic.Pointer[bx.Peer] // read without mu; written under mu[i]
	inflight atomic.Int32              // calls of this client in flight
}

func newRDMAClient(cfg ClientConfig) (*rdmaClient, error) {
	def := DefaultClientBX
	def.MaxPeers = len(cfg.Servers) + 1
	c := bxDefaults(cfg.BX, def)
	c.Device, c.Token = cfg.Device, cfg.Token
	if c.Device == "" {
		return nil, errors.New("ps: rdma client: ClientConfig.Device is required")
	}
	ep, err := bx.New(c)
	if err != nil {
		return nil, fmt.Errorf("ps: client: %w", err)
	}
	return &rdmaClient{ep: ep, addrs: cfg.Servers, mu: make([]sync.Mutex, len(cfg.Servers)), peers: make([]atomic.Pointer[bx.Peer], len(cfg.Servers))}, nil
}

func (t *rdmaClient) peer(ctx context.Context, i int) (*bx.Peer, error) {
	if p := t.peers[i].Load(); p != nil {
		select {
		case <-p.Done():
		default:
			return p, nil // the fast path: no lock
		}
	}
	t.mu[i].Lock()
	defer t.mu[i].Unlock()
	if p := t.peers[i].Load(); p != nil {
		select {
		case <-p.Done():
			// Gone (the server died or restarted): dial again.
		default:
			return p, nil
		}
	}
	p, err := t.ep.Dial(ctx, t.addrs[i])
	if err != nil {
		return nil, err
	}
	t.peers[i].Store(p)
	return p, nil
}

// smallRequest: a request up to this size (bx's default eager size) is
// built in the call's own scratch buffer and sent with Peer.Call, which
// copies it into a send buffer kept on its stack; a larger one is built in
// place in an allocator buffer (Endpoint.Alloc, CallBuffer: no copy, but a
// heap Buffer per call, which ps cannot keep: bx takes it).
const smallRequest = 8192 - bx.HeaderSize

func (t *rdmaClient) call(ctx context.Context, i int, k *call) error {
	p, err := t.peer(ctx, i)
	if err != nil {
		return err
	}
	n := k.size()
	// Calls in flight spread over the streams (and so over the peer's
	// lanes); a lone call (one worker, one outstanding) always takes the
	// first, as a bare bx caller does, rather than alternating lanes.
	stream := uint32(t.inflight.Add(1)-1) % Streams
	defer t.inflight.Add(-1)
	if k.inline() {
		stream += Streams // served on the server's progress goroutine
	}
	var m *bx.Msg
	if n <= smallRequest {
		if cap(k.scratch) < n {
			k.scratch = make([]byte, smallRequest)
		}
		b := k.scratch[:n]
		k.fill(b)
		m, err = p.Call(ctx, stream, b)
	} else {
		var b *bx.Buffer
		if b, err = t.ep.Alloc(n); err != nil {
			return fmt.Errorf("%w: %w", ErrTooLarge, err)
		}
		k.fill(b.Payload())
		m, err = p.CallBuffer(ctx, stream, b)
	}
	if err != nil {
		if bx.IsRemote(err) {
			return fmt.Errorf("%w: %w", ErrInternal, err)
		}
		return err
	}
	k.finish(m.Data(), i)
	m.Release()
	return nil
}

func (t *rdmaClient) close() error { return t.ep.Close() }

// tcpClient: per server a pool of connections, one call at a time on each,
// frames of u32 length + the same request/response bytes as over bx.
type tcpClient struct {
	addrs []string
	pools []chan *tcpConn
	d     net.Dialer
	done  chan struct{}
	once  sync.Once
	max   int

	// busy are the connections a call is using: close closes them, so
	// that a call blocked on a server that does not answer ends with
	// the client (it outlived Close, and its goroutine with it).
	mu     sync.Mutex
	busy   map[*tcpConn]struct{}
	closed bool
}

type tcpConn struct {
	c        net.Conn
	br       *bufio.Reader
	lb       [4]byte // a frame's length (here: io.ReadFull's argument escapes)
	wbuf     []byte
	rbuf     []byte
	pool     chan *tcpConn
	deadline bool // a deadline may be set on c
}

func newTCPClient(cfg ClientConfig) *tcpClient {
	n := cfg.Pool
	if n <= 0 {
		n = 64
	}
	t := &tcpClient{addrs: cfg.Servers, pools: make([]chan *tcpConn, len(cfg.Servers)), done: make(chan struct{}),
		busy: map[*tcpConn]struct{}{}}
	for i := range t.pools {
		t.pools[i] = make(chan *tcpConn, n)
	}
	t.d.Timeout = 10 * time.Second
	t.max = cfg.BX.MaxMessage
	if t.max <= 0 {
		t.max = DefaultClientBX.MaxMessage
	}
	return t
}

func (t *tcpClient) get(ctx context.Context, i int) (*tcpConn, error) {
	select {
	case c := <-t.pools[i]:
		return c, nil
	default:
	}
	select {
	case <-t.done:
		return nil, errClientClosed
	default:
	}
	c, err := t.d.DialContext(ctx, "tcp", t.addrs[i])
	if err != nil {
		return nil, err
	}
	c.(*net.TCPConn).SetNoDelay(true)
	return &tcpConn{c: c, br: bufio.NewReaderSize(c, 64<<10), pool: t.pools[i]}, nil
}

// errClientClosed is what a call of a closed client returns.
var errClientClosed = errors.New("ps: client closed")

// hold marks tc busy for a call, or closes it and reports false when the
// client is closed.
func (t *tcpClient) hold(tc *tcpConn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		tc.c.Close()
		return false
	}
	t.busy[tc] = struct{}{}
	return true
}

// unhold ends tc's call.
func (t *tcpClient) unhold(tc *tcpConn) {
	t.mu.Lock()
	delete(t.busy, tc)
	t.mu.Unlock()
}

func (tc *tcpConn) put(done chan struct{}) {
	select {
	case <-done:
		tc.c.Close()
		return
	default:
	}
	if cap(tc.rbuf) > 1<<20 {
		tc.rbuf = nil
	}
	if cap(tc.wbuf) > 1<<20 {
		tc.wbuf = nil
	}
	select {
	case tc.pool <- tc:
	default:
		tc.c.Close()
		return
	}
	// A close that ran whole between the check above and the send found
	// the pool empty: whatever is in it now is ours to close.
	select {
	case <-done:
		for {
			select {
			case c := <-tc.pool:
				c.c.Close()
			default:
				return
			}
		}
	default:
	}
}

// ctxErr is the error of a call that failed with err: the context's
// when it ended. The dial's and the connection's deadlines are the
// context's, and when their timer fired before the context's, err is an
// "i/o timeout" while the context is not done yet: past the deadline,
// that is context.DeadlineExceeded too.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, cerr) {
			return err // says so, and what it was doing (a dial)
		}
		return cerr
	}
	if dl, ok := ctx.Deadline(); ok && errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return err
}

func (t *tcpClient) call(ctx context.Context, i int, k *call) error {
	n := k.size()
	if n > t.max {
		// As bx refuses it (Endpoint.Alloc), and as the server would.
		return fmt.Errorf("%w: request of %d bytes, MaxMessage %d", ErrTooLarge, n, t.max)
	}
	tc, err := t.get(ctx, i)
	if err != nil {
		return ctxErr(ctx, err)
	}
	if !t.hold(tc) {
		return errClientClosed
	}
	if cap(tc.wbuf) < 4+n {
		tc.wbuf = make([]byte, 4+n)
	}
	w := tc.wbuf[:4+n]
	binary.LittleEndian.PutUint32(w, uint32(n))
	k.fill(w[4:])
	if dl, ok := ctx.Deadline(); ok {
		tc.c.SetDeadline(dl)
		tc.deadline = true
	} else if tc.deadline {
		tc.c.SetDeadline(time.Time{})
		tc.deadline = false
	}
	var stop func() bool
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, func() { tc.c.SetDeadline(time.Unix(1, 0)) })
		tc.deadline = true
	}
	fail := func(err error) error {
		if stop != nil {
			stop()
		}
		tc.c.Close()
		t.unhold(tc)
		select {
		case <-t.done:
			return errClientClosed // close closed the connection under us
		default:
		}
		return ctxErr(ctx, err)
	}
	if _, err := tc.c.Write(w); err != nil {
		return fail(err)
	}
	if _, err := io.ReadFull(tc.br, tc.lb[:]); err != nil {
		return fail(err)
	}
	m := int(binary.LittleEndian.Uint32(tc.lb[:]))
	if m > maxWireFloats*4+64 {
		return fail(fmt.Errorf("%w: response frame of %d bytes", ErrMalformed, m))
	}
	var r []byte
	peeked := m <= tc.br.Size()
	if peeked {
		// In place in the reader's buffer: no copy.
		if r, err = tc.br.Peek(m); err != nil {
			return fail(err)
		}
	} else {
		// Grown as the bytes arrive (readFrame), not to m at once: m
		// is the server's claim (up to 256 MiB), and a peer that
		// claimed that much and sent little made each call allocate
		// all of it.
		r, err = readFrame(tc.br, tc.rbuf, m)
		tc.rbuf = r
		if err != nil {
			return fail(err)
		}
	}
	// The context may have ended as we finished: the response is whole,
	// so the call's result stands (a push it applied, reported as
	// cancelled, would be applied again by a retry), but the connection's
	// deadline may be set, so it is not reused.
	expired := stop != nil && !stop()
	k.finish(r, i)
	if peeked {
		tc.br.Discard(m)
	}
	t.unhold(tc) // before it goes back to the pool, for another call
	if expired {
		tc.c.Close()
		return nil
	}
	tc.put(t.done)
	return nil
}

func (t *tcpClient) close() error {
	t.once.Do(func() { close(t.done) })
	// Calls in flight end: their connections close under them.
	t.mu.Lock()
	t.closed = true
	for tc := range t.busy {
		tc.c.Close()
	}
	t.mu.Unlock()
	for _, p := range t.pools {
	drain:
		for {
			select {
			case c := <-p:
				c.c.Close()
			default:
				break drain
			}
		}
	}
	return nil
}
