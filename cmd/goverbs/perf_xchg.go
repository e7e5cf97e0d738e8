package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/goverbs/goverbs/uverbs"
)

// perftest 4.5's out-of-band TCP exchange (src/perftest_communication.c,
// the default mode without rdma_cm), which goverbs perf speaks for its
// perftest tests so that either side may be perftest's ib_TEST.
//
// Every exchange is symmetric and fixed-size: the client writes its part,
// then reads the server's; the server reads first, then writes
// (ctx_xchg_data). After the TCP connection:
//
//	versions   16 bytes, a NUL-padded version string (exchange_versions;
//	           skipped with --dont_xchg_versions, as are the next two)
//	sys data   4 bytes cycle buffer (page size), 4 bytes cache line size,
//	           big-endian ints (check_sys_data; the larger of each wins)
//	MTU        2 bytes, the ibv_mtu enum in decimal and a NUL (check_mtu;
//	           the smaller of the two wins)
//
// Then handshakes (ctx_hand_shake): each side's "keys" for one QP, a
// 108-byte NUL-terminated text KEY_PRINT_FMT_GID
//
//	lid:out_reads:qpn:psn:rkey:vaddr:gid[0]:...:gid[15]:srqn:
//
// in hex (59 bytes without the GID, KEY_PRINT_FMT, when the GID index is
// unset on an IB port). Every barrier between phases is a handshake too,
// and each test has its own sequence of them (see perftestSeq). The end
// (ctx_close_connection) is a handshake and a "done" NUL-terminated,
// which nobody reads. A passive bandwidth server gets the client's
// results (xchg_bw_reports): size and iterations as big-endian 64-bit
// ints, BW peak, BW average and message rate as big-endian doubles, one
// exchange each.

// perftestVersion is the version we announce: perftest 4.5-0.17's
// (configure.ac: 6.06). perftest refuses peers older than 5.70.
const (
	perftestVersion    = "6.06"
	perftestMinVersion = 5.70
	perftestKeysGID    = 108 // KEY_MSG_SIZE_GID
	perftestKeysNoGID  = 59  // KEY_MSG_SIZE
	perftestCacheLine  = 64  // DEF_CACHE_LINE_SIZE
)

// perfStall is how long a latency loop waits without any progress before
// it decides that the peer is not running the same test (another size or
// iteration count) and fails rather than spins for ever. One step of the
// exchange waits as long for the peer (see ptConn.bound).
const perfStall = 10 * time.Second

// errPtStall and errPtClosed are what a link returns when the peer said
// nothing within the bound, or went away.
var (
	errPtStall  = errors.New("nothing from the peer")
	errPtClosed = errors.New("the peer closed the connection")
)

// ptLink carries perftest's exchange: a TCP connection (ptTCP), or with -R
// SENDs on an RC QP connected by rdma_cm (ptRDMA, perf_cm.go). Each call
// gives up after bound with errPtStall.
type ptLink interface {
	write(b []byte, bound time.Duration) error
	read(b []byte, bound time.Duration) error
	Close() error
}

// ptTCP is the exchange over TCP, perftest's default.
type ptTCP struct{ c net.Conn }

func (t *ptTCP) Close() error { return t.c.Close() }

func (t *ptTCP) write(b []byte, bound time.Duration) error {
	t.c.SetWriteDeadline(time.Now().Add(bound))
	_, err := t.c.Write(b)
	return tcpErr(err)
}

func (t *ptTCP) read(b []byte, bound time.Duration) error {
	t.c.SetReadDeadline(time.Now().Add(bound))
	_, err := io.ReadFull(t.c, b)
	return tcpErr(err)
}

func tcpErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return errPtStall
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
		return errPtClosed
	}
	return err
}

type ptConn struct {
	l      ptLink
	client bool
	gid    bool // text keys carry the GID (TCP)
	rdma   bool // -R: keys are perftest's struct pingpong_dest, binary
	gidx   int  // our GID index, in the binary keys

	// bound is how long one step waits for the peer: perfStall while both
	// sides go in step, longer around a step that waits for the peer's
	// measurement (perfRun.measureBound). 0 is perfStall.
	bound time.Duration
}

func (p *ptConn) Close() error { return p.l.Close() }

// xchg sends mine and returns the peer's n bytes, in perftest's order: the
// client writes first, the server reads first.
func (p *ptConn) xchg(what string, mine []byte, n int) ([]byte, error) {
	rem := make([]byte, n)
	bound := p.bound
	if bound <= 0 {
		bound = perfStall
	}
	fail := func(err error) error {
		switch {
		case errors.Is(err, errPtStall):
			return fmt.Errorf("exchange with the peer (%s): nothing from the peer for %v (is it goverbs perf or perftest's ib_TEST, running the same test, with -R on both sides or neither?)", what, bound)
		case errors.Is(err, errPtClosed):
			return fmt.Errorf("exchange with the peer (%s): the peer closed the connection (did it fail, or does it run another test?)", what)
		}
		return fmt.Errorf("exchange with the peer (%s): %v", what, err)
	}
	if p.client {
		if err := p.l.write(mine, bound); err != nil {
			return nil, fail(err)
		}
		if err := p.l.read(rem, bound); err != nil {
			return nil, fail(err)
		}
		return rem, nil
	}
	if err := p.l.read(rem, bound); err != nil {
		return nil, fail(err)
	}
	if err := p.l.write(mine, bound); err != nil {
		return nil, fail(err)
	}
	return rem, nil
}

// cstring is b up to its first NUL.
func cstring(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// atof is C's atof on the leading number of s (0 if none).
func atof(s string) float64 {
	s = strings.TrimSpace(s)
	end := 0
	for end < len(s) && (s[end] >= '0' && s[end] <= '9' || s[end] == '.') {
		end++
	}
	v, _ := strconv.ParseFloat(s[:end], 64)
	return v
}

// versions is exchange_versions and check_version_compatibility.
func (p *ptConn) versions() (string, error) {
	mine := make([]byte, 16)
	copy(mine, perftestVersion)
	rem, err := p.xchg("versions", mine, 16)
	if err != nil {
		return "", err
	}
	v := cstring(rem)
	if atof(v) < perftestMinVersion {
		return v, fmt.Errorf("the peer's version %q is older than %.2f: not compatible (perftest's check_version_compatibility)", v, perftestMinVersion)
	}
	return v, nil
}

// sysData is check_sys_data: it returns the peer's cycle buffer and cache
// line size.
func (p *ptConn) sysData(cycle int) (remCycle, remLine int, err error) {
	b := make([]byte, 4)
	binary.BigEndian.PutUint32(b, uint32(cycle))
	rem, err := p.xchg("page size", b, 4)
	if err != nil {
		return 0, 0, err
	}
	remCycle = int(int32(binary.BigEndian.Uint32(rem)))
	binary.BigEndian.PutUint32(b, perftestCacheLine)
	if rem, err = p.xchg("cache line size", b, 4); err != nil {
		return 0, 0, err
	}
	return remCycle, int(int32(binary.BigEndian.Uint32(rem))), nil
}

// mtu is check_mtu's exchange: it returns the peer's ibv_mtu enum (0 if it
// sent none that is valid).
func (p *ptConn) mtu(mine int) (int, error) {
	b := []byte(strconv.Itoa(mine) + "\x00")
	rem, err := p.xchg("MTU", b[:2], 2)
	if err != nil {
		return 0, err
	}
	v, err := strconv.Atoi(cstring(rem))
	if err != nil || v < 1 || v > 5 {
		return 0, nil
	}
	return v, nil
}

// formatKeys is ethernet_write_keys' message.
func formatKeys(a perfQPInfo, outReads int, gid bool) []byte {
	var s string
	if gid {
		g := a.GID.To16()
		if g == nil {
			g = make(net.IP, 16)
		}
		s = fmt.Sprintf("%04x:%04x:%06x:%06x:%08x:%016x:", a.LID, outReads, a.QPN, a.PSN, a.RKey, a.Addr)
		for _, x := range g {
			s += fmt.Sprintf("%02x:", x)
		}
		s += fmt.Sprintf("%08x:", 0)
	} else {
		s = fmt.Sprintf("%04x:%04x:%06x:%06x:%08x:%016x:%08x", a.LID, outReads, a.QPN, a.PSN, a.RKey, a.Addr, 0)
	}
	n := perftestKeysNoGID
	if gid {
		n = perftestKeysGID
	}
	b := make([]byte, n)
	copy(b[:n-1], s)
	return b
}

// parseKeys is ethernet_read_keys.
func parseKeys(b []byte, gid bool) (perfQPInfo, error) {
	s := cstring(b)
	f := strings.Split(s, ":")
	want := 7
	if gid {
		want = 24 // 6 fields, 16 GID bytes, srqn, and the empty tail
	}
	var a perfQPInfo
	bad := func() (perfQPInfo, error) {
		return perfQPInfo{}, fmt.Errorf("couldn't parse the peer's address %q (is it perftest or goverbs perf, and does it use a GID?)", s)
	}
	if len(f) != want {
		return bad()
	}
	var v [6]uint64
	for i, bits := range [6]int{16, 16, 24, 24, 32, 64} { // perftest's fields
		x, err := strconv.ParseUint(f[i], 16, bits)
		if err != nil {
			if errors.Is(err, strconv.ErrRange) {
				name := [6]string{"LID", "outstanding reads", "QPN", "PSN", "rkey", "address"}[i]
				return perfQPInfo{}, fmt.Errorf("the peer's %s %s in %q is wider than %d bits", name, f[i], s, bits)
			}
			return bad()
		}
		v[i] = x
	}
	a.LID, a.QPN, a.PSN, a.RKey, a.Addr = uint16(v[0]), uint32(v[2]), uint32(v[3]), uint32(v[4]), v[5]
	if gid {
		a.GID = make(net.IP, 16)
		for i := 0; i < 16; i++ {
			x, err := strconv.ParseUint(f[6+i], 16, 8)
			if err != nil {
				return bad()
			}
			a.GID[i] = byte(x)
		}
	}
	return a, nil
}

// handshake is ctx_hand_shake: our keys for one QP for the peer's.
func (p *ptConn) handshake(my perfQPInfo, outReads int) (perfQPInfo, error) {
	if p.rdma {
		rem, err := p.xchg("handshake", formatKeysCM(my, outReads, p.gidx), perftestKeysCM)
		if err != nil {
			return perfQPInfo{}, err
		}
		return parseKeysCM(rem), nil
	}
	n := perftestKeysNoGID
	if p.gid {
		n = perftestKeysGID
	}
	rem, err := p.xchg("handshake", formatKeys(my, outReads, p.gid), n)
	if err != nil {
		return perfQPInfo{}, err
	}
	return parseKeys(rem, p.gid)
}

// closeConn is ctx_close_connection: a last handshake, then (over TCP)
// "done". We also take the peer's "done" if it comes soon, so that closing
// with unread data does not reset the connection under it.
func (p *ptConn) closeConn(my perfQPInfo, outReads int) error {
	if _, err := p.handshake(my, outReads); err != nil {
		return err
	}
	t, ok := p.l.(*ptTCP)
	if !ok {
		return nil // rdma_cm: the handshake is all
	}
	if err := t.write([]byte("done\x00"), time.Second); err != nil {
		return fmt.Errorf("exchange with the peer (done): %v", err)
	}
	t.read(make([]byte, 5), 2*time.Second)
	return nil
}

// bwReport is xchg_bw_reports: ours (zero on a passive server) for the
// peer's.
func (p *ptConn) bwReport(mine perfBWResult) (perfBWResult, error) {
	var out perfBWResult
	u := func(what string, x uint64) (uint64, error) {
		b := make([]byte, 8)
		binary.BigEndian.PutUint64(b, x)
		rem, err := p.xchg(what, b, 8)
		if err != nil {
			return 0, err
		}
		return binary.BigEndian.Uint64(rem), nil
	}
	size, err := u("report size", uint64(mine.Bytes))
	if err != nil {
		return out, err
	}
	iters, err := u("report iterations", uint64(mine.Iterations))
	if err != nil {
		return out, err
	}
	if size > math.MaxInt64 || iters > math.MaxInt64 {
		return out, fmt.Errorf("the peer's report of %d iterations of %d bytes is out of range", iters, size)
	}
	var d [3]float64
	for i, x := range []float64{mine.BWPeak, mine.BWAvg, mine.MsgRate} {
		r, err := u("report", math.Float64bits(x))
		if err != nil {
			return out, err
		}
		d[i] = math.Float64frombits(r)
		if math.IsNaN(d[i]) || math.IsInf(d[i], 0) || d[i] < 0 {
			return out, fmt.Errorf("the peer's report has %v for %s", d[i], [3]string{"BW peak", "BW average", "message rate"}[i])
		}
	}
	return perfBWResult{Bytes: int(size), Iterations: int(iters), BWPeak: d[0], BWAvg: d[1], MsgRate: d[2]}, nil
}

// perftestPrelude is what follows the TCP connection: versions, sys data
// and MTU (unless --dont_xchg_versions); it settles r.mtu.
func (r *perfRun) perftestPrelude(p *ptConn, stderr io.Writer) error {
	o := r.o
	if o.dontXchg {
		return nil
	}
	if _, err := p.versions(); err != nil {
		return err
	}
	remCycle, _, err := p.sysData(os.Getpagesize())
	if err != nil {
		return err
	}
	// The peer's RDMA to us steps through its cycle buffer (the larger of
	// the two page sizes) from the address we give it.
	if len(r.qps) > 0 && remCycle > r.qps[0].half {
		return fmt.Errorf("the peer's cycle buffer (%d bytes) is larger than our buffer (%d bytes)", remCycle, r.qps[0].half)
	}
	rm, err := p.mtu(int(r.mtu))
	if err != nil {
		return err
	}
	if rm != 0 && rm < int(r.mtu) {
		r.mtu = uverbs.MTU(rm)
	}
	if o.conn == "UD" && o.sizes[len(o.sizes)-1] > r.mtu.Bytes() {
		if o.all {
			s := o.sizes[:0]
			for _, n := range o.sizes {
				if n <= r.mtu.Bytes() {
					s = append(s, n)
				}
			}
			o.sizes = s
		} else {
			return fmt.Errorf("-s %d: a UD message must fit the path MTU, which is %d with the peer", o.size, r.mtu.Bytes())
		}
	}
	return nil
}
