package bx

import (
	"context"
	"fmt"

	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
)

// Split messages (wire.go, "Split messages"): a payload above EagerSize
// and at most Config.SplitSize goes as parts, each an eager message of
// its own on the lane, posted in consecutive sequence numbers under the
// lane's send lock so that nothing comes between them.

// partLen is the payload share of part i of a split message whose payload
// has rest bytes left from that part on.
func (c *Config) partLen(i, rest int) int {
	room := c.EagerSize
	if i == 0 {
		room -= rndvSize
	}
	return min(rest, room)
}

// splitHeaders fills hdrs with the parts' header buffers for b, the first
// b's own (it has room for the size), and returns the parts' count and
// bytes for the window. On error nothing is held and b is untouched.
func (p *Peer) splitHeaders(b *Buffer, hdrs *[MaxParts]mr.Buf) (int, int64, error) {
	k := p.e.cfg.parts(b.n)
	if k > MaxParts {
		return 0, 0, fmt.Errorf("bx: a split message of %d bytes in %d parts, more than %d", b.n, k, MaxParts)
	}
	hdrs[0] = b.head
	for i := 1; i < k; i++ {
		h, err := p.e.eager.Alloc(HeaderSize)
		if err != nil {
			p.freeHeaders(hdrs[1:i])
			return 0, 0, err
		}
		hdrs[i] = h
	}
	total := int64(b.n)
	for _, h := range hdrs[:k] {
		total += int64(h.Len())
	}
	return k, total, nil
}

func (p *Peer) freeHeaders(hdrs []mr.Buf) {
	for _, h := range hdrs {
		p.e.eager.Free(h)
	}
}

// sendSplit sends b (big, within SplitSize) in parts on the stream's lane,
// waiting for window and credits as sendOut does. b is consumed either way.
func (p *Peer) sendSplit(ctx context.Context, s uint32, flags uint16, call uint64, b *Buffer) error {
	var hdrs [MaxParts]mr.Buf
	k, total, err := p.splitHeaders(b, &hdrs)
	if err != nil {
		b.Free()
		return err
	}
	l := p.lanes[int(s)%len(p.lanes)]
	epoch, err := p.admit(ctx, l, k, total, false)
	if err != nil {
		p.freeHeaders(hdrs[1:k])
		b.Free()
		return err
	}
	return p.postSplit(l, s, flags, call, b, hdrs[:k], total, epoch)
}

// trySendSplit is sendSplit without waiting, for the progress goroutine:
// it reports false, and keeps b, when the parts cannot go out at once.
func (p *Peer) trySendSplit(s uint32, flags uint16, call uint64, b *Buffer) bool {
	if p.state.Load() != stateActive {
		return false
	}
	var hdrs [MaxParts]mr.Buf
	k, total, err := p.splitHeaders(b, &hdrs)
	if err != nil {
		return false
	}
	l := p.lanes[int(s)%len(p.lanes)]
	epoch, ok := p.tryAdmit(l, k, total, false)
	if !ok {
		p.freeHeaders(hdrs[1:k])
		return false
	}
	p.postSplit(l, s, flags, call, b, hdrs[:k], total, epoch)
	return true
}

// postSplit sequences and posts the parts of b once their window shares
// and credits (consumed in epoch) are taken. The parts own b's memory
// from here: each its header buffer, the last the payload.
func (p *Peer) postSplit(l *lane, s uint32, flags uint16, call uint64, b *Buffer, hdrs []mr.Buf, total int64, epoch uint32) error {
	l.mu.Lock()
	if p.state.Load() == stateDead {
		l.mu.Unlock()
		p.unadmit(l, len(hdrs), total, false)
		p.freeHeaders(hdrs[1:])
		b.Free()
		return p.Err()
	}
	b.handBack()
	d := rndv{Len: uint32(b.n)}
	d.encode(hdrs[0].Bytes()[HeaderSize:])
	live, queued := l.live, l.queued.Load()
	now := live && !queued && epoch == l.epoch // as postOut
	first := l.nextSeq
	if now && l.pwr == nil {
		l.pwr, l.psge = make([]qp.SendWR, MaxParts), make([]qp.SGE, 2*MaxParts)
	}
	var ack uint64
	if now {
		l.rmu.Lock()
		ack = l.delivered
		l.rmu.Unlock()
	}
	var err error
	off := 0
	for i, hb := range hdrs {
		c := p.e.cfg.partLen(i, b.n-off)
		part := b.rv.SGE(c)
		part.Addr += uint64(off)
		off += c
		o := out{seq: l.nextSeq, buf: hb, bytes: int64(hb.Len() + c), paid: epoch + 1, part: part}
		if i == len(hdrs)-1 {
			o.rndv, o.hasRV = b.rv, true
		}
		l.nextSeq++
		h := header{Type: typPart, Flags: flags, Stream: s, Seq: o.seq, CallID: call,
			Length: uint32(hb.Len() - HeaderSize + c)}
		if i == 0 {
			h.Type = typSplit
		}
		l.pushOut(&o)
		if now {
			h.Ack = ack
			p.stagePart(l, h, &o, i)
			continue
		}
		// Queued behind resends, or for recovery to post (as postOut
		// does): from the header kept in its buffer.
		h.encode(hb.Bytes()[:HeaderSize])
	}
	switch {
	case now:
		// One doorbell for all parts: under rxe each is a system call
		// and a run of the kernel's requester.
		err = l.qp.PostSend(l.pwr[:len(hdrs)])
	case live:
		l.queueFrom(first)
		err = p.drainQueued(l)
	}
	l.mu.Unlock()
	if err != nil {
		// The parts are queued for resending after recovery.
		p.laneFailed(l, err)
	}
	p.e.stats.Sent.Add(1)
	return nil
}

// stagePart writes part i's header (with the acknowledgement h carries
// and fresh credits) into its buffer and its work request into l.pwr,
// as post does for a message of its own. l.mu is held.
func (p *Peer) stagePart(l *lane, h header, o *out, i int) {
	h.Credit, h.Epoch = p.ret.PiggybackEpoch()
	l.ackSent.Store(h.Ack)
	h.encode(o.buf.Bytes()[:HeaderSize])
	l.sentHdr.set(&h)
	flags := l.sendFlags()
	sg := l.psge[2*i : 2*i+2]
	sg[0], sg[1] = o.buf.SGE(o.buf.Len()), o.part
	l.pwr[i] = qp.SendWR{ID: tagSend, Opcode: qp.OpSend, Flags: flags, SGEs: sg}
}

// takePart takes in a part of a split message (l.rmu held; h is in
// sequence): the first makes the message, with a buffer of its size, as
// the pending entry that holds its place; each part's payload is copied
// in, and a later part holds its own place in the sequence. The last
// makes the message done. An error is the peer's protocol violation
// (protocol) or a buffer bx could not get.
func (p *Peer) takePart(l *lane, h *header, data []byte) (protocol bool, err error) {
	body := data[HeaderSize:] // a part never goes compact
	s := l.split
	switch {
	case h.Type == typSplit && s == nil:
		var d rndv
		if err := d.decode(body, p.e.cfg.MaxMessage); err != nil {
			return true, err
		}
		body = body[rndvSize:]
		if len(body) > int(d.Len) {
			return true, fmt.Errorf("lane %d: split message of %d bytes with %d in its first part", l.idx, d.Len, len(body))
		}
		t, err := p.e.large.Alloc(int(d.Len))
		if err != nil {
			return false, fmt.Errorf("bx: split message of %d bytes: %w", d.Len, err)
		}
		s = l.newInbound(*h)
		s.msg = p.e.newMsg()
		*s.msg = Msg{p: p, Stream: h.Stream, buf: t, large: true, data: t.Bytes()[:d.Len], call: h.CallID, flags: h.Flags}
		p.e.liveMsgs.Add(1)
		l.pending = append(l.pending, s)
		l.split, l.splitOff = s, 0
		p.e.stats.Received.Add(1)
		p.e.stats.Split.Add(1)
	case h.Type == typPart && s != nil:
		if h.Stream != s.h.Stream || h.CallID != s.h.CallID || h.Flags != s.h.Flags {
			return true, fmt.Errorf("lane %d: part %d of stream %d call %d flags %#x inside the split message %d of stream %d call %d flags %#x",
				l.idx, h.Seq, h.Stream, h.CallID, h.Flags, s.h.Seq, s.h.Stream, s.h.CallID, s.h.Flags)
		}
		if l.splitOff+len(body) > len(s.msg.data) {
			return true, fmt.Errorf("lane %d: part %d past the %d bytes of its split message", l.idx, h.Seq, len(s.msg.data))
		}
		in := l.newInbound(*h)
		in.done = true
		l.pending = append(l.pending, in)
	case s != nil:
		return true, fmt.Errorf("lane %d: message type %d (sequence %d) inside the split message %d", l.idx, h.Type, h.Seq, s.h.Seq)
	default:
		return true, fmt.Errorf("lane %d: part %d of a split message with none in progress", l.idx, h.Seq)
	}
	l.splitOff += copy(s.msg.data[l.splitOff:], body)
	if l.splitOff == len(s.msg.data) {
		s.done, l.split = true, nil
	}
	return false, nil
}
