package main

import (
	"bytes"
	"net"
	"testing"
)

// Messages captured from real ibv_rc_pingpong runs (rdma-core 44, rxe0 and
// rxe1 with -g 1 in the guest of scripts/vm), NUL included.
const (
	realClientMsg = "0000:000011:d34446:00000000000000000000ffff0a630001\x00"
	realServerMsg = "0000:000011:04c482:00000000000000000000ffff0a630002\x00"
)

func gid16(s string) [16]byte {
	return [16]byte(net.ParseIP(s).To16())
}

func TestDecodeRealMessages(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want dest
		ntop string
	}{
		{realClientMsg, dest{LID: 0, QPN: 0x11, PSN: 0xd34446, GID: gid16("::ffff:10.99.0.1")}, "::ffff:10.99.0.1"},
		{realServerMsg, dest{LID: 0, QPN: 0x11, PSN: 0x04c482, GID: gid16("::ffff:10.99.0.2")}, "::ffff:10.99.0.2"},
	} {
		if len(tc.msg) != wireMsgLen {
			t.Fatalf("test message is %d bytes, want %d", len(tc.msg), wireMsgLen)
		}
		d, err := decodeDest([]byte(tc.msg))
		if err != nil {
			t.Fatal(err)
		}
		if d != tc.want {
			t.Errorf("decode %q = %+v, want %+v", tc.msg, d, tc.want)
		}
		if got := ntop(d.GID); got != tc.ntop {
			t.Errorf("ntop = %q, want %q", got, tc.ntop)
		}
		if !d.global() {
			t.Errorf("%q: global() = false", tc.msg)
		}
		if enc := d.encode(); !bytes.Equal(enc, []byte(tc.msg)) {
			t.Errorf("encode(%+v) = %q, want %q", d, enc, tc.msg)
		}
	}
}

func TestEncodeGIDByteOrder(t *testing.T) {
	// gid_to_wire_gid on little-endian: htonl of each host-order word,
	// which is the bytes in memory order.
	var g [16]byte
	for i := range g {
		g[i] = byte(i*0x11 + 1)
	}
	if got, want := encodeGID(g), "0112233445566778899aabbccddeef00"; got != want {
		t.Errorf("encodeGID = %s, want %s", got, want)
	}
	back, err := decodeGID(encodeGID(g))
	if err != nil || back != g {
		t.Errorf("decodeGID round trip = %x, %v", back, err)
	}
	fe80 := gid16("fe80::24b8:e2ff:fee5:5e02")
	if got, want := encodeGID(fe80), "fe8000000000000024b8e2fffee55e02"; got != want {
		t.Errorf("encodeGID(fe80::...) = %s, want %s", got, want)
	}
}

func TestZeroGIDIsNotGlobal(t *testing.T) {
	d := dest{LID: 0x1a, QPN: 0x123456, PSN: 0xabcdef}
	msg := d.encode()
	if want := "001a:123456:abcdef:00000000000000000000000000000000\x00"; string(msg) != want {
		t.Fatalf("encode = %q, want %q", msg, want)
	}
	if d.global() {
		t.Error("zero GID: global() = true")
	}
	if got := ntop(d.GID); got != "::" {
		t.Errorf("ntop(zero) = %q, want ::", got)
	}
}

func TestDecodeBad(t *testing.T) {
	for _, s := range []string{
		"",
		"done\x00",
		"0000:000011:d34446\x00",
		"zzzz:000011:d34446:00000000000000000000ffff0a630001\x00",
		"0000:1000000:d34446:00000000000000000000ffff0a63000\x00",
		"0000:000011:d34446:00000000000000000000ffff0a63000g\x00",
		"0000:000011:d34446:0000\x00",
	} {
		if d, err := decodeDest([]byte(s)); err == nil {
			t.Errorf("decodeDest(%q) = %+v, want an error", s, d)
		}
	}
}

func TestNtopLikeGlibc(t *testing.T) {
	for in, want := range map[string]string{
		"::ffff:10.99.0.1":          "::ffff:10.99.0.1",
		"fe80::24b8:e2ff:fee5:5e02": "fe80::24b8:e2ff:fee5:5e02",
		"::1":                       "::1",
		"::10.1.2.3":                "::10.1.2.3", // glibc prints IPv4-compatible addresses so
		"2001:db8::1:0:0:1":         "2001:db8::1:0:0:1",
		"1:0:0:2:0:0:0:3":           "1:0:0:2::3",
	} {
		if got := ntop(gid16(in)); got != want {
			t.Errorf("ntop(%s) = %s, want %s", in, got, want)
		}
	}
}
