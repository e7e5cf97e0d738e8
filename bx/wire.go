package bx

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// HeaderSize is the size of the header in front of every data-plane
// message.
const HeaderSize = 48

const wireVersion = 1

// Message types.
const (
	typData   = 1 // payload follows the header
	typRndv   = 2 // a rendezvous descriptor follows: the receiver READs the payload
	typCredit = 3 // explicit credit and acknowledgement update, no payload
)

// Header flags.
const (
	flagRequest  = 1 << 0 // RPC request; CallID names the call
	flagResponse = 1 << 1 // RPC response
	flagError    = 1 << 2 // RPC response carrying a handler error string
	flagOpen     = 1 << 3 // first message of a net.Conn stream
	flagClose    = 1 << 4 // the sender closed its side of a net.Conn stream
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

var errShortHeader = errors.New("bx: message shorter than its header")

// decode parses a header from b, which holds n received bytes. It checks
// everything a peer could get wrong: version, type, and that the payload
// length matches what arrived.
func (h *header) decode(b []byte) error {
	if len(b) < HeaderSize {
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
	case typData:
		if int(h.Length) != len(b)-HeaderSize {
			return fmt.Errorf("bx: data message says %d payload bytes, %d arrived", h.Length, len(b)-HeaderSize)
		}
	case typRndv:
		if len(b)-HeaderSize != rndvSize || h.Length != rndvSize {
			return fmt.Errorf("bx: rendezvous descriptor of %d bytes, want %d", len(b)-HeaderSize, rndvSize)
		}
	case typCredit:
		if len(b) != HeaderSize || h.Length != 0 {
			return fmt.Errorf("bx: credit update with %d payload bytes", len(b)-HeaderSize)
		}
	default:
		return fmt.Errorf("bx: unknown message type %d", h.Type)
	}
	if h.Flags&^(flagRequest|flagResponse|flagError|flagOpen|flagClose) != 0 {
		return fmt.Errorf("bx: unknown flags %#x", h.Flags)
	}
	if h.Flags&flagRequest != 0 && h.Flags&flagResponse != 0 {
		return errors.New("bx: message is both request and response")
	}
	return nil
}

// rndv is a rendezvous descriptor: where the receiver reads the payload.
type rndv struct {
	Addr uint64
	RKey uint32
	Len  uint32
}

const rndvSize = 16

func (r *rndv) encode(b []byte) {
	binary.LittleEndian.PutUint64(b[0:], r.Addr)
	binary.LittleEndian.PutUint32(b[8:], r.RKey)
	binary.LittleEndian.PutUint32(b[12:], r.Len)
}

func (r *rndv) decode(b []byte, maxLen int) error {
	if len(b) < rndvSize {
		return fmt.Errorf("bx: rendezvous descriptor of %d bytes", len(b))
	}
	r.Addr = binary.LittleEndian.Uint64(b[0:])
	r.RKey = binary.LittleEndian.Uint32(b[8:])
	r.Len = binary.LittleEndian.Uint32(b[12:])
	if r.Len == 0 || int(r.Len) > maxLen {
		return fmt.Errorf("bx: rendezvous of %d bytes outside 1..%d", r.Len, maxLen)
	}
	if r.Addr+uint64(r.Len) < r.Addr {
		return fmt.Errorf("bx: rendezvous address %#x + %d wraps", r.Addr, r.Len)
	}
	return nil
}
