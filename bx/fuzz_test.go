package bx

import (
	"bytes"
	"slices"
	"testing"
)

// FuzzHeader: a peer controls every byte of a data-plane message. decode
// must never panic, and what it accepts must survive a round trip.
func FuzzHeader(f *testing.F) {
	for _, h := range []header{
		{Type: typData, Stream: 1, Seq: 1, Ack: 0, Credit: 64, Length: 3},
		{Type: typRndv, Flags: flagRequest, Stream: 7, Seq: 9, CallID: 5, Length: rndvSize},
		{Type: typCredit, Ack: 100, Credit: 200, Epoch: 2},
		{Type: typCTS, Stream: 7, Seq: 4, Length: ctsSize},
		{Type: typFin, Stream: 7, Seq: 10, Length: finSize},
		{Type: typSplit, Flags: flagResponse, Stream: 3, Seq: 11, CallID: 9, Length: rndvSize + 5},
		{Type: typPart, Flags: flagResponse, Stream: 3, Seq: 12, CallID: 9, Length: 5},
		{Type: typData, Flags: flagRead, Stream: connBit | 5, Seq: 13, CallID: 1 << 20},
		{Type: typData, Flags: flagRead, Stream: connBit | 5, Seq: 14, CallID: 1 << 20, Length: 2}, // refused: a count has no payload
		{Type: typData, Flags: flagRead | flagRequest, Stream: connBit | 5, Seq: 15, CallID: 3},    // refused
	} {
		b := make([]byte, HeaderSize+int(h.Length))
		h.encode(b)
		f.Add(b)
	}
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var h header
		if err := h.decode(b); err != nil {
			return
		}
		out := make([]byte, HeaderSize)
		h.encode(out)
		if !bytes.Equal(out, b[:HeaderSize]) {
			t.Fatalf("round trip differs: %x vs %x", out, b[:HeaderSize])
		}
		if h.Flags&flagRead != 0 && (h.Type != typData || h.Flags != flagRead || len(b) != HeaderSize) {
			t.Fatalf("accepted a read count in %+v with %d payload bytes", h, len(b)-HeaderSize)
		}
		switch h.Type {
		case typRndv:
			var d rndv
			if err := d.decode(b[HeaderSize:], 4<<20); err == nil && (d.Len == 0 || d.Len > 4<<20) {
				t.Fatalf("accepted rendezvous length %d", d.Len)
			}
		case typCTS:
			var c cts
			if err := c.decode(b[HeaderSize:], 4<<20); err == nil && (c.Ref == 0 || c.Len == 0 || c.Len > 4<<20 || c.Addr+uint64(c.Len) < c.Addr) {
				t.Fatalf("accepted clear-to-send %+v", c)
			}
		case typFin:
			var f fin
			if err := f.decode(b[HeaderSize:]); err == nil && f.Ref == 0 {
				t.Fatal("accepted FIN for sequence 0")
			}
		case typSplit, typPart:
			// A part carries payload, the first its size ahead of it.
			if len(b)-HeaderSize <= splitHead(h.Type) {
				t.Fatalf("accepted part type %d of %d payload bytes", h.Type, len(b)-HeaderSize)
			}
		}
	})
}

// FuzzControl: an unauthenticated peer controls every byte of the control
// plane. decodeCtl must never panic or accept an inconsistent setup.
func FuzzControl(f *testing.F) {
	s := setup{ID: 1, Epoch: 2, Grant: 64, Consumed: 3, Lanes: []laneInfo{{QPN: 17, PSN: 5, Next: 1}, {QPN: 18, PSN: 6, Next: 9, Acked: 4}}, Eager: 8144}
	f.Add(append([]byte{ctlSetup}, s.encode()...))
	s.Grants = []regrant{{Lane: 1, Ref: 7, RKey: 0x1234}, {Lane: 0, Ref: 2, RKey: 0x99}}
	f.Add(append([]byte{ctlRecover}, s.encode()...))
	f.Add(append([]byte{ctlHello}, make([]byte, nonceSize)...)) // wire version 6 or older
	f.Add(append(append([]byte{ctlHello}, make([]byte, nonceSize)...), wireVersion))
	f.Add(append([]byte{ctlAuth}, make([]byte, nonceSize+macSize)...))
	f.Add(append(append([]byte{ctlAuth}, make([]byte, nonceSize+macSize)...), wireVersion))
	f.Add([]byte{ctlPing})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeCtl(b)
		if err != nil {
			return
		}
		switch m.Type {
		case ctlSetup, ctlRecover, ctlRecAck:
			if n := len(m.Setup.Lanes); n == 0 || n > maxLanes || m.Setup.Consumed > m.Setup.Grant {
				t.Fatalf("accepted setup %+v", m.Setup)
			}
			for _, l := range m.Setup.Lanes {
				if l.Next != 0 && l.Acked >= l.Next {
					t.Fatalf("accepted lane %+v acknowledging what it does not have", l)
				}
			}
			for _, g := range m.Setup.Grants {
				if int(g.Lane) >= len(m.Setup.Lanes) {
					t.Fatalf("accepted a window on lane %d of %d", g.Lane, len(m.Setup.Lanes))
				}
			}
			if len(m.Setup.Grants) > maxGrants {
				t.Fatalf("accepted %d windows", len(m.Setup.Grants))
			}
			again, err := decodeSetup(m.Setup.encode())
			if err != nil || again.ID != m.Setup.ID || len(again.Lanes) != len(m.Setup.Lanes) || !slices.Equal(again.Grants, m.Setup.Grants) {
				t.Fatalf("setup round trip: %+v %v", again, err)
			}
		}
	})
}

// FuzzCompact: a compact message stands for its header behind the last
// one on the QP. Whatever headers pass, in whatever order, the receiver's
// record rebuilds exactly the header the sender left out, and only plain
// requests and responses of the last stream and epoch go compact. A peer
// controls the immediate: expand must never panic, and refuses a compact
// message before any full header or out of sequence.
func FuzzCompact(f *testing.F) {
	f.Add([]byte{0, 1, 1, 1, 1, 0, 0, 1, 2, 1, 1, 0, 0, 0})
	f.Add([]byte{3, 200, 255, 0, 9, 1, 0, 0, 0, 0, 0, 0, 7, 1, 1, 1, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var sent, rcvd hdrTrack
		var h header
		h.Stream, h.Epoch = 1, 1
		seq, call := uint64(0), uint64(0)
		for len(b) >= 7 {
			step := b[:7]
			b = b[7:]
			seq++
			h.Seq = seq
			h.Type = typData
			h.Flags = []uint16{0, flagRequest, flagResponse, flagRequest | flagOpen, flagResponse | flagError, flagClose, flagOpen, flagRead}[step[0]&7]
			if step[0]&8 != 0 {
				h.Type = typCredit
			}
			if step[0]&16 != 0 {
				h.Stream = uint32(step[6]&7) + 1 // one of 8
			}
			if step[0]&32 != 0 {
				h.Epoch++
			}
			h.Ack += uint64(step[1])
			h.Credit += uint64(step[2])
			if step[3]&1 != 0 {
				call -= uint64(step[4]) << (step[3] >> 1 & 7)
			} else {
				call += uint64(step[4]) << (step[3] >> 1 & 7)
			}
			h.CallID = call
			if step[3]&0x80 != 0 {
				h.CallID = 0
			}
			h.Length = uint32(step[5])
			imm, ok := sent.compact(&h)
			sent.set(&h)
			if !ok {
				rcvd.set(&h)
				continue
			}
			if h.Type != typData || h.Flags&^(flagRequest|flagResponse) != 0 || (h.Flags == 0) != (h.CallID == 0) {
				t.Fatalf("compact %+v", h)
			}
			var got header
			if err := rcvd.expand(imm, seq, int(h.Length), &got); err != nil {
				t.Fatalf("expand %#x for %+v: %v", imm, h, err)
			}
			if got != h {
				t.Fatalf("expand %#x: %+v, sent %+v", imm, got, h)
			}
			if err := rcvd.expand(imm, seq+1, int(h.Length), &got); err == nil {
				t.Fatalf("expand %#x accepted sequence %d for %d", imm, seq+1, seq)
			}
			rcvd.set(&got)
			// Whatever the immediate, a peer's compact message before a
			// full header is refused, one with flags code 3 too, and
			// expand does not panic.
			var empty hdrTrack
			junk := uint32(step[6]) * 0x01010101
			if err := empty.expand(junk, seq, 0, &got); err == nil {
				t.Fatal("compact message accepted before a full header")
			}
			if err := rcvd.expand(junk|3<<30, seq, 0, &got); err == nil {
				t.Fatalf("compact message with flags code 3 accepted: %+v", got)
			}
			_ = rcvd.expand(junk, seq, 0, &got)
			rcvd.set(&h)
		}
	})
}

// TestHdrTrackStreams: the record keeps the four streams last seen, the
// newest first, as both sides must (a compact message names its stream by
// its place there): a stream seen again moves to the front, a fifth one
// pushes out the oldest, and the newest seen again changes nothing.
func TestHdrTrackStreams(t *testing.T) {
	var tr hdrTrack
	for _, c := range []struct {
		stream uint32
		want   [4]uint32
	}{
		{7, [4]uint32{7, 7, 7, 7}},
		{7, [4]uint32{7, 7, 7, 7}},
		{1, [4]uint32{1, 7, 7, 7}},
		{2, [4]uint32{2, 1, 7, 7}},
		{3, [4]uint32{3, 2, 1, 7}},
		{1, [4]uint32{1, 3, 2, 7}},
		{2, [4]uint32{2, 1, 3, 7}},
		{1, [4]uint32{1, 2, 3, 7}},
		{7, [4]uint32{7, 1, 2, 3}},
		{4, [4]uint32{4, 7, 1, 2}},
		{3, [4]uint32{3, 4, 7, 1}},
	} {
		tr.set(&header{Type: typData, Stream: c.stream})
		if tr.streams != c.want {
			t.Fatalf("after stream %d: streams %v, want %v", c.stream, tr.streams, c.want)
		}
	}
}
