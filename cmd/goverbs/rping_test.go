package main

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/rxetest"
)

// rpingPort hands out rdma_cm ports for these tests.
var rpingPort = 7300

// rpingData is what rping.c's client puts in its buffer for ping i, up to
// the terminating zero (size-1 bytes): the text, then letters from 'A'+i.
func rpingData(i, size int) string {
	b := []byte(fmt.Sprintf("rdma-ping-%d: ", i))
	c := byte(65 + i%58)
	for len(b) < size-1 {
		b = append(b, c)
		c++
		if c > 122 {
			c = 65
		}
	}
	return string(b[:size-1])
}

// waitCMListen waits until a listener on addr:port shows in `rdma resource
// show cm_id`, or the server exited.
func waitCMListen(t *testing.T, addr string, port int, done <-chan struct{}) {
	t.Helper()
	want := fmt.Sprintf("src-addr %s:%d", addr, port)
	if !rxetest.WaitCMListen(t, fmt.Sprintf("%s:%d", addr, port), func(l string) bool { return strings.Contains(l, want) }, done) {
		t.Fatal("the server exited before it listened")
	}
}

// TestRpingInterop runs goverbs rping against rdma-core's rping (rdmacm-utils)
// both ways and against itself, rxe0 (10.99.0.1) -> rxe1 (10.99.0.2): the
// client validates (-V) and both print every ping's data (-v), which must
// be rping's pattern.
func TestRpingInterop(t *testing.T) {
	rxetest.Pair(t)
	rping := lookTool(t, "rping", "rdmacm-utils")
	const count = 5
	for _, pair := range []struct{ server, client string }{
		{"goverbs", "rping"}, {"rping", "goverbs"}, {"goverbs", "goverbs"},
	} {
		for _, size := range []int{64, 1000} {
			t.Run(fmt.Sprintf("%s-server/%s-client/S%d", pair.server, pair.client, size), func(t *testing.T) {
				port := rpingPort
				rpingPort++
				run := peerStarter(t, rping, "rping")
				common := []string{"-p", strconv.Itoa(port), "-S", strconv.Itoa(size), "-v"}
				srvRes, srvDone := run(pair.server, append([]string{"-s", "-a", "10.99.0.2"}, common...)...)
				waitCMListen(t, "10.99.0.2", port, srvDone)
				cliRes, _ := run(pair.client, append([]string{"-c", "-a", "10.99.0.2", "-I", "10.99.0.1", "-C", strconv.Itoa(count), "-V"}, common...)...)
				rc, rs := cliRes(), srvRes()
				for _, x := range []struct {
					who, prefix string
					r           result
				}{{pair.client + " client", "ping data: ", rc}, {pair.server + " server", "server ping data: ", rs}} {
					if x.r.code != 0 || x.r.err != nil {
						t.Errorf("%s: exit %d (%v)\nstdout:\n%s\nstderr:\n%s", x.who, x.r.code, x.r.err, x.r.stdout, x.r.stderr)
						continue
					}
					var want []string
					for i := 0; i < count; i++ {
						want = append(want, x.prefix+rpingData(i, size))
					}
					got := strings.Split(strings.TrimRight(x.r.stdout, "\n"), "\n")
					if strings.Join(got, "\n") != strings.Join(want, "\n") {
						t.Errorf("%s printed:\n%s\nwant:\n%s\nstderr:\n%s", x.who, x.r.stdout, strings.Join(want, "\n"), x.r.stderr)
					}
				}
			})
		}
	}
}

func TestRpingUsage(t *testing.T) {
	checkUsageErrors(t, [][]string{
		{"rping"}, {"rping", "-s", "-c"}, {"rping", "-c"}, {"rping", "-s", "-S", "10"},
		{"rping", "-s", "-S", "70000"}, {"rping", "-s", "-C", "-1"}, {"rping", "-s", "-p", "0"},
	})
}

// checkUsageErrors checks that each goverbs command line exits non-zero
// with a usage error on stderr.
func checkUsageErrors(t *testing.T, cmdlines [][]string) {
	t.Helper()
	for _, args := range cmdlines {
		r := goverbs(t, time.Minute, args...)
		if r.code == 0 || r.stderr == "" {
			t.Errorf("goverbs %s: exit %d, stderr %q; want a usage error", strings.Join(args, " "), r.code, r.stderr)
		}
	}
}

// peerStarter returns how to start one side of an interop test, run as
// who: sub, rdma-core's tool at path; else `goverbs sub`.
func peerStarter(t *testing.T, path, sub string) func(who string, args ...string) (func() result, chan struct{}) {
	return func(who string, args ...string) (func() result, chan struct{}) {
		return startPeer(t, who == sub, path, sub, args...)
	}
}

// cmInterop is the frame of the interop tests of ucmatose, udaddy and
// mckey: on the rxe pair, with rdma-core's tool found (rdmacm-utils), f
// runs in a subtest for each pairing of the tool and goverbs in the roles
// roleA and roleB (goverbs and the tool, the tool and goverbs, goverbs and
// itself), named "A-roleA/B-roleB"; i is its index, run starts a side
// (peerStarter).
func cmInterop(t *testing.T, tool, roleA, roleB string, f func(t *testing.T, i int, a, b string, run peerRun)) {
	rxetest.Pair(t)
	path := lookTool(t, tool, "rdmacm-utils")
	for i, p := range [][2]string{{"goverbs", tool}, {tool, "goverbs"}, {"goverbs", "goverbs"}} {
		t.Run(fmt.Sprintf("%s-%s/%s-%s", p[0], roleA, p[1], roleB), func(t *testing.T) {
			f(t, i, p[0], p[1], peerStarter(t, path, tool))
		})
	}
}

// peerRun starts one side of an interop test as who (see peerStarter).
type peerRun = func(who string, args ...string) (func() result, chan struct{})

// checkCMRun fails t unless who's run r (of an rdma_cm tool, rdma-core's
// or goverbs') exited 0 without an error and printed rdma-core's "data
// transfers complete" and "return status 0", and each of want.
func checkCMRun(t *testing.T, who string, r result, want ...string) {
	t.Helper()
	ok := r.code == 0 && r.err == nil
	for _, w := range append([]string{"data transfers complete", "return status 0"}, want...) {
		ok = ok && strings.Contains(r.stdout, w)
	}
	if !ok {
		t.Errorf("%s: exit %d (%v)\nstdout:\n%s\nstderr:\n%s", who, r.code, r.err, r.stdout, r.stderr)
	}
}

// startPeer runs one side of an interop test in the background: rdma-core's
// tool at path (rdmaCore) or `goverbs sub`, with args. wait returns its
// result once it exits; done is closed then.
func startPeer(t *testing.T, rdmaCore bool, path, sub string, args ...string) (wait func() result, done chan struct{}) {
	done = make(chan struct{})
	var r result
	var once sync.Once
	go func() {
		defer close(done)
		if rdmaCore {
			r = runCmd(t, time.Minute, path, nil, args...)
		} else {
			r = goverbs(t, time.Minute, append([]string{sub}, args...)...)
		}
	}()
	return func() result { once.Do(func() { <-done }); return r }, done
}
