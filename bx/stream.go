package bx

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goverbs/goverbs/mr"
)

// Msg is a received message. Its Data references the receive buffer the
// message landed in (or, for a large message, the buffer the sender wrote
// it into): no copy was made. Release it when done; until then its buffer is
// not available to the peer.
type Msg struct {
	p      *Peer
	Stream uint32
	buf    mr.Buf
	large  bool // buf is a rendezvous target
	copied bool // buf is the eager pool's, not a receive buffer (Peer.copyOut)
	// spilled: data is on the heap and no buffer is held (a Conn's
	// message nobody waited for: Msg.spill).
	spilled bool
	sbuf    *[]byte // the spilled payload's buffer, from Endpoint.spills
	data    []byte
	call    uint64
	flags   uint16
	remote  string // RPC error text
	// done: released. A CAS, not a sync.Once, whose slow path (every
	// message's) takes a lock: about 200 instructions a message.
	done atomic.Bool

	// A request while its handler runs (respond): serving, and the
	// response buffer Reply gave it, if any. serving is atomic: a Reply
	// from another goroutine after the handler returned must see false.
	serving atomic.Bool
	reply   Buffer
}

// Reply returns n bytes of a send buffer of bx's in which a handler may
// build its response to this request: a handler that returns the slice
// Reply gave it (or a prefix of it) sends its response with no allocation
// and no copy, as eRPC's pre-allocated response buffers do. The slice is
// the handler's until it returns; its capacity is n. A handler that
// returns anything else (an error, a slice that append moved, other
// bytes) gets today's behaviour: its bytes are copied and the reply
// buffer goes back. A second Reply replaces the first (which goes back).
// Reply fails outside the handler of this request, and for n outside
// 0..MaxMessage (ErrTooLarge).
func (m *Msg) Reply(n int) ([]byte, error) {
	switch {
	case m.bad():
		return nil, errNilMsg
	case !m.serving.Load():
		return nil, errors.New("bx: Reply outside the handler of a request")
	}
	if m.reply.e != nil {
		m.reply.Free()
		m.reply = Buffer{}
	}
	b, err := m.p.e.alloc(n)
	if err != nil {
		return nil, fmt.Errorf("bx: Reply of %d bytes: %w", n, err)
	}
	m.reply = b
	return b.Payload()[:n:n], nil
}

// inReply reports whether resp is a prefix of the reply buffer b.
func inReply(resp []byte, b *Buffer) bool {
	p := b.Payload()
	return len(resp) <= b.n && (len(resp) == 0 || unsafe.SliceData(resp) == unsafe.SliceData(p))
}

// trimReply shrinks reply buffer b to the k bytes the handler's response
// took, and reports false where the response is better copied: a
// rendezvous buffer whose response would fit an eager message.
func (b *Buffer) trimReply(k int) bool {
	if b.big {
		if k <= b.e.cfg.EagerSize {
			return false
		}
		rv, err := b.rv.Resize(k)
		if err != nil {
			return false
		}
		b.rv, b.n = rv, k
		return true
	}
	h, err := b.head.Resize(HeaderSize + k)
	if err != nil {
		return false
	}
	b.head, b.n = h, k
	return true
}

// Data is the payload. It is valid until Release.
func (m *Msg) Data() []byte {
	if m == nil {
		return nil
	}
	return m.data
}

// Release returns the message's buffer: to the shared receive queue (and a
// receive credit to the peer), or to the pool. It is idempotent.
func (m *Msg) Release() {
	if m.bad() {
		return
	}
	if !m.done.CompareAndSwap(false, true) {
		return
	}
	e := m.p.e
	e.liveMsgs.Add(-1)
	switch {
	case m.spilled:
		if m.sbuf != nil {
			e.spills.Put(m.sbuf)
		}
	case m.large:
		e.large.Free(m.buf)
	case m.copied:
		e.eager.Free(m.buf)
	default:
		e.releaseRecv(m.buf, m.p)
	}
}

// heldBuf is the buffer a message held before it was spilled, to give
// back (Peer.giveBack) outside the stream's lock.
type heldBuf struct {
	buf           mr.Buf
	large, copied bool
}

// spill moves m's payload from byte from on to the heap and returns the
// buffer it held, which the caller gives back: a Conn's data then holds no
// receive buffer, and no credit of the peer's, while it waits for a
// reader (conn.go, "Windows"). m must not be released yet.
func (m *Msg) spill(from int) heldBuf {
	h := heldBuf{buf: m.buf, large: m.large, copied: m.copied}
	e := m.p.e
	n := len(m.data) - from
	var sb *[]byte
	var d []byte
	if n <= e.cfg.EagerSize { // a Conn's message: from the pool
		sb, _ = e.spills.Get().(*[]byte)
		if sb == nil {
			b := make([]byte, e.cfg.EagerSize)
			sb = &b
		}
		d = (*sb)[:n]
	} else {
		d = make([]byte, n)
	}
	copy(d, m.data[from:])
	m.buf, m.data, m.sbuf, m.large, m.copied, m.spilled = mr.Buf{}, d, sb, false, false, true
	e.stats.Spilled.Add(1)
	return h
}

// giveBack returns a spilled message's old buffer, as Release would have.
func (p *Peer) giveBack(h heldBuf) {
	e := p.e
	switch {
	case h.large:
		e.large.Free(h.buf)
	case h.copied:
		e.eager.Free(h.buf)
	default:
		e.releaseRecv(h.buf, p)
	}
}

// Buffer is memory for a message to send without a copy: write the payload
// into Payload() and hand it to Stream.SendBuffer, which takes ownership.
type Buffer struct {
	e    *Endpoint
	head mr.Buf // header (and eager payload)
	rv   mr.Buf // rendezvous payload
	n    int
	big  bool
	user bool // from Alloc and not yet handed back: counted in Endpoint.userBufs
}

// Alloc returns a buffer for an n-byte message. Messages above EagerSize
// use rendezvous memory, written from there straight into the receiver's
// buffer. After Close it fails with ErrClosed.
func (e *Endpoint) Alloc(n int) (*Buffer, error) {
	if e.bad() {
		return nil, errNilEndpoint
	}
	if e.closed.Load() {
		// Else it handed out a buffer of a pool whose regions Close
		// deregistered (pools a held Msg or Buffer kept mapped), or an
		// allocator's error for one it unmapped.
		return nil, fmt.Errorf("bx: Alloc: %w", ErrClosed)
	}
	b, err := e.alloc(n)
	if err != nil {
		return nil, err
	}
	b.user = true
	e.userBufs.Add(1)
	return &b, nil
}

// take is bx taking b over from the user (SendBuffer, CallBuffer): the
// buffer, handed back, and the caller's b emptied, so that it can be
// neither sent nor freed again.
func (b *Buffer) take() Buffer {
	own := *b
	*b = Buffer{}
	own.handBack()
	return own
}

// handBack ends the user's hold on b (SendBuffer, CallBuffer, Free).
func (b *Buffer) handBack() {
	if b.user {
		b.user = false
		b.e.userBufs.Add(-1)
	}
}

// alloc is Alloc without the heap: Call, Send and responses keep their
// Buffer on the stack.
func (e *Endpoint) alloc(n int) (Buffer, error) {
	if n < 0 || n > e.cfg.MaxMessage {
		return Buffer{}, fmt.Errorf("%w: %d bytes, MaxMessage %d", ErrTooLarge, n, e.cfg.MaxMessage)
	}
	if n <= e.cfg.EagerSize {
		h, err := e.eager.Alloc(HeaderSize + n)
		if err != nil {
			return Buffer{}, e.allocErr(err)
		}
		return Buffer{e: e, head: h, n: n}, nil
	}
	h, err := e.eager.Alloc(HeaderSize + rndvSize)
	if err != nil {
		return Buffer{}, e.allocErr(err)
	}
	rv, err := e.rndv.Alloc(n)
	if err != nil {
		e.eager.Free(h)
		return Buffer{}, e.allocErr(err)
	}
	return Buffer{e: e, head: h, rv: rv, n: n, big: true}, nil
}

// Payload is where the message goes.
func (b *Buffer) Payload() []byte {
	if b == nil || b.e == nil {
		return nil
	}
	if b.big {
		return b.rv.Bytes()
	}
	return b.head.Bytes()[HeaderSize : HeaderSize+b.n]
}

// Free returns a buffer that was not sent. It empties b: a second Free
// does nothing, and Payload is nil.
func (b *Buffer) Free() {
	if b == nil || b.e == nil {
		return
	}
	b.handBack()
	b.e.eager.Free(b.head)
	if b.big {
		b.e.rndv.Free(b.rv)
	}
	*b = Buffer{}
}

// Stream is one logical channel to a peer. Any number of streams share the
// peer's few QPs; messages of one stream arrive in order.
type Stream struct {
	p  *Peer
	id uint32

	mu     sync.Mutex
	q      []*Msg
	notify chan struct{}
	err    error
	cl     closeState // under mu: Close and the peer's close (close.go)

	// A Conn's stream: cw is its window (conn.go; set under mu before
	// the stream carries data, nil for other streams), readers the Recvs
	// waiting on it (changed under mu or after; toStream reads it under
	// mu to choose whether a message waits in its buffer or spilled).
	cw      *connWin
	readers atomic.Int32
}

// Stream returns the stream with the given id to the peer, making it if
// there is none. A closed stream stays in the peer's table, and is what
// Stream returns for its id, until both sides have closed it (see
// Stream.Close); then the id names a new stream. A nil Peer (or a zero
// one, not from Dial or Accept) returns a Stream whose every method fails.
func (p *Peer) Stream(id uint32) *Stream {
	if p.bad() {
		return &Stream{id: id}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.streams[id]
	if s == nil {
		s = &Stream{p: p, id: id, notify: make(chan struct{}, 1)}
		if err := p.err; err != nil {
			s.err = err
		}
		p.streams[id] = s
	}
	return s
}

// ID is the stream id.
func (s *Stream) ID() uint32 {
	if s == nil {
		return 0
	}
	return s.id
}

// Peer returns the peer (nil for a nil or zero Stream, or one of a nil Peer).
func (s *Stream) Peer() *Peer {
	if s == nil {
		return nil
	}
	return s.p
}

// Send sends a copy of data.
func (s *Stream) Send(ctx context.Context, data []byte) error {
	if err := s.sendable(ctx); err != nil {
		return err
	}
	b, err := s.p.e.alloc(len(data))
	if err != nil {
		return err
	}
	copy(b.Payload(), data)
	return s.p.sendMsg(ctx, s.id, 0, 0, &b)
}

// SendBuffer sends b without a copy. bx owns b from then on, whatever the
// result: it frees it when the peer acknowledged the message, and empties
// the caller's b at once (it can be neither sent nor freed again). A
// Buffer of another Endpoint is refused (and freed).
func (s *Stream) SendBuffer(ctx context.Context, b *Buffer) error {
	if err := s.sendable(ctx); err != nil {
		b.Free() // nothing for a nil or unallocated b
		return err
	}
	if b == nil || b.e == nil {
		return fmt.Errorf("bx: SendBuffer on stream %d: a nil, unallocated, freed or already sent Buffer", s.id)
	}
	if b.e != s.p.e {
		b.Free()
		return fmt.Errorf("bx: SendBuffer on stream %d: a Buffer of another Endpoint", s.id)
	}
	own := b.take()
	return s.p.sendMsg(ctx, s.id, 0, 0, &own)
}

func (p *Peer) sendMsg(ctx context.Context, stream uint32, flags uint16, call uint64, b *Buffer) error {
	h := header{Type: typData, Flags: flags, CallID: call, Length: uint32(b.n)}
	if b.big && b.n <= p.splitMax {
		return p.sendSplit(ctx, stream, flags, call, b)
	}
	if b.big {
		h.Type, h.Length = typRndv, rndvSize
		d := rndv{Len: uint32(b.n)}
		d.encode(b.head.Bytes()[HeaderSize:])
		// The descriptor is all the message carries.
		head := b.head
		if err := p.send(ctx, stream, h, head, &b.rv); err != nil {
			b.Free()
			return err
		}
		return nil
	}
	if err := p.send(ctx, stream, h, b.head, nil); err != nil {
		b.Free()
		return err
	}
	return nil
}

// trySendMsg is sendMsg without waiting: it reports false, and keeps b,
// when the message cannot go out at once.
func (p *Peer) trySendMsg(stream uint32, flags uint16, call uint64, b *Buffer) bool {
	if b.big && b.n <= p.splitMax {
		return p.trySendSplit(stream, flags, call, b)
	}
	h := header{Type: typData, Flags: flags, CallID: call, Length: uint32(b.n)}
	o := out{buf: b.head, bytes: int64(b.head.Len())}
	if b.big {
		h.Type, h.Length = typRndv, rndvSize
		d := rndv{Len: uint32(b.n)}
		d.encode(b.head.Bytes()[HeaderSize:])
		o.rndv, o.hasRV = b.rv, true
		o.bytes += int64(b.rv.Len())
	}
	sent, err := p.trySendOut(p.lanes[int(stream)%len(p.lanes)], stream, h, &o)
	if sent && err != nil {
		b.Free()
	}
	return sent
}

// Recv returns the next message of the stream. Once the peer closed the
// stream and its messages are read, it returns an error that is io.EOF
// (errors.Is); after Close, one that is ErrClosed.
func (s *Stream) Recv(ctx context.Context) (*Msg, error) {
	if err := s.usable(ctx); err != nil {
		return nil, err
	}
	for {
		s.mu.Lock()
		if err := s.cl.local; err != nil {
			s.passWake()
			return nil, err
		}
		if len(s.q) > 0 {
			// Shift rather than reslice, so that the queue keeps its
			// capacity and a push allocates nothing.
			m := s.q[0]
			n := copy(s.q, s.q[1:])
			s.q[n] = nil
			s.q = s.q[:n]
			last := n == 0 && s.cl.peer
			// Another Recv waits and a message is left: it may have come
			// with ours under one notification (cap 1, taken by us), and
			// that Recv would sleep beside it until the next message.
			more := n > 0 && s.readers.Load() > 0
			s.mu.Unlock()
			if more {
				s.wake()
			}
			if last {
				s.p.forgetStream(s) // closed on both sides and read: its id is free
			}
			return m, nil
		}
		err := s.err
		if err != nil {
			s.passWake()
			return nil, err
		}
		s.readers.Add(1)
		s.mu.Unlock()
		// A reader waits for a message as a Call waits for its
		// response: it polls the CQ itself for a while (pollUntil), and
		// the progress goroutine keeps polling longer while one waits,
		// so that a message that comes within a few Spins costs neither
		// a goroutine hand-off nor a completion event (under emulation a
		// millisecond). A net.Conn's reader (gRPC's, net/http's) waits
		// here between a request and its response.
		e := s.p.e
		e.waiting.Add(1)
		woke := e.pollUntil(ctx, s.ready)
		if !woke {
			select {
			case <-s.notify:
				woke = true
			case <-ctx.Done():
			}
		}
		e.waiting.Add(-1)
		s.readers.Add(-1)
		if !woke {
			return nil, ctx.Err()
		}
	}
}

// passWake unlocks s.mu for a Recv that returns an error, and passes the
// notification on to another Recv waiting: Close and a failure notify
// once (cap 1), and the other Recvs would wait beside the error until
// their contexts end.
func (s *Stream) passWake() {
	more := s.readers.Load() > 0
	s.mu.Unlock()
	if more {
		s.wake()
	}
}

// ready takes the stream's notification if there is one: a message (or
// an error) may be waiting.
func (s *Stream) ready() bool {
	select {
	case <-s.notify:
		return true
	default:
		return false
	}
}

func (s *Stream) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
	s.wakeWriter()
}

// Handler serves RPC requests of one stream id: it returns the response
// payload or an error, whose text the caller receives as a RemoteError.
// The response is copied out before the request is released, after the
// handler returns, so it may alias the request. A handler that builds its
// response in the slice req.Reply gave it is sent with no copy.
type Handler func(ctx context.Context, p *Peer, req *Msg) ([]byte, error)

type handler struct {
	h      Handler
	inline bool
}

// Handle registers the handler for requests on a stream id, for every peer.
// It runs on a bounded pool of goroutines (Config.Workers) and may block.
func (e *Endpoint) Handle(stream uint32, h Handler) {
	if e.bad() {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.handlers[stream] = handler{h: h}
	e.publishHandlers()
	e.serves.Store(true)
}

// HandleInline registers a handler that runs on the goroutine that polls
// the endpoint's CQ (its progress goroutine, or a Call of this process
// polling for its own response) as soon as its request is complete, and
// whose response is posted from there: no goroutine hand-off on either
// side of it. It must
// be quick and must not block (no Call, no Send, no waiting on locks held
// across such), or every peer of the endpoint stalls behind it. A
// response that cannot go out at once (no credit or window yet) goes
// through the worker pool. A handler that panics ends the process, as a
// Handle handler's panic on a worker does, also when a Call's goroutine
// ran it (a recover up that goroutine's stack does not catch it: the
// endpoint's poller was left half way).
func (e *Endpoint) HandleInline(stream uint32, h Handler) {
	if e.bad() {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.handlers[stream] = handler{h: h, inline: true}
	e.publishHandlers()
	e.serves.Store(true)
}

// RemoteError is a handler's error, as the caller sees it.
type RemoteError struct{ Msg string }

func (e *RemoteError) Error() string {
	if e == nil {
		return "bx: nil RemoteError"
	}
	return "bx: remote handler: " + e.Msg
}

func (p *Peer) deliver(m *Msg) {
	switch {
	case m.flags&flagResponse != 0:
		if m.flags&flagError != 0 {
			m.remote = string(m.data)
		}
		if p.deliverSlot(m) {
			return
		}
		var ch chan *Msg
		if p.mapCalls.Load() > 0 {
			p.mu.Lock()
			if ch = p.calls[m.call]; ch != nil {
				delete(p.calls, m.call)
				p.mapCalls.Add(-1)
			}
			p.mu.Unlock()
		}
		if ch == nil {
			m.Release() // the caller gave up
			return
		}
		ch <- m
	case m.flags&flagOpen != 0:
		p.opened(m)
	case m.flags&flagRequest != 0:
		h := p.e.handlerOf(m.Stream)
		if h.inline {
			p.serveInline(h.h, m)
			return
		}
		p.e.queue(work{p: p, h: h.h, req: m})
	default:
		p.toStream(m)
	}
}

func (p *Peer) serve(h Handler, req *Msg) {
	stream, call := req.Stream, req.call
	b, flags, ok := p.respond(h, req)
	if !ok {
		return
	}
	p.releaseServed(req)
	p.sendMsg(context.Background(), stream, flags, call, &b)
}

// serveInline runs h on the polling goroutine and posts its response
// without waiting; one that would wait goes to a worker. The request goes
// back to the receive queue after the response is posted: the response
// leaves first (it was copied out of the request before either).
func (p *Peer) serveInline(h Handler, req *Msg) {
	stream, call := req.Stream, req.call
	b, flags, ok := p.respond(h, req)
	if !ok {
		return
	}
	if p.trySendMsg(stream, flags, call, &b) {
		p.releaseServed(req)
		return
	}
	p.releaseServed(req)
	p.e.queue(work{p: p, resp: b, reply: true, stream: stream, flags: flags, call: call})
}

// releaseServed releases a request whose response is built.
func (p *Peer) releaseServed(req *Msg) {
	req.Release()
	if f := serveReleased.Load(); f != nil {
		(*f)()
	}
}

// respond runs the handler and builds the response in a buffer of ours.
// The request stays the caller's to release (releaseServed) once the
// response is copied out of it; when no response can be built, respond
// releases it and reports false.
func (p *Peer) respond(h Handler, req *Msg) (Buffer, uint16, bool) {
	var resp []byte
	var err error
	if h == nil {
		err = fmt.Errorf("no handler for stream %d", req.Stream)
	} else {
		req.serving.Store(true)
		resp, err = h(p.e.stopCh, p, req)
		req.serving.Store(false)
	}
	flags := uint16(flagResponse)
	if rb := req.reply; rb.e != nil {
		// Built in place (Msg.Reply): sent as it is, if it is there.
		req.reply = Buffer{}
		if err == nil && inReply(resp, &rb) && rb.trimReply(len(resp)) {
			return rb, flags, true
		}
		rb.Free()
	}
	if err != nil {
		flags |= flagError
		resp = []byte(err.Error())
	}
	b, aerr := p.e.alloc(len(resp))
	if aerr != nil {
		flags |= flagError
		resp = []byte(aerr.Error())
		if b, aerr = p.e.alloc(len(resp)); aerr != nil {
			req.Release()
			return Buffer{}, 0, false
		}
	}
	// The response may alias the request (an echo): it is copied out
	// before the request's buffer goes back to the receive queue, where
	// the device may refill it at once.
	copy(b.Payload(), resp)
	return b, flags, true
}

// serveReleased is a test hook (export_test.go): it runs once a request's
// buffer is back in the receive queue, so a test can let the device refill it.
var serveReleased atomic.Pointer[func()]

// Call sends req on the stream as an RPC request and waits for the
// response, which the caller must Release. Errors: *RemoteError from the
// handler, the context's error (wrapped with ErrRecovering if the peer was
// recovering), ErrPeerGone, ErrClosed.
func (p *Peer) Call(ctx context.Context, stream uint32, req []byte) (*Msg, error) {
	if err := p.checkCall(ctx, stream, nil, false); err != nil {
		return nil, err
	}
	b, err := p.e.alloc(len(req))
	if err != nil {
		return nil, err
	}
	copy(b.Payload(), req)
	return p.call(ctx, stream, &b)
}

// CallBuffer is Call with a zero-copy request. bx owns b from then on,
// whatever the result, and empties the caller's b at once (it can be
// neither sent nor freed again). A Buffer of another Endpoint is refused
// (and freed).
func (p *Peer) CallBuffer(ctx context.Context, stream uint32, b *Buffer) (*Msg, error) {
	if err := p.checkCall(ctx, stream, b, true); err != nil {
		if b != nil && b.e != nil {
			b.Free() // bx owns b whatever the result
		}
		return nil, err
	}
	own := b.take()
	return p.call(ctx, stream, &own)
}

// call sends b, ours, as a request on the stream and waits for the
// response.
func (p *Peer) call(ctx context.Context, stream uint32, b *Buffer) (*Msg, error) {
	start := time.Now()
	m, err := p.callBuffer(ctx, stream, b, start)
	p.e.met.observeCall(stream, start, err)
	return m, err
}

// callBuffer sends b as call id's request and waits for the response,
// through id's call slot if it is free, else through the calls map. Two
// functions, so that each has one defer and few returns: the compiler
// then inlines the defer (open-coded) instead of running it through the
// runtime's deferreturn (about 300 instructions per call).
func (p *Peer) callBuffer(ctx context.Context, stream uint32, b *Buffer, start time.Time) (*Msg, error) {
	id := p.callID.Add(1)
	if s, ok := p.claimSlot(id); ok {
		return p.callSlot(ctx, stream, b, s, id, start)
	}
	return p.callMap(ctx, stream, b, id)
}

// callSlot is callBuffer through call slot s, which id has claimed.
func (p *Peer) callSlot(ctx context.Context, stream uint32, b *Buffer, s *callSlot, id uint64, start time.Time) (*Msg, error) {
	if p.state.Load() == stateDead {
		s.forgetSlot(id)
		b.Free()
		return nil, p.Err()
	}
	// The progress goroutine polls while we wait (or we do).
	p.e.waiting.Add(1)
	defer p.e.waiting.Add(-1)
	if err := p.sendMsg(ctx, stream, flagRequest, id, b); err != nil {
		s.forgetSlot(id)
		return nil, err
	}
	return p.waitSlot(ctx, s, id, start)
}

// callMap is callBuffer through the calls map and a channel.
func (p *Peer) callMap(ctx context.Context, stream uint32, b *Buffer, id uint64) (*Msg, error) {
	p.mu.Lock()
	if p.state.Load() == stateDead {
		p.mu.Unlock()
		b.Free()
		return nil, p.Err()
	}
	var ch chan *Msg
	if n := len(p.chans); n > 0 {
		ch = p.chans[n-1]
		p.chans = p.chans[:n-1]
	} else {
		ch = make(chan *Msg, 1)
	}
	p.calls[id] = ch
	p.mapCalls.Add(1)
	p.mu.Unlock()
	// The progress goroutine polls while we wait (or we do: pollFor).
	p.e.waiting.Add(1)
	defer p.e.waiting.Add(-1)
	if err := p.sendMsg(ctx, stream, flagRequest, id, b); err != nil {
		p.forget(id, ch)
		return nil, err
	}
	if m, ok, got := p.e.pollFor(ctx, ch); got {
		return p.answer(ch, m, ok)
	}
	select {
	case m, ok := <-ch:
		return p.answer(ch, m, ok)
	case <-ctx.Done():
		p.forget(id, ch)
		if p.state.Load() == stateRecovering {
			return nil, fmt.Errorf("%w: %w", ErrRecovering, ctx.Err())
		}
		return nil, ctx.Err()
	}
}

// answer is what a Call returns for m, taken from its channel ch (ok:
// not closed by a shutdown).
func (p *Peer) answer(ch chan *Msg, m *Msg, ok bool) (*Msg, error) {
	if !ok {
		return nil, p.Err()
	}
	p.putChan(ch)
	if m.remote != "" || m.flags&flagError != 0 {
		err := &RemoteError{Msg: m.remote}
		m.Release()
		return nil, err
	}
	return m, nil
}

// forget withdraws a call that gives up. A response that deliver already
// took from the table is on its way into ch: it is released here, and ch
// is empty again for the next call (unless shutdown closed it).
func (p *Peer) forget(id uint64, ch chan *Msg) {
	p.mu.Lock()
	_, ours := p.calls[id]
	if ours {
		delete(p.calls, id)
		p.mapCalls.Add(-1)
	}
	p.mu.Unlock()
	if !ours {
		m, ok := <-ch
		if !ok {
			return
		}
		m.Release()
	}
	p.putChan(ch)
}

// putChan keeps an empty call channel for the next call.
func (p *Peer) putChan(ch chan *Msg) {
	p.mu.Lock()
	if len(p.chans) < 64 {
		p.chans = append(p.chans, ch)
	}
	p.mu.Unlock()
}

// IsRemote reports whether err came from the remote handler.
func IsRemote(err error) bool {
	var r *RemoteError
	return errors.As(err, &r)
}
