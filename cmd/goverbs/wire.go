package main

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// The TCP exchange of ibv_rc_pingpong (rdma-core libibverbs/examples
// rc_pingpong.c and pingpong.c):
//
//	client -> server  52 bytes: "LLLL:QQQQQQ:PPPPPP:GGGG...G" and a NUL
//	server            connects its QP (RTR, RTS)
//	server -> client  52 bytes, its own address
//	client -> server  "done" and a NUL (5 bytes); the client closes
//	client            connects its QP and posts the first send
//
// Both sides read each message with a single read(2) and insist on the
// exact length, so each message must go out in a single write.

// wireMsgLen is sizeof "0000:000000:000000:00000000000000000000000000000000":
// 51 characters and the terminating NUL, which travels too.
const wireMsgLen = 52

// wireDone is sizeof "done": the NUL travels too.
var wireDone = []byte("done\x00")

// dest is one side's address: pingpong_dest.
type dest struct {
	LID uint16
	QPN uint32
	PSN uint32
	GID [16]byte
}

// encodeGID is gid_to_wire_gid: four groups of 8 hex digits, group i being
// htonl of the 32-bit word at raw[4i] read in host order. On a
// little-endian host (the only kind rdma-core's tools interoperate with
// on the wire without mishap: a big-endian peer would write the words
// byte-swapped) that is simply the 16 GID bytes in order, in lower-case hex.
func encodeGID(g [16]byte) string { return hex.EncodeToString(g[:]) }

// decodeGID is wire_gid_to_gid: sscanf("%x") on each group of 8, stored
// with ntohl. sscanf stops at the first non-hex character of a group and
// leaves the word unchanged (zero here) if there is none; we are stricter
// and require 32 hex digits.
func decodeGID(s string) ([16]byte, error) {
	var g [16]byte
	if len(s) != 32 {
		return g, fmt.Errorf("wire GID %q: want 32 hex digits, have %d characters", s, len(s))
	}
	if _, err := hex.Decode(g[:], []byte(s)); err != nil {
		return g, fmt.Errorf("wire GID %q: %v", s, err)
	}
	return g, nil
}

// encode formats d as sprintf("%04x:%06x:%06x:%s") into the 52-byte
// message, NUL-padded as the C buffer is.
func (d dest) encode() []byte {
	s := fmt.Sprintf("%04x:%06x:%06x:%s", d.LID, d.QPN, d.PSN, encodeGID(d.GID))
	msg := make([]byte, wireMsgLen)
	copy(msg, s) // a LID, QPN or PSN too wide would be cut, as in C (where it overflows)
	return msg
}

// decodeDest parses a 52-byte message as sscanf("%x:%x:%x:%s") does.
func decodeDest(msg []byte) (dest, error) {
	var d dest
	s := string(msg)
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	f := strings.SplitN(s, ":", 4)
	if len(f) != 4 {
		return d, fmt.Errorf("bad address message %q: want LID:QPN:PSN:GID", s)
	}
	var v [3]uint64
	for i, bits := range []int{16, 24, 24} {
		x, err := strconv.ParseUint(f[i], 16, 32)
		if err != nil || x >= 1<<bits {
			return d, fmt.Errorf("bad address message %q: field %d (%q) is not a %d-bit hex number", s, i+1, f[i], bits)
		}
		v[i] = x
	}
	g, err := decodeGID(f[3])
	if err != nil {
		return d, fmt.Errorf("bad address message %q: %v", s, err)
	}
	d.LID, d.QPN, d.PSN, d.GID = uint16(v[0]), uint32(v[1]), uint32(v[2]), g
	return d, nil
}

// global reports whether a GRH is needed to reach d: rc_pingpong tests
// dest->gid.global.interface_id, the low 8 bytes of the GID.
func (d dest) global() bool {
	for _, b := range d.GID[8:] {
		if b != 0 {
			return true
		}
	}
	return false
}

// ntop formats a GID as glibc's inet_ntop(AF_INET6) does, which is what
// ibv_rc_pingpong prints: RFC 5952 compression, IPv4-mapped (::ffff:a.b.c.d)
// and, unlike Go, the deprecated IPv4-compatible form (::a.b.c.d when the
// first 96 bits are zero and the address is neither :: nor ::1 style, that
// is when the seventh 16-bit word is not zero).
func ntop(g [16]byte) string {
	var zero [12]byte
	if [12]byte(g[:12]) == zero && (g[12] != 0 || g[13] != 0) {
		return "::" + net.IPv4(g[12], g[13], g[14], g[15]).String()
	}
	return netip.AddrFrom16(g).String()
}

// writeMsg sends msg with one write, as the peer reads with one read.
func writeMsg(c net.Conn, msg []byte) error {
	n, err := c.Write(msg)
	if err == nil && n != len(msg) {
		err = io.ErrShortWrite
	}
	return err
}

// readMsg reads exactly n bytes. The C tools demand a whole message per
// read(2); we accept it in pieces, which can only be more forgiving.
func readMsg(c net.Conn, n int) ([]byte, error) {
	buf := make([]byte, n)
	got, err := io.ReadFull(c, buf)
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%d/%d bytes: peer closed the connection", got, n)
		}
		return nil, err
	}
	return buf, nil
}
