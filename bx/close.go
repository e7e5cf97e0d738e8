package bx

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// Closing streams. Each side of a stream sends one close message (a
// zero-length data message with flagClose) when it closes the stream or,
// if the peer closed first, in answer to the peer's. A stream leaves its
// peer's table once both close messages have passed and nothing of it is
// left to read: the side that closed first keeps it until the answer comes
// (messages the peer sent before it learned of the close are released on
// arrival, counted in Stats.ClosedDrops); the other side keeps it until
// its messages are read (Recv returns io.EOF) or it closes it too. So a
// peer that opens and closes streams forever holds only the open ones.

// closeState is a stream's part in closing. It is under Stream.mu.
type closeState struct {
	local error // set by Close: what Send and Recv return from then on
	peer  bool  // the peer's close message arrived
	sent  bool  // ours was sent (or needs not be: the peer is gone)
	gone  bool  // out of the peer's table
}

// ErrStreamClosed is what Send returns on a stream the peer closed.
var ErrStreamClosed = errors.New("bx: stream closed by the peer")

// usable checks the receiver and the context of a public Stream method.
func (s *Stream) usable(ctx context.Context) error {
	switch {
	case s.bad():
		return errNilStream
	case ctx == nil:
		return fmt.Errorf("bx: stream %d: nil context", s.id)
	}
	return nil
}

// sendable reports why s cannot send, if it cannot.
func (s *Stream) sendable(ctx context.Context) error {
	if err := s.usable(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.cl.local != nil:
		return s.cl.local
	case s.cl.peer:
		return fmt.Errorf("bx: stream %d: send after the peer closed it: %w", s.id, ErrStreamClosed)
	}
	return nil
}

// Close closes the stream: messages queued and not read are released
// (their receive buffers go back, and with them the peer's credits), the
// peer learns it (its Recv returns io.EOF once it read what was sent
// before), and Send and Recv return ErrClosed from then on. It is
// idempotent. Its error says that the peer could not be told (within
// Config.HandshakeTimeout, or because it is gone mid-close); the stream is
// closed here all the same. A Send in progress on another goroutine may
// still deliver after the close message: the peer releases it.
func (s *Stream) Close() error { return s.close(true) }

// close is Close; without wait (Conn.Close, which must not block the way
// a net.Conn's Close does not) the close message goes out now if a credit
// is there and otherwise from a worker once one is (sendClose), and close
// returns at once.
func (s *Stream) close(wait bool) error {
	if err := s.usable(context.Background()); err != nil {
		return err
	}
	p := s.p
	p.mu.Lock()
	s.mu.Lock()
	if s.cl.local != nil {
		s.mu.Unlock()
		p.mu.Unlock()
		return nil
	}
	s.cl.local = fmt.Errorf("%w: stream %d was closed", ErrClosed, s.id)
	q := s.q
	s.q = nil
	send := !s.cl.sent && p.state.Load() != stateDead
	s.cl.sent = true
	if s.cl.peer || !send {
		p.dropStream(s)
	}
	s.mu.Unlock()
	p.mu.Unlock()
	for _, m := range q {
		m.Release()
	}
	s.wake()
	if !send {
		return nil
	}
	if !wait {
		p.sendClose(s.id)
		return nil
	}
	b, err := p.e.alloc(0)
	if err == nil {
		ctx, cancel := context.WithTimeout(p.e.stopCh, p.e.cfg.HandshakeTimeout)
		err = p.sendMsg(ctx, s.id, flagClose, 0, &b)
		cancel()
	}
	if err != nil {
		// The peer does not answer a close it did not get: forget it now.
		p.forgetStream(s)
		return fmt.Errorf("bx: stream %d: close not sent to the peer: %w", s.id, err)
	}
	return nil
}

func (s *Stream) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// wakeWriter wakes a Conn's Write waiting for its window to look again.
// s.cw is set before the Conn is used and never changes after.
func (s *Stream) wakeWriter() {
	s.mu.Lock()
	cw := s.cw
	s.mu.Unlock()
	if cw != nil {
		cw.poke()
	}
}

// dropStream takes s out of the peer's table. p.mu and s.mu are held.
func (p *Peer) dropStream(s *Stream) {
	if !s.cl.gone && p.streams[s.id] == s {
		delete(p.streams, s.id)
	}
	s.cl.gone = true
}

// forgetStream takes s out of the peer's table.
func (p *Peer) forgetStream(s *Stream) {
	p.mu.Lock()
	s.mu.Lock()
	p.dropStream(s)
	s.mu.Unlock()
	p.mu.Unlock()
}

// toStream queues a data message (or handles a close message) of a
// stream. It runs on the progress goroutine.
func (p *Peer) toStream(m *Msg) {
	if m.flags&flagClose != 0 {
		id := m.Stream
		m.Release()
		p.closedByPeer(id)
		return
	}
	if m.flags&flagRead != 0 {
		p.connRead(m)
		return
	}
	p.mu.Lock()
	s := p.streams[m.Stream]
	if s == nil {
		s = &Stream{p: p, id: m.Stream, notify: make(chan struct{}, 1), err: p.err}
		p.streams[m.Stream] = s
	}
	s.mu.Lock()
	p.mu.Unlock()
	if s.cl.local != nil || s.cl.peer {
		// Closed here (the peer sent it before it saw our close), or sent
		// after the peer's own close: nobody will read it.
		s.mu.Unlock()
		m.Release()
		p.e.stats.ClosedDrops.Add(1)
		return
	}
	// A Conn's message that no Recv waits for gives its receive buffer
	// back now: unread, it would hold a credit of the peer's, which every
	// stream and Conn to the peer shares (conn.go, "Windows").
	var h heldBuf
	spill := s.cw != nil && s.readers.Load() == 0
	if spill {
		h = m.spill(0)
	}
	s.q = append(s.q, m)
	s.mu.Unlock()
	if spill {
		p.giveBack(h)
	}
	s.wake()
}

// closedByPeer handles the peer's close message for stream id: the
// stream's Recv returns io.EOF after what is queued, and unless we closed
// it first, our close message answers. It runs on the progress goroutine
// and does not wait.
func (p *Peer) closedByPeer(id uint32) {
	p.mu.Lock()
	s := p.streams[id]
	answer := true
	if s != nil {
		s.mu.Lock()
		s.cl.peer = true
		answer = !s.cl.sent
		s.cl.sent = true
		if s.err == nil {
			s.err = fmt.Errorf("bx: stream %d closed by the peer: %w", id, io.EOF)
		}
		if s.cl.local != nil || len(s.q) == 0 {
			p.dropStream(s)
		}
		s.mu.Unlock()
	}
	p.mu.Unlock()
	if s != nil {
		s.wake()
		s.wakeWriter() // a Write waiting for the window: the reader is gone
	}
	if answer {
		p.sendClose(id)
	}
}

// sendClose sends our close message for stream id without waiting: from
// here if it can go at once, else from a worker.
func (p *Peer) sendClose(id uint32) {
	b, err := p.e.alloc(0)
	if err != nil {
		// The pool is at its limit: the peer keeps the stream until it
		// goes. Counted, not silent.
		p.e.stats.ClosedDrops.Add(1)
		return
	}
	p.sendOrQueue(id, flagClose, 0, b)
}

// sendOrQueue sends b on stream id without waiting: from here if it can go
// at once (trySendMsg), else from a worker, which may wait for a credit.
func (p *Peer) sendOrQueue(id uint32, flags uint16, call uint64, b Buffer) {
	if !p.trySendMsg(id, flags, call, &b) {
		p.e.queue(work{p: p, resp: b, reply: true, stream: id, flags: flags, call: call})
	}
}

// StreamCount is the number of streams in the peer's table: open ones, and
// closed ones whose close the peer has not answered yet or whose messages
// are not read yet.
func (p *Peer) StreamCount() int {
	if p.bad() {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.streams)
}

// checkCall validates a Call's arguments; buffer says b is CallBuffer's.
func (p *Peer) checkCall(ctx context.Context, stream uint32, b *Buffer, buffer bool) error {
	switch {
	case p.bad():
		return errNilPeer
	case ctx == nil:
		return fmt.Errorf("bx: Call on stream %d: nil context", stream)
	case buffer && (b == nil || b.e == nil):
		return fmt.Errorf("bx: CallBuffer on stream %d: a Buffer not from Endpoint.Alloc, or freed or already sent", stream)
	case buffer && b.e != p.e:
		return fmt.Errorf("bx: CallBuffer on stream %d: a Buffer of another Endpoint", stream)
	}
	return nil
}
