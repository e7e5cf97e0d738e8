package main

import (
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fuzzLink is a ptLink whose peer says what the fuzzer gives it, then
// closes the connection.
type fuzzLink struct{ in []byte }

func (l *fuzzLink) write(b []byte, bound time.Duration) error { return nil }
func (l *fuzzLink) Close() error                              { return nil }

func (l *fuzzLink) read(b []byte, bound time.Duration) error {
	if len(l.in) < len(b) {
		l.in = nil
		return errPtClosed
	}
	copy(b, l.in)
	l.in = l.in[len(b):]
	return nil
}

// allocated is how many bytes f allocates: the less of two runs, as the
// fuzzing worker's own goroutines allocate now and then too.
func allocated(f func()) uint64 {
	least := uint64(math.MaxUint64)
	for range 2 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	return least
}

// FuzzParseKeys: a perftest peer's keys text (ethernet_read_keys) comes
// from whoever connects to the TCP port. parseKeys must never panic, must
// reject a field wider than perftest's (16-bit LID, 24-bit QPN and PSN)
// rather than cut it, naming the field, and what it accepts must survive
// our own formatKeys.
func FuzzParseKeys(f *testing.F) {
	for _, a := range []perfQPInfo{
		{LID: 1, QPN: 0x11, PSN: 0xabcdef, RKey: 0x1234, Addr: 0x7f0000001000, GID: net.ParseIP("::ffff:10.99.0.1")},
		{LID: 0xffff, QPN: 0xffffff, PSN: 0xffffff, RKey: 0xffffffff, Addr: math.MaxUint64, GID: net.ParseIP("fe80::7")},
		{},
	} {
		f.Add(formatKeys(a, 16, true), true)
		f.Add(formatKeys(a, 1, false), false)
	}
	f.Add([]byte("0001:0010:1000000:000000:00000000:0000000000000000:00000000"), false) // 25-bit QPN
	f.Add([]byte("10000:0010:000001:000000:00000000:0000000000000000:00000000"), false) // 17-bit LID
	f.Add([]byte("done\x00"), true)
	f.Add([]byte(strings.Repeat(":", 23)), true)
	f.Fuzz(func(t *testing.T, b []byte, gid bool) {
		// No allocation check here (ReadMemStats stops the world: 20000
		// inputs took a minute): the keys are a fixed-size read, with no
		// length the peer claims.
		a, err := parseKeys(b, gid)
		if err != nil {
			if !strings.Contains(err.Error(), "peer") {
				t.Fatalf("error without context: %v", err)
			}
			return
		}
		if a.QPN >= 1<<24 || a.PSN >= 1<<24 {
			t.Fatalf("accepted QPN %#x PSN %#x from %q", a.QPN, a.PSN, b)
		}
		if gid != (a.GID != nil) {
			t.Fatalf("gid %v: parsed GID %v", gid, a.GID)
		}
		enc := formatKeys(a, 16, gid)
		again, err := parseKeys(enc, gid)
		if err != nil {
			t.Fatalf("our keys %q for %+v do not parse: %v", enc, a, err)
		}
		if again.LID != a.LID || again.QPN != a.QPN || again.PSN != a.PSN || again.RKey != a.RKey || again.Addr != a.Addr || !again.GID.Equal(a.GID) {
			t.Fatalf("round trip: %+v became %+v", a, again)
		}
	})
}

// FuzzParseKeysCM: with -R the keys are perftest's binary struct
// pingpong_dest (rdma_read_keys), 56 bytes from the peer's SEND.
func FuzzParseKeysCM(f *testing.F) {
	f.Add(formatKeysCM(perfQPInfo{LID: 1, QPN: 0x11, PSN: 0xabcdef, RKey: 0x1234, Addr: 0x7f0000001000, GID: net.ParseIP("fe80::7")}, 16, 3))
	f.Add(formatKeysCM(perfQPInfo{}, 0, -1))
	f.Fuzz(func(t *testing.T, b []byte) {
		msg := make([]byte, perftestKeysCM) // the exchange reads exactly this many
		copy(msg, b)
		a := parseKeysCM(msg)
		if len(a.GID) != 16 {
			t.Fatalf("GID of %d bytes", len(a.GID))
		}
		again := parseKeysCM(formatKeysCM(a, 16, 0))
		if again.LID != a.LID || again.QPN != a.QPN || again.PSN != a.PSN || again.RKey != a.RKey || again.Addr != a.Addr || !again.GID.Equal(a.GID) {
			t.Fatalf("round trip: %+v became %+v", a, again)
		}
	})
}

// FuzzPerftestExchange: the rest of what a perftest peer sends over TCP,
// in the order of a passive bandwidth server's run: versions, sys data,
// MTU, the keys, and the client's report. Nothing may panic, the MTU is
// an ibv_mtu or 0, and an accepted report is one we can print and encode.
func FuzzPerftestExchange(f *testing.F) {
	var seed []byte
	seed = append(seed, []byte(perftestVersion+strings.Repeat("\x00", 16-len(perftestVersion)))...)
	seed = binary.BigEndian.AppendUint32(seed, 4096)
	seed = binary.BigEndian.AppendUint32(seed, perftestCacheLine)
	seed = append(seed, '5', 0)
	seed = append(seed, formatKeys(perfQPInfo{LID: 1, QPN: 0x11, PSN: 0x22, RKey: 0x33, Addr: 0x1000, GID: net.ParseIP("fe80::7")}, 16, true)...)
	for _, x := range []uint64{65536, 5000, math.Float64bits(11000.5), math.Float64bits(10990.25), math.Float64bits(0.17)} {
		seed = binary.BigEndian.AppendUint64(seed, x)
	}
	f.Add(seed)
	bad := bytes.Clone(seed)
	binary.BigEndian.PutUint64(bad[len(bad)-40:], math.MaxUint64)
	binary.BigEndian.PutUint64(bad[len(bad)-24:], math.Float64bits(math.NaN()))
	f.Add(bad)
	f.Add([]byte("5.69\x00"))
	f.Fuzz(func(t *testing.T, in []byte) {
		var r perfBWResult
		var ok bool
		if n := allocated(func() { r, ok = exchangeAll(t, &ptConn{l: &fuzzLink{in: in}, gid: true}) }); n > 64*uint64(len(in))+16<<10 {
			t.Fatalf("the exchange of %d bytes allocated %d", len(in), n)
		}
		if ok {
			checkReport(t, r)
		}
	})
}

func exchangeAll(t *testing.T, p *ptConn) (perfBWResult, bool) {
	if _, err := p.versions(); err != nil {
		return perfBWResult{}, false
	}
	if _, _, err := p.sysData(4096); err != nil {
		return perfBWResult{}, false
	}
	m, err := p.mtu(5)
	if err != nil {
		return perfBWResult{}, false
	}
	if m < 0 || m > 5 {
		t.Fatalf("MTU %d", m)
	}
	if _, err := p.handshake(perfQPInfo{}, 16); err != nil {
		return perfBWResult{}, false
	}
	r, err := p.bwReport(perfBWResult{})
	if err != nil {
		if !strings.Contains(err.Error(), "report") {
			t.Fatalf("error without context: %v", err)
		}
		return perfBWResult{}, false
	}
	return r, true
}

func checkReport(t *testing.T, r perfBWResult) {
	if r.Bytes < 0 || r.Iterations < 0 {
		t.Fatalf("accepted a report of %d bytes, %d iterations", r.Bytes, r.Iterations)
	}
	rep := &perfReport{bw: true, Bandwidth: []perfBWResult{r}}
	rep.printLast(io.Discard)
	if err := rep.writeJSON(io.Discard); err != nil {
		t.Fatalf("accepted report %+v does not encode: %v", r, err)
	}
}
