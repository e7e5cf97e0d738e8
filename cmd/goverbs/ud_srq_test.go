package main

import (
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/qp"
)

// Tests of ud-pingpong, srq-pingpong and the -e (events) mode of all three
// ping-pongs, against rdma-core's ibv_ud_pingpong, ibv_srq_pingpong and
// ibv_rc_pingpong in both directions, and goverbs against itself.

// ppPort hands out TCP ports for these tests (main_test.go uses 186xx and
// 18700, perf_test.go 188xx).
var ppPort = 19300

func takePort() int {
	p := ppPort
	ppPort++
	return p
}

func lookIbv(t *testing.T, name string) string {
	t.Helper()
	return lookTool(t, name, "ibverbs-utils")
}

// lookTool returns the path of rdma-core's tool name, or skips (fails
// under GOVERBS_RXE=required) when it is not installed: the Debian
// package pkg has it.
func lookTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if rxetest.Required() {
			t.Fatalf("GOVERBS_RXE=required but %s is not installed (apt-get install %s)", name, pkg)
		}
		t.Skipf("%s not installed", name)
	}
	return p
}

// ppSide is one process of a ping-pong pair.
type ppSide struct {
	who  string   // "goverbs" or "ibv"
	args []string // extra flags of this side (e.g. -e)
}

// runPPPair runs a server on srv and a client on cli: goverbs CMD or the
// rdma-core tool ibv, each with common and its own flags, and returns
// their results (client, server). Every goverbs process reports its loop's
// heap allocations (GOVERBS_PINGPONG_DEBUG=1).
func runPPPair(t *testing.T, cmd, ibv, srv, cli, host string, server, client ppSide, common ...string) (rc, rs result) {
	t.Helper()
	port := takePort()
	common = append([]string{"-p", strconv.Itoa(port)}, common...)
	start := func(s ppSide, dev string, extra ...string) (func() result, chan struct{}) {
		args := append(append(append([]string{"-d", dev}, common...), s.args...), extra...)
		done := make(chan struct{})
		var r result
		var once sync.Once
		go func() {
			defer close(done)
			if s.who == "ibv" {
				r = runCmd(t, 4*time.Minute, ibv, nil, args...)
			} else {
				r = runCmd(t, 4*time.Minute, goverbsBin, append([]string{pingpongDebugEnv + "=1"}, goverbsEnv...), append([]string{cmd}, args...)...)
			}
		}()
		return func() result { once.Do(func() { <-done }); return r }, done
	}
	srvRes, srvDone := start(server, srv)
	waitListen(t, port, srvDone)
	cliRes, _ := start(client, cli, host)
	return cliRes(), srvRes()
}

var allocsRE = regexp.MustCompile(`(?m)^goverbs \S+: loop: (\d+) heap allocations$`)
var eventsRE = regexp.MustCompile(`(?m)^goverbs \S+: -e: (\d+) CQ arms, (\d+) event wakeups, (\d+) sleeps$`)

// checkPP checks one side's result: exit 0, the summary lines for iters
// and size, numQP address lines of each kind, and for goverbs a loop that
// did not allocate (with -e: at most one allocation per arm, which
// cq.Notify makes, and a little one-time slack).
func checkPP(t *testing.T, who string, s ppSide, r result, iters, size, numQP int) {
	t.Helper()
	if r.code != 0 || r.err != nil {
		t.Errorf("%s: exit %d (%v)\nstdout:\n%s\nstderr:\n%s", who, r.code, r.err, r.stdout, r.stderr)
		return
	}
	us := parseIters(t, who, r.stdout, iters, size)
	for _, l := range []string{"  local address:  LID 0x", "  remote address: LID 0x"} {
		if n := strings.Count(r.stdout, l); n != numQP {
			t.Errorf("%s: %d lines %q, want %d", who, n, l, numQP)
		}
	}
	if s.who != "goverbs" {
		t.Logf("%s: %.2f usec/iter", who, us)
		return
	}
	m := allocsRE.FindStringSubmatch(r.stderr)
	if m == nil {
		t.Errorf("%s: no allocation report in stderr %q", who, r.stderr)
		return
	}
	allocs, _ := strconv.Atoi(m[1])
	events := false
	for _, a := range s.args {
		events = events || a == "-e"
	}
	e := eventsRE.FindStringSubmatch(r.stderr)
	switch {
	case events && e == nil:
		t.Errorf("%s: -e given but no events report in stderr %q", who, r.stderr)
	case !events && e != nil:
		t.Errorf("%s: events report without -e: %q", who, e[0])
	case events:
		arms, _ := strconv.Atoi(e[1])
		// cq.Notify allocates its request on every arm (cq/wait.go: req
		// escapes through ioctl.Cmd); the rest is one-time runtime state
		// (sudogs of the first select).
		if allocs > arms+4 {
			t.Errorf("%s: the -e loop made %d heap allocations for %d arms", who, allocs, arms)
		}
		t.Logf("%s: %.2f usec/iter, %s, %d allocations", who, us, e[0], allocs)
	default:
		// The count is process-wide (runtime.MemStats), so it also sees
		// the runtime's own one-time allocations: on a loaded machine a
		// busy-polling loop can make the scheduler start a new M, which
		// allocates (CI saw 1). A loop that allocated per iteration
		// would show at least iters; allow the one-time slack only.
		if allocs > pollAllocSlack {
			t.Errorf("%s: the polling loop made %d heap allocations in %d iterations, want at most %d (runtime one-time)", who, allocs, iters, pollAllocSlack)
		}
		t.Logf("%s: %.2f usec/iter", who, us)
	}
}

// pollAllocSlack is how many process-wide heap allocations a polling loop
// may show without allocating itself: runtime one-time state (a new M
// when the machine is loaded). The loops run 100-1000 iterations, so a
// per-iteration allocation is far above it.
const pollAllocSlack = 3

var ppPairs = []struct{ server, client string }{{"goverbs", "ibv"}, {"ibv", "goverbs"}, {"goverbs", "goverbs"}}

func TestUDPingpongInterop(t *testing.T) {
	cli, srv := rxetest.Pair(t)
	host, gidx := serverTarget(t, srv)
	ibv := lookIbv(t, "ibv_ud_pingpong")
	const iters = 200
	g := strconv.Itoa(gidx)
	for _, pair := range ppPairs {
		for _, size := range []int{64, 1024} {
			for _, events := range []bool{false, true} {
				name := fmt.Sprintf("%s-server/%s-client/s%d", pair.server, pair.client, size)
				var e []string
				if events {
					name += "/events"
					e = []string{"-e"}
				}
				t.Run(name, func(t *testing.T) {
					s, c := ppSide{pair.server, e}, ppSide{pair.client, e}
					rc, rs := runPPPair(t, "ud-pingpong", ibv, srv, cli, host, s, c,
						"-n", strconv.Itoa(iters), "-s", strconv.Itoa(size), "-g", g)
					checkPP(t, pair.client+" client", c, rc, iters, size, 1)
					checkPP(t, pair.server+" server", s, rs, iters, size, 1)
					// ud_pingpong's own quirk: ": GID" in the local address line.
					for _, r := range []result{rc, rs} {
						if !regexp.MustCompile(`(?m)^  local address:  LID 0x[0-9a-f]{4}, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}: GID ::ffff:`).MatchString(r.stdout) {
							t.Errorf("local address line not as ibv_ud_pingpong prints it: %q", r.stdout)
						}
					}
				})
			}
		}
	}
	// Mixed: one side sleeps on events, the other polls; no -g on the
	// goverbs side (it picks the RoCE v2 GID itself).
	t.Run("goverbs-server-events/ibv-client", func(t *testing.T) {
		s, c := ppSide{"goverbs", []string{"-e"}}, ppSide{"ibv", []string{"-g", g}}
		rc, rs := runPPPair(t, "ud-pingpong", ibv, srv, cli, host, s, c, "-n", "100", "-s", "300")
		checkPP(t, "ibv client", c, rc, 100, 300, 1)
		checkPP(t, "goverbs server", s, rs, 100, 300, 1)
		if !strings.Contains(rs.stderr, "using GID index "+g) {
			t.Errorf("goverbs server without -g: stderr %q, want it to name GID index %s", rs.stderr, g)
		}
	})
}

func TestSRQPingpongInterop(t *testing.T) {
	cli, srv := rxetest.Pair(t)
	host, gidx := serverTarget(t, srv)
	ibv := lookIbv(t, "ibv_srq_pingpong")
	g := strconv.Itoa(gidx)
	for _, pair := range ppPairs {
		for _, tc := range []struct {
			name         string
			iters, size  int
			numQP        int
			extra        []string
			eventsServer bool
			eventsClient bool
		}{
			// The defaults: 16 QPs, rx depth 500, 4096 bytes (4 packets at MTU 1024).
			{name: "defaults", iters: 300, size: 4096, numQP: 16},
			{name: "defaults/events", iters: 300, size: 4096, numQP: 16, eventsServer: true, eventsClient: true},
			// 3 QPs and only 4 receives in the SRQ: refilled when 3 remain.
			{name: "q3-r4", iters: 200, size: 100, numQP: 3, extra: []string{"-q", "3", "-r", "4"}},
			{name: "q3-r4/events", iters: 200, size: 100, numQP: 3, extra: []string{"-q", "3", "-r", "4"}, eventsServer: true, eventsClient: true},
			{name: "q1/server-events", iters: 100, size: 2000, numQP: 1, extra: []string{"-q", "1", "-m", "512"}, eventsServer: true},
		} {
			t.Run(pair.server+"-server/"+pair.client+"-client/"+tc.name, func(t *testing.T) {
				s, c := ppSide{who: pair.server}, ppSide{who: pair.client}
				if tc.eventsServer {
					s.args = []string{"-e"}
				}
				if tc.eventsClient {
					c.args = []string{"-e"}
				}
				common := append([]string{"-n", strconv.Itoa(tc.iters), "-s", strconv.Itoa(tc.size), "-g", g}, tc.extra...)
				rc, rs := runPPPair(t, "srq-pingpong", ibv, srv, cli, host, s, c, common...)
				checkPP(t, pair.client+" client", c, rc, tc.iters, tc.size, tc.numQP)
				checkPP(t, pair.server+" server", s, rs, tc.iters, tc.size, tc.numQP)
			})
		}
	}
}

func TestRCPingpongEvents(t *testing.T) {
	cli, srv := rxetest.Pair(t)
	host, gidx := serverTarget(t, srv)
	ibv := lookIbv(t, "ibv_rc_pingpong")
	const iters = 200
	g := strconv.Itoa(gidx)
	for _, pair := range ppPairs {
		for _, size := range []int{64, 4096} {
			t.Run(fmt.Sprintf("%s-server/%s-client/s%d", pair.server, pair.client, size), func(t *testing.T) {
				s, c := ppSide{pair.server, []string{"-e"}}, ppSide{pair.client, []string{"-e"}}
				if size == 4096 {
					s.args, c.args = append(s.args, "-c"), append(c.args, "-c") // and check the data
				}
				rc, rs := runPPPair(t, "rc-pingpong", ibv, srv, cli, host, s, c,
					"-n", strconv.Itoa(iters), "-s", strconv.Itoa(size), "-g", g)
				checkPP(t, pair.client+" client", c, rc, iters, size, 1)
				checkPP(t, pair.server+" server", s, rs, iters, size, 1)
				for _, r := range []result{rc, rs} {
					if strings.Contains(r.stdout, "invalid data") {
						t.Errorf("%s", r.stdout)
					}
				}
			})
		}
	}
	// One side polls, the other sleeps.
	t.Run("ibv-server-polls/goverbs-client-events", func(t *testing.T) {
		s, c := ppSide{"ibv", nil}, ppSide{"goverbs", []string{"-e"}}
		rc, rs := runPPPair(t, "rc-pingpong", ibv, srv, cli, host, s, c, "-n", "100", "-s", "1000", "-g", g)
		checkPP(t, "goverbs client", c, rc, 100, 1000, 1)
		checkPP(t, "ibv server", s, rs, 100, 1000, 1)
	})
}

// TestUDSizeAboveMTU: a UD message is one packet, so -s above the port's
// active MTU is refused before anything is exchanged, naming the MTU, as
// ibv_ud_pingpong refuses it ("Requested size larger than port MTU (1024)").
func TestUDSizeAboveMTU(t *testing.T) {
	dev := rxetest.One(t)
	ctx := rxetest.Open(t, dev)
	pa, err := ctx.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	mtu := pa.ActiveMTU.Bytes()
	for _, args := range [][]string{
		{"ud-pingpong", "-d", dev, "-s", strconv.Itoa(mtu + 1)},
		{"ud-pingpong", "-d", dev, "-e", "-s", "65536", "10.99.0.2"},
		{"ud-pingpong", "-d", dev}, // the default 2048 is above rxe's 1024 on a 1500-byte link
	} {
		if len(args) == 3 && mtu >= 2048 {
			continue
		}
		r := goverbs(t, time.Minute, args...)
		want := fmt.Sprintf("active MTU (%d)", mtu)
		if r.code != 1 || !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "-s ") {
			t.Errorf("goverbs %q: exit %d (want 1), stderr %q (want it to contain %q)", args, r.code, r.stderr, want)
		}
	}
}

func TestUDSRQBadFlags(t *testing.T) {
	checkRefused(t, []refusal{
		{[]string{"ud-pingpong", "-s", "0"}, "-s 0"},
		{[]string{"ud-pingpong", "-r", "0"}, "-r 0"},
		{[]string{"ud-pingpong", "-n", "0"}, "-n 0"},
		{[]string{"ud-pingpong", "-p", "70000"}, "-p 70000"},
		{[]string{"ud-pingpong", "-m", "1024"}, "not defined: -m"}, // ibv_ud_pingpong has no -m
		{[]string{"ud-pingpong", "-c"}, "not defined: -c"},
		{[]string{"ud-pingpong", "a", "b"}, "at most one HOST"},
		{[]string{"ud-pingpong", "-d", "nosuchdev9"}, "nosuchdev9"},
		{[]string{"srq-pingpong", "-q", "0"}, "-q 0"},
		{[]string{"srq-pingpong", "-q", "257"}, "1..256"},
		{[]string{"srq-pingpong", "-q", "20", "-r", "10"}, "rx_depth 10 is too small for 20 QPs"},
		{[]string{"srq-pingpong", "-m", "300"}, "-m 300"},
		{[]string{"srq-pingpong", "-s", "0"}, "-s 0"},
		{[]string{"srq-pingpong", "-eq0"}, "-q 0"}, // clustered, like getopt
		{[]string{"srq-pingpong", "-x"}, "not defined: -x"},
		{[]string{"srq-pingpong", "-d", "nosuchdev9"}, "nosuchdev9"},
	})
	for _, cmd := range []string{"ud-pingpong", "srq-pingpong"} {
		r := goverbs(t, time.Minute, cmd, "-h")
		if r.code != 0 || !strings.Contains(r.stderr, "-e, --events           sleep on CQ events") {
			t.Errorf("%s -h: exit %d, %q", cmd, r.code, r.stderr)
		}
	}
}

// TestGRHSGID: the loop's allocation-free GRH reading agrees with
// qp.ParseGRH for both header kinds, and refuses garbage.
func TestGRHSGID(t *testing.T) {
	var v4 [40]byte
	v4[20] = 0x45
	v4[28] = 1
	copy(v4[32:], []byte{10, 99, 0, 1, 10, 99, 0, 2})
	var v6 [40]byte
	v6[0] = 0x60
	copy(v6[8:], net.ParseIP("fe80::1"))
	copy(v6[24:], net.ParseIP("fe80::2"))
	for _, b := range [][]byte{v4[:], v6[:]} {
		want, err := qp.ParseGRH(b)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := grhSGID(b)
		if !ok || !net.IP(got[:]).Equal(want.SGID) {
			t.Errorf("grhSGID(% x) = %v, %v; ParseGRH says %v", b, net.IP(got[:]), ok, want.SGID)
		}
	}
	if g, ok := grhSGID(v4[:]); !ok || ntop(g) != "::ffff:10.99.0.1" {
		t.Errorf("IPv4 GRH: %s %v", ntop(g), ok)
	}
	var junk [40]byte
	for i := range junk {
		junk[i] = 0x7b // the buffer before any receive
	}
	if _, ok := grhSGID(junk[:]); ok {
		t.Error("grhSGID accepted a buffer without a GRH")
	}
	if _, ok := grhSGID(v4[:39]); ok {
		t.Error("grhSGID accepted 39 bytes")
	}
	if n := testing.AllocsPerRun(100, func() { grhSGID(v4[:]) }); n != 0 {
		t.Errorf("grhSGID allocates %v times", n)
	}
}

// TestSRQExchangeFormat: srq-pingpong sends srq_pingpong.c's MAX_QP (256)
// addresses, the ones past -q all zero, as captured from ibv_srq_pingpong.
func TestSRQExchangeFormat(t *testing.T) {
	my := make([]dest, srqMaxQP)
	my[0] = dest{QPN: 0x12, PSN: 0xa2c4a2, GID: gid16("::ffff:10.99.0.2")}
	my[1] = dest{QPN: 0x13, PSN: 0x16aee4, GID: gid16("::ffff:10.99.0.2")}
	b := encodeDests(my)
	if len(b) != srqMaxQP*wireMsgLen {
		t.Fatalf("%d bytes, want %d", len(b), srqMaxQP*wireMsgLen)
	}
	for i, want := range []string{
		"0000:000012:a2c4a2:00000000000000000000ffff0a630002\x00",
		"0000:000013:16aee4:00000000000000000000ffff0a630002\x00",
		"0000:000000:000000:00000000000000000000000000000000\x00",
	} {
		if got := string(b[i*wireMsgLen : (i+1)*wireMsgLen]); got != want {
			t.Errorf("message %d = %q, want %q", i, got, want)
		}
	}
}

// TestPrintDest: the three ping-pongs' address lines, as rdma-core's
// print them (ud_pingpong's local line has ": GID"), which the interop
// tests read in the guest; printDest makes all of them.
func TestPrintDest(t *testing.T) {
	d := dest{LID: 0x12, QPN: 0x345, PSN: 0xabcdef}
	copy(d.GID[:], net.ParseIP("10.99.0.1").To16())
	for _, tc := range []struct{ what, sep, want string }{
		{"local address: ", ",", "  local address:  LID 0x0012, QPN 0x000345, PSN 0xabcdef, GID ::ffff:10.99.0.1\n"},
		{"local address: ", ":", "  local address:  LID 0x0012, QPN 0x000345, PSN 0xabcdef: GID ::ffff:10.99.0.1\n"},
		{"remote address:", ",", "  remote address: LID 0x0012, QPN 0x000345, PSN 0xabcdef, GID ::ffff:10.99.0.1\n"},
	} {
		var b strings.Builder
		printDest(&b, tc.what, tc.sep, d)
		if b.String() != tc.want {
			t.Errorf("printDest(%q, %q) = %q, want %q", tc.what, tc.sep, b.String(), tc.want)
		}
	}
}
