package bx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
)

// HeaderSize is the size of the header in front of every data-plane
// message.
const HeaderSize = 48

// wireVersion 2: rendezvous by RDMA WRITE (RTS, CTS, FIN) instead of READ.
// 3: the CTS names a memory window bound for the one transfer, the FIN is a
// SEND_WITH_INV of it, and a recovery setup carries the new windows of
// transfers in progress (grant.go). 4: compact data messages (below). 5:
// split messages (below). 6: a Conn's reader tells its writer how much it
// has read (flagRead), and the writer keeps at most a window of bytes
// unread (conn.go). 7: the hello and the auth of the control connection
// name the wire version, so that ends of different versions refuse each
// other at the handshake, not at their first data message (control.go).
const wireVersion = 7

// Message types. Data, RTS, CTS and FIN are sequenced on their lane (and
// resent after a QP failure until acknowledged); credit updates are not.
const (
	typData   = 1 // payload follows the header
	typRndv   = 2 // RTS: a large message of rndv.Len bytes waits for a target
	typCredit = 3 // explicit credit and acknowledgement update, no payload
	typCTS    = 4 // clear to send: where to WRITE the payload of an RTS
	typFin    = 5 // the payload of an RTS was written (the WRITE precedes it on the QP)
	typSplit  = 6 // the first part of a split message: its size (a rndv), then payload
	typPart   = 7 // a later part of a split message: payload
)

// Header flags.
const (
	flagRequest  = 1 << 0 // RPC request; CallID names the call
	flagResponse = 1 << 1 // RPC response
	flagError    = 1 << 2 // RPC response carrying a handler error string
	flagOpen     = 1 << 3 // first message of a net.Conn stream
	flagClose    = 1 << 4 // the sender closed its side of a net.Conn stream
	flagWindow   = 1 << 5 // CTS: the rkey is a memory window; the FIN must invalidate it (SEND_WITH_INV)
	flagRead     = 1 << 6 // a Conn's reader has read CallID bytes of the stream in all (no payload)
)

// header is the data-plane message header. Every message carries the
// sender's cumulative grant of receive credits and its cumulative
// acknowledgement of the lane's messages, so that both flow back without
// messages of their own while there is traffic.
type header struct {
	Type   uint8
	Flags  uint16
	Stream uint32
	Seq    uint64 // lane sequence number of this message (0: unsequenced)
	Ack    uint64 // highest lane sequence delivered from the peer
	Credit uint64 // cumulative receive credits granted to the peer
	CallID uint64
	Length uint32 // payload bytes after the header (data), or descriptor size
	Epoch  uint32 // the credit epoch of Credit
}

func (h *header) encode(b []byte) {
	_ = b[HeaderSize-1]
	b[0] = wireVersion
	b[1] = h.Type
	binary.LittleEndian.PutUint16(b[2:], h.Flags)
	binary.LittleEndian.PutUint32(b[4:], h.Stream)
	binary.LittleEndian.PutUint64(b[8:], h.Seq)
	binary.LittleEndian.PutUint64(b[16:], h.Ack)
	binary.LittleEndian.PutUint64(b[24:], h.Credit)
	binary.LittleEndian.PutUint64(b[32:], h.CallID)
	binary.LittleEndian.PutUint32(b[40:], h.Length)
	binary.LittleEndian.PutUint32(b[44:], h.Epoch)
}

// Compact data messages. A data message whose header differs from the
// last header on its lane's QP only in what 32 bits can say goes without
// the header: a SEND_WITH_IMM of the payload alone, the immediate saying
// what changed. The header's 48 bytes cost a packet whenever they push a
// message over a multiple of the path MTU: a 4096-byte payload is 4
// packets at IB MTU 1024 and 1 at 4096, but 5 and 2 with the header, and
// under rxe a packet costs about 18 us a leg (docs/perf.md, "Thirty-second
// session"). The sequence is implied, RC delivers a QP's messages in
// order, so the receiver knows the next one; its low bits travel as a
// check. The sender posts one only fresh on a live lane, never as a
// resend, and only behind a full header on the same QP: each side's
// record of the headers (hdrTrack) starts empty with every new QP and
// follows every header posted (post, sendUpdate) or received (received),
// in the QP's order. The immediate, from bit 31 down:
//
//	2 bits   the flags: none (a stream's message, call ID 0), request or
//	         response; any other flag needs a full header
//	2 bits   the sequence's low bits
//	2 bits   the stream: which of the four streams last seen
//	7 bits   Ack - the last Ack
//	8 bits   Credit - the last Credit (same epoch)
//	11 bits  CallID - the last nonzero CallID, signed (0 without flags)
//
// The credit epoch is the last header's; the length is the completion's
// byte count.
const (
	immFlagShift   = 30 // 0: no flags, 1: request, 2: response
	immSeqShift    = 28
	immSeqMask     = 3
	immStreamShift = 26
	immAckShift    = 19
	immAckMax      = 1<<7 - 1
	immCredShift   = 11
	immCredMax     = 1<<8 - 1
	immCallBits    = 11
	immCallMask    = 1<<immCallBits - 1
)

// compactHeaders: GOVERBS_BX_COMPACT=0 sends every header in full (to
// measure what compact messages save).
var compactHeaders = os.Getenv("GOVERBS_BX_COMPACT") != "0"

// hdrTrack is one side's record of the headers on a lane's QP.
type hdrTrack struct {
	ok          bool      // a full header has passed on this QP
	streams     [4]uint32 // the streams last seen, the newest first
	epoch       uint32
	ack, credit uint64
	call        uint64 // the last nonzero call ID
}

// set records h as the last header.
func (t *hdrTrack) set(h *header) {
	if !t.ok {
		t.ok, t.streams = true, [4]uint32{h.Stream, h.Stream, h.Stream, h.Stream}
	}
	if t.streams[0] != h.Stream { // else the order stays (most messages)
		i := 1
		for i < 3 && t.streams[i] != h.Stream {
			i++
		}
		copy(t.streams[1:i+1], t.streams[:i])
		t.streams[0] = h.Stream
	}
	t.epoch, t.ack, t.credit = h.Epoch, h.Ack, h.Credit
	if h.CallID != 0 {
		t.call = h.CallID
	}
}

// compact returns the immediate that stands for h behind the last header,
// or false if h needs the full header.
func (t *hdrTrack) compact(h *header) (uint32, bool) {
	if !t.ok || h.Type != typData || h.Epoch != t.epoch {
		return 0, false
	}
	si := 0
	for si < 4 && t.streams[si] != h.Stream {
		si++
	}
	if si == 4 {
		return 0, false
	}
	var imm uint32
	dCall := int64(h.CallID - t.call)
	switch h.Flags {
	case 0:
		if h.CallID != 0 {
			return 0, false
		}
		dCall = 0
	case flagRequest:
		imm = 1 << immFlagShift
	case flagResponse:
		imm = 2 << immFlagShift
	default:
		return 0, false
	}
	dAck, dCred := h.Ack-t.ack, h.Credit-t.credit
	if h.Flags != 0 && (h.CallID == 0 || dCall < -(1<<(immCallBits-1)) || dCall >= 1<<(immCallBits-1)) {
		return 0, false
	}
	if dAck > immAckMax || dCred > immCredMax {
		return 0, false
	}
	imm |= uint32(h.Seq&immSeqMask)<<immSeqShift | uint32(si)<<immStreamShift |
		uint32(dAck)<<immAckShift | uint32(dCred)<<immCredShift | uint32(dCall)&immCallMask
	return imm, true
}

// expand fills h from imm, the immediate of a compact message of n
// payload bytes whose place in the sequence is seq, and the last header.
func (t *hdrTrack) expand(imm uint32, seq uint64, n int, h *header) error {
	if !t.ok {
		return errors.New("bx: compact message before a full header on the QP")
	}
	if got := uint64(imm>>immSeqShift) & immSeqMask; got != seq&immSeqMask {
		return fmt.Errorf("bx: compact message of sequence ...%d (low bits), expected %d", got, seq)
	}
	dCall := int64(imm&immCallMask) << (64 - immCallBits) >> (64 - immCallBits)
	call := t.call + uint64(dCall)
	var flags uint16
	switch imm >> immFlagShift {
	case 0:
		if dCall != 0 {
			return fmt.Errorf("bx: compact stream message with a call ID (immediate %#x)", imm)
		}
		call = 0
	case 1:
		flags = flagRequest
	case 2:
		flags = flagResponse
	default:
		return fmt.Errorf("bx: compact message with flags code 3 (immediate %#x)", imm)
	}
	if flags != 0 && call == 0 {
		return fmt.Errorf("bx: compact call message of call ID 0 (immediate %#x)", imm)
	}
	*h = header{Type: typData, Flags: flags, Stream: t.streams[imm>>immStreamShift&3], Seq: seq,
		Ack:    t.ack + uint64(imm>>immAckShift&immAckMax),
		Credit: t.credit + uint64(imm>>immCredShift&immCredMax),
		CallID: call, Length: uint32(n), Epoch: t.epoch}
	return nil
}

var errShortHeader = errors.New("bx: message shorter than its header")

// decode parses a header from b, the bytes that arrived. It checks
// everything a peer could get wrong: version, type, and that the payload
// length matches what arrived.
func (h *header) decode(b []byte) error { return h.parse(b, len(b)) }

// parse is decode of a message of n bytes whose first len(b) are b (a
// part of a split message, kept for resending: its payload is not behind
// its header in memory).
func (h *header) parse(b []byte, n int) error {
	if len(b) < HeaderSize || n < HeaderSize {
		return errShortHeader
	}
	if b[0] != wireVersion {
		return fmt.Errorf("bx: wire version %d, want %d", b[0], wireVersion)
	}
	h.Type = b[1]
	h.Flags = binary.LittleEndian.Uint16(b[2:])
	h.Stream = binary.LittleEndian.Uint32(b[4:])
	h.Seq = binary.LittleEndian.Uint64(b[8:])
	h.Ack = binary.LittleEndian.Uint64(b[16:])
	h.Credit = binary.LittleEndian.Uint64(b[24:])
	h.CallID = binary.LittleEndian.Uint64(b[32:])
	h.Length = binary.LittleEndian.Uint32(b[40:])
	h.Epoch = binary.LittleEndian.Uint32(b[44:])
	switch h.Type {
	case typData, typSplit, typPart:
		if int(h.Length) != n-HeaderSize {
			return fmt.Errorf("bx: data message says %d payload bytes, %d arrived", h.Length, n-HeaderSize)
		}
		// A part carries payload; the first, its size ahead of it.
		if head := splitHead(h.Type); h.Type != typData && int(h.Length) <= head {
			return fmt.Errorf("bx: part of a split message (type %d) with %d payload bytes", h.Type, h.Length)
		}
	case typRndv, typCTS, typFin:
		want := rndvSize
		switch h.Type {
		case typCTS:
			want = ctsSize
		case typFin:
			want = finSize
		}
		if n-HeaderSize != want || int(h.Length) != want {
			return fmt.Errorf("bx: rendezvous message type %d of %d bytes, want %d", h.Type, n-HeaderSize, want)
		}
		// (The window flag, on anything but a CTS, is refused below.)
		if h.Type != typRndv && h.Flags&^flagWindow != 0 {
			return fmt.Errorf("bx: rendezvous control message type %d with flags %#x", h.Type, h.Flags)
		}
	case typCredit:
		if n != HeaderSize || h.Length != 0 {
			return fmt.Errorf("bx: credit update with %d payload bytes", n-HeaderSize)
		}
	default:
		return fmt.Errorf("bx: unknown message type %d", h.Type)
	}
	if h.Flags&^(flagRequest|flagResponse|flagError|flagOpen|flagClose|flagWindow|flagRead) != 0 {
		return fmt.Errorf("bx: unknown flags %#x", h.Flags)
	}
	if h.Flags&flagRead != 0 && (h.Type != typData || h.Flags != flagRead || h.Length != 0) {
		return fmt.Errorf("bx: read count in a message of type %d, flags %#x, %d payload bytes", h.Type, h.Flags, h.Length)
	}
	if h.Type != typCTS && h.Flags&flagWindow != 0 {
		return fmt.Errorf("bx: message type %d with the window flag", h.Type)
	}
	if h.Flags&flagRequest != 0 && h.Flags&flagResponse != 0 {
		return errors.New("bx: message is both request and response")
	}
	return nil
}

// Rendezvous. A payload above EagerSize is not sent in the message: the
// sender posts an RTS (rndv) naming its size; the receiver takes a buffer
// from its own pool and answers with a CTS naming it; the sender RDMA
// WRITEs the payload there and posts a FIN behind the WRITE on the same QP,
// so the payload is in place when the FIN arrives (RC order). The receiver
// delivers the message at the FIN, in sequence order. A receiver exposes
// only its rendezvous targets, for remote write: only the one target of
// each transfer, to the one peer, through a memory window that the FIN, a
// SEND_WITH_INV, closes (grant.go; with Config.SharedTargets all of its
// targets, under one rkey); no memory is
// remotely readable. (An earlier version had the receiver READ the payload; rxe on
// Linux 6.1 turns a READ response that lost a packet mid-message into a
// false success completion and a QP error, so READ was dropped.)

// rndv is an RTS: the payload size.
type rndv struct {
	Len uint32
}

const rndvSize = 8

func (r *rndv) encode(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], r.Len)
	binary.LittleEndian.PutUint32(b[4:], 0)
}

func (r *rndv) decode(b []byte, maxLen int) error {
	if len(b) < rndvSize {
		return fmt.Errorf("bx: rendezvous request of %d bytes", len(b))
	}
	r.Len = binary.LittleEndian.Uint32(b[0:])
	if r.Len == 0 || int(r.Len) > maxLen {
		return fmt.Errorf("bx: rendezvous of %d bytes outside 1..%d", r.Len, maxLen)
	}
	if binary.LittleEndian.Uint32(b[4:]) != 0 {
		return errors.New("bx: rendezvous request with reserved bits set")
	}
	return nil
}

// Split messages. A payload above EagerSize and at most Config.SplitSize
// goes as several eager messages on its lane, in consecutive sequence
// numbers, instead of by rendezvous: no round trip before the data moves,
// at the price of a copy into place at the receiver (eRPC sends a large
// message so, as packets into the receiver's buffers). The first part
// (typSplit) carries the payload's size (an rndv) ahead of its share of the
// payload, every later one (typPart) carries the next share: each fills a
// receive buffer, EagerSize bytes after the header. Every part has the
// message's stream, call ID and flags; none goes compact. The receiver
// takes a buffer of the payload's size at the first part, copies each part
// in and returns its receive buffer at once, and delivers the message
// with the last. Each part is a message of the lane for sequence,
// acknowledgement, credits and resending, so a QP that fails mid-message
// resends from the first part the receiver lacks, into the same buffer. A
// part out of place (a typPart with no split message in progress, any
// other message in the middle of one, a part of another stream, call or
// flags, or one past the size) is a protocol error.

// splitHead is the bytes ahead of the payload in a part of type t.
func splitHead(t uint8) int {
	if t == typSplit {
		return rndvSize
	}
	return 0
}

// cts answers the RTS with lane sequence Ref: write its Len bytes at Addr
// through the window RKey, then invalidate it with the FIN.
type cts struct {
	Ref  uint64
	Addr uint64
	RKey uint32
	Len  uint32
}

const ctsSize = 24

func (c *cts) encode(b []byte) {
	binary.LittleEndian.PutUint64(b[0:], c.Ref)
	binary.LittleEndian.PutUint64(b[8:], c.Addr)
	binary.LittleEndian.PutUint32(b[16:], c.RKey)
	binary.LittleEndian.PutUint32(b[20:], c.Len)
}

// setCTSRKey rewrites the rkey of an encoded CTS (a resend names the
// window recovery bound anew).
func setCTSRKey(b []byte, rkey uint32) { binary.LittleEndian.PutUint32(b[16:], rkey) }

func (c *cts) decode(b []byte, maxLen int) error {
	if len(b) < ctsSize {
		return fmt.Errorf("bx: clear-to-send of %d bytes", len(b))
	}
	c.Ref = binary.LittleEndian.Uint64(b[0:])
	c.Addr = binary.LittleEndian.Uint64(b[8:])
	c.RKey = binary.LittleEndian.Uint32(b[16:])
	c.Len = binary.LittleEndian.Uint32(b[20:])
	if c.Ref == 0 {
		return errors.New("bx: clear-to-send for sequence 0")
	}
	if c.Len == 0 || int(c.Len) > maxLen {
		return fmt.Errorf("bx: clear-to-send of %d bytes outside 1..%d", c.Len, maxLen)
	}
	if c.Addr+uint64(c.Len) < c.Addr {
		return fmt.Errorf("bx: clear-to-send address %#x + %d wraps", c.Addr, c.Len)
	}
	return nil
}

// fin says the payload of the RTS with lane sequence Ref is in place.
type fin struct {
	Ref uint64
}

const finSize = 8

func (f *fin) encode(b []byte) { binary.LittleEndian.PutUint64(b, f.Ref) }

func (f *fin) decode(b []byte) error {
	if len(b) < finSize {
		return fmt.Errorf("bx: rendezvous FIN of %d bytes", len(b))
	}
	f.Ref = binary.LittleEndian.Uint64(b)
	if f.Ref == 0 {
		return errors.New("bx: rendezvous FIN for sequence 0")
	}
	return nil
}
