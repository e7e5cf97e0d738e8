package main

import (
	"strings"
	"testing"
)

// FuzzDecodeDest: the 52-byte address message of the rdma-core
// ping-pongs comes from whoever connects to the TCP port. decodeDest must
// never panic, must keep LID, QPN and PSN within their 16, 24 and 24 bits,
// and what it accepts must survive our own encoding (which the C tools
// read back with the same sscanf).
func FuzzDecodeDest(f *testing.F) {
	for _, d := range []dest{
		{LID: 0, QPN: 0x11, PSN: 0xabcdef, GID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 99, 15: 1}},
		{LID: 0xffff, QPN: 0xffffff, PSN: 0, GID: [16]byte{0: 0xfe, 1: 0x80, 15: 7}},
	} {
		f.Add(d.encode())
	}
	f.Add([]byte("0000:000011:abcdef:00000000000000000000ffff0a630001\x00"))
	f.Add([]byte("0000:000011:abcdef:00000000000000000000FFFF0A630001\x00"))
	f.Add([]byte("1:2:3:00000000000000000000000000000000"))
	f.Add([]byte("0000:1000000:000000:00000000000000000000000000000000\x00")) // 25-bit QPN
	f.Add([]byte(":::"))
	f.Add([]byte("done\x00"))
	f.Fuzz(func(t *testing.T, msg []byte) {
		d, err := decodeDest(msg)
		if err != nil {
			return
		}
		if d.QPN >= 1<<24 || d.PSN >= 1<<24 {
			t.Fatalf("accepted QPN %#x PSN %#x", d.QPN, d.PSN)
		}
		enc := d.encode()
		if len(enc) != wireMsgLen {
			t.Fatalf("encoded %d bytes", len(enc))
		}
		again, err := decodeDest(enc)
		if err != nil {
			t.Fatalf("our encoding of %+v does not decode: %v", d, err)
		}
		if again != d {
			t.Fatalf("round trip: %+v became %+v", d, again)
		}
		_ = ntop(d.GID)
		_ = d.global()
	})
}

// FuzzDecodeGID: the GID part of the message, 32 hex digits.
func FuzzDecodeGID(f *testing.F) {
	f.Add("00000000000000000000ffff0a630001")
	f.Add("fe800000000000000000000000000007")
	f.Add("0000000000000000000000000000000g")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		g, err := decodeGID(s)
		if err != nil {
			return
		}
		if e := encodeGID(g); e != strings.ToLower(s) {
			t.Fatalf("%q decoded and encoded as %q", s, e)
		}
		if n := ntop(g); n == "" {
			t.Fatalf("ntop(%x) is empty", g)
		}
	})
}
