package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/clitest"
)

// These tests need no RDMA device: each command line is refused by the
// command's own checks, before a device (or a peer) is looked for. They
// run goverbs in this process (run), bounded: a command that accepted
// the bad value would go on to wait for a peer, so a run that has not
// returned within the bound is a failure, not a hang of the test. The
// bound is a hang bound: a refusal takes milliseconds, and the bound,
// scaled to the machine's speed (hang.Scale), is thousands of times that.

// quickRun is run(args) that must return within bound (scaled by
// hang.Scale); it returns the exit status and stderr. A panic is reported
// as a failure.
func quickRun(t *testing.T, bound time.Duration, args ...string) (int, string) {
	t.Helper()
	code, _, stderr := clitest.Run(t, bound, "goverbs", args, run)
	return code, stderr
}

// freePort is a TCP port nothing listens on (just now).
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// TestRejectedFlags: each command line exits 1 with a message naming the
// flag and its value, at once. Before the fixes each was accepted: it
// failed later for another reason (no device, no peer), waited for a peer,
// or panicked (perf tcp_lat -n 2^63-1: makeslice, as the client).
func TestRejectedFlags(t *testing.T) {
	const p = "PORT" // a free port of its own for each case
	for i, tc := range []struct {
		args []string
		want string
	}{
		// perf bx_lat/tcp_lat: -n had no upper bound; n+1 timestamps.
		{[]string{"perf", "tcp_lat", "-p", p, "-n", "9223372036854775807"}, "-n 9223372036854775807"},
		{[]string{"perf", "tcp_lat", "-p", p, "-n", "1099511627776", "127.0.0.1"}, "-n 1099511627776"},
		{[]string{"perf", "bx_lat", "-p", p, "-n", "2147483648"}, "-n 2147483648"},
		// perf bx_*: an unknown -d only failed once a client had come.
		{[]string{"perf", "bx_lat", "-p", p, "-d", "nosuchdev9"}, "nosuchdev9"},
		{[]string{"perf", "bx_bw", "-p", p, "-d", ""}, `-d ""`},
		// perf: iterations times QPs timestamps, kept in memory.
		{[]string{"perf", "send_bw", "-p", p, "-n", "2147483640", "-q", "16384"}, "-n 2147483640 with -q 16384"},
		{[]string{"perf", "send_lat", "-p", p, "-n", "1000000000"}, "-n 1000000000"},
		// perf: values outside the range the message gives, which
		// meant "default" only when left out.
		{[]string{"perf", "read_lat", "-p", p, "-o", "0"}, "-o 0"},
		{[]string{"perf", "send_lat", "-p", p, "-I", "-1"}, "-I -1"},
		{[]string{"perf", "send_lat", "-p", p, "-m", "0"}, "-m 0"},
		{[]string{"perf", "send_lat", "-p", p, "-d", ""}, `-d ""`},
		// perf -R: a bad HOST was refused after opening rdma_cm, with
		// the value alone, not the argument it came from.
		{[]string{"perf", "send_lat", "-R", "-p", p, "bad!host"}, `HOST "bad!host": invalid server address`},
		{[]string{"perf", "write_bw", "-R", "-p", p, "-d", "rxe0", "bad!host"}, `HOST "bad!host": invalid server address`},
		// rc/srq-pingpong -m 0: passed as "no -m" and reached RTR as MTU 0.
		{[]string{"rc-pingpong", "-p", p, "-m", "0", "127.0.0.1"}, "-m 0"},
		{[]string{"srq-pingpong", "-p", p, "--mtu=0", "127.0.0.1"}, "-m 0"},
		// -r past int32: wrapped in the uint32 receive queue size.
		{[]string{"rc-pingpong", "-p", p, "-r", "4294967297", "127.0.0.1"}, "-r 4294967297"},
		{[]string{"ud-pingpong", "-p", p, "-r", "9223372036854775807", "127.0.0.1"}, "-r 9223372036854775807"},
		{[]string{"srq-pingpong", "-p", p, "-r", "9223372036854775807", "127.0.0.1"}, "-r 9223372036854775807"},
		{[]string{"ud-pingpong", "-p", p, "-d", "", "127.0.0.1"}, `-d ""`},
		// ps serve took operands and ignored them (and then served).
		{[]string{"ps", "serve", "--transport", "tcp", "--listen", "127.0.0.1:0", "extra"}, `unexpected argument "extra"`},
		// top: a misspelt --skip was ignored; a bad --metrics URL only
		// showed as a scrape error; --pid past PID_MAX_LIMIT.
		{[]string{"top", "--once", "--interval", "10ms", "--skip", "rxe-packet"}, `--skip "rxe-packet"`},
		{[]string{"top", "--once", "--interval", "10ms", "--metrics", "127.0.0.1:9464"}, `--metrics "127.0.0.1:9464"`},
		{[]string{"top", "--once", "--interval", "10ms", "--pid", "99999999999"}, `--pid "99999999999"`},
		// version and devices.
		{[]string{"version", "extra"}, `unexpected argument "extra"`},
		{[]string{"devices", "-i", "1"}, "-i 1: only with -v"},
		{[]string{"devices", "-d", ""}, `-d ""`},
		// The rdma_cm tools named no flag; rping -s ignored -I;
		// ucmatose took any -f.
		{[]string{"rping", "-s", "-S", "0"}, "-S 0"},
		{[]string{"rping", "-s", "-C", "-1"}, "-C -1"},
		{[]string{"rping", "-c", "-a", "127.0.0.1", "-p", "0"}, "-p 0"},
		{[]string{"rping", "-s", "-p", p, "-I", "127.0.0.1"}, `-I "127.0.0.1"`},
		{[]string{"udaddy", "-b", "127.0.0.1", "-C", "0"}, "-C 0"},
		{[]string{"udaddy", "-b", "127.0.0.1", "-S", "-1"}, "-S -1"},
		{[]string{"ucmatose", "-p", p, "-f", "bogus"}, `-f "bogus"`},
		{[]string{"ucmatose", "-p", "70000"}, "-p 70000"},
		{[]string{"mckey", "-m", "239.1.1.1", "-C", "-1"}, "-C -1"},
		{[]string{"mckey", "-m", "239.1.1.1", "-S", "-1"}, "-S -1"},
		{[]string{"mckey", "-m", "239.1.1.1", "-o"}, "-o: a send-only join receives nothing"},
		// The rdma_cm tools' addresses: a bad one was refused with the
		// value alone (and, but for rping, after "starting"), not the
		// flag it came from. "bad!host" is no IP address and no domain
		// name: its lookup fails without asking a name server.
		{[]string{"rping", "-c", "-a", "bad!host"}, `-a "bad!host": invalid server address`},
		{[]string{"rping", "-s", "-p", p, "-a", "bad!host"}, `-a "bad!host": invalid bind address`},
		{[]string{"rping", "-c", "-a", "127.0.0.1", "-I", "bad!host"}, `-I "bad!host": invalid source address`},
		{[]string{"udaddy", "-s", "bad!host"}, `-s "bad!host": invalid server address`},
		{[]string{"udaddy", "-s", "127.0.0.1", "-b", "bad!host"}, `-b "bad!host": invalid bind address`},
		{[]string{"udaddy", "-b", "bad!host"}, `-b "bad!host": invalid bind address`},
		{[]string{"ucmatose", "-p", p, "-s", "bad!host"}, `-s "bad!host": invalid server address`},
		{[]string{"ucmatose", "-p", p, "-s", "127.0.0.1", "-b", "bad!host"}, `-b "bad!host": invalid bind address`},
		{[]string{"ucmatose", "-p", p, "-b", "bad!host"}, `-b "bad!host": invalid bind address`},
		{[]string{"mckey", "-m", "bad!host"}, `-m "bad!host": invalid multicast address`},
		{[]string{"mckey", "-m", "239.1.1.1", "-b", "bad!host"}, `-b "bad!host": invalid bind address`},
		// mckey -m took a unicast address: the join failed later, or
		// waited.
		{[]string{"mckey", "-m", "10.0.0.1"}, `-m "10.0.0.1": not a multicast address`},
		{[]string{"mckey", "-s", "-m", "2001:db8::1"}, `-m "2001:db8::1": not a multicast address`},
		{[]string{"mckey", "-m", "::ffff:10.1.2.3"}, `-m "::ffff:10.1.2.3": not a multicast address`},
		{[]string{"mckey", "-m", "localhost"}, `-m "localhost": not a multicast address (it is `},
	} {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			args := append([]string(nil), tc.args...)
			for j, a := range args {
				if a == p {
					args[j] = freePort(t)
				}
			}
			code, stderr := quickRun(t, 30*time.Second, args...)
			if code != 1 || !strings.Contains(stderr, tc.want) {
				t.Errorf("goverbs %q: exit %d (want 1), stderr %q (want it to name %q)", args, code, stderr, tc.want)
			}
		})
	}
}

// TestMckeyGroup: mckey -m takes the multicast ranges, IPv4 224.0.0.0/4
// and IPv6 ff00::/8 (a v4-mapped group as its IPv4 address), and refuses
// the addresses at their borders, naming -m and the value.
func TestMckeyGroup(t *testing.T) {
	for g, want := range map[string]string{
		"224.0.0.1": "224.0.0.1", "239.255.255.255": "239.255.255.255", "::ffff:239.1.8.1": "239.1.8.1",
		"ff02::1": "ff02::1", "ffff:ffff::1": "ffff:ffff::1",
	} {
		o, err := parseMckey([]string{"-m", g, "-C", "5"}, io.Discard)
		if err != nil {
			t.Errorf("mckey -m %s: %v", g, err)
		} else if o.groupAddr.String() != want || o.count != 5 {
			t.Errorf("mckey -m %s -C 5: group %v, count %d; want %s, 5", g, o.groupAddr, o.count, want)
		}
	}
	for _, g := range []string{"223.255.255.255", "240.0.0.0", "255.255.255.255", "0.0.0.0", "feff::1", "::", "::ffff:10.0.0.1"} {
		_, err := parseMckey([]string{"-s", "-m", g}, io.Discard)
		if want := fmt.Sprintf("-m %q: not a multicast address", g); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("mckey -s -m %s: %v; want an error naming %q", g, err, want)
		}
	}
}

// TestPSParseRejects: ps bench and ps worker took operands and ignored
// them, and ps bench took NaN in --rates (NaN <= 0 is false).
func TestPSParseRejects(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--transport", "tcp", "extra"}, `unexpected argument "extra"`},
		{[]string{"--transport", "tcp", "--rates", "100,NaN"}, `"NaN" is not a rate`},
	} {
		_, err := parsePSBench(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ps bench %q: %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
	args := []string{"--transport", "tcp", "--addrs", "127.0.0.1:1", "extra"}
	if _, err := parsePSWorker(args, io.Discard); err == nil || !strings.Contains(err.Error(), `unexpected argument "extra"`) {
		t.Errorf("ps worker %q: %v, want an error naming the operand", args, err)
	}
}

// TestPerfMeasureBoundNoOverflow: the passive side's bound on the
// measurement, for -n 2^31-1 of 8 MiB (what -n and -s allow), was past
// int64 nanoseconds and wrapped negative: the exchange then waited only
// perfStall for a measurement of hours.
func TestPerfMeasureBoundNoOverflow(t *testing.T) {
	for _, o := range []*perfOptions{
		{iters: 1<<31 - 1, qps: 1, sizes: []int{perfMaxSize}},
		{iters: 1<<31 - 1, qps: perfMaxQPs, sizes: []int{perfMaxSize}},
		{iters: 1 << 27, qps: 1, sizes: []int{2, 4, 8, 1 << 22, perfMaxSize}},
	} {
		r := &perfRun{o: o}
		if b := r.measureBound(); b < perfStall+time.Hour {
			t.Errorf("measureBound(-n %d -q %d sizes %v) = %v, want hours at least", o.iters, o.qps, o.sizes, b)
		}
	}
	r := &perfRun{o: &perfOptions{iters: 1000, qps: 1, sizes: []int{2}}}
	if b, want := r.measureBound(), perfStall+time.Second+2*time.Millisecond; b != want {
		t.Errorf("measureBound(-n 1000 -s 2) = %v, want %v", b, want)
	}
}

// TestVMFlagsRejected: --timeout in whole seconds past int64 nanoseconds
// wrapped to a negative timeout (none on the host, a bad one in the
// guest); --cpus had no upper bound (qemu refused it after the setup).
// parseVMFlags boots nothing.
func TestVMFlagsRejected(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--timeout", "10000000000", "true"}, "--timeout"},
		{[]string{"--timeout", "9223372036854775807", "true"}, "--timeout"},
		{[]string{"--timeout", "100000000h", "true"}, "--timeout"},
		{[]string{"--cpus", "100000", "true"}, "--cpus"},
	} {
		o, _, err := parseVMFlags(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("vm %q: timeout %v cpus %d, err %v; want an error naming %s", tc.args, o.Timeout, o.CPUs, err, tc.want)
		}
	}
	o, argv, err := parseVMFlags([]string{"--timeout", "3600", "--cpus", "2", "true"}, io.Discard)
	if err != nil || o.Timeout != time.Hour || o.CPUs != 2 || len(argv) != 1 {
		t.Errorf("vm --timeout 3600 --cpus 2 true: %+v %q %v", o, argv, err)
	}
}

// TestPSReportDegeneratePlots: an open-loop run whose p50 and p99 are one
// value below 1 us (one run; a result without a histogram, whose
// quantiles come out 0) gave a latency axis of one value, which gonum
// pads by 1 either way, to 0 or below on its log scale: a panic. A CDF of
// one bucket at 0 did the same; a histogram of zero counts made NaN
// points (an error).
func TestPSReportDegeneratePlots(t *testing.T) {
	dir := t.TempDir()
	for i, line := range []string{
		`{"transport":"rdma","workload":"inference","ops":[{"op":"pull","count":5,"p50_us":0.5,"p99_us":0.5}],"offered_steps_per_s":100}`,
		`{"transport":"tcp","workload":"incast","ops":[{"op":"push","count":5,"p50_us":7,"p99_us":9,"hist":[[0,5]]}]}`,
		`{"transport":"rdma","workload":"incast","ops":[{"op":"push","count":5,"p50_us":7,"p99_us":9,"hist":[[5000,0],[6000,0]]}]}`,
	} {
		f := filepath.Join(dir, fmt.Sprintf("r%d.json", i))
		if err := os.WriteFile(f, []byte(line+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		code, stderr := quickRun(t, time.Minute, "ps", "report", "--plots", filepath.Join(dir, "plots"), f)
		if code != 0 {
			t.Errorf("ps report --plots %s: exit %d, %s", line, code, stderr)
		}
	}
}

// TestPSReportReadError: a file that cannot be read to its end (a
// folder; a line over the scanner's limit) is an error naming it, not
// a silent end of its results.
func TestPSReportReadError(t *testing.T) {
	dir := t.TempDir()
	code, stderr := quickRun(t, time.Minute, "ps", "report", dir)
	if code != 1 || !strings.Contains(stderr, "is a directory") {
		t.Errorf("ps report DIR: exit %d, %q; want 1 and the read error", code, stderr)
	}
	f := filepath.Join(dir, "long.json")
	long := fmt.Sprintf("{\"x\":\"%s\"}\n", strings.Repeat("a", 65<<20))
	good := `{"transport":"tcp","workload":"inference","ops":[{"op":"pull","count":5,"p50_us":5,"p99_us":5}]}` + "\n"
	if err := os.WriteFile(f, []byte(long+good), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stderr = quickRun(t, time.Minute, "ps", "report", f)
	if code != 1 || !strings.Contains(stderr, "long.json") || !strings.Contains(stderr, "too long") {
		t.Errorf("ps report FILE with a 65 MiB line: exit %d, %q; want 1 and the scanner's error", code, stderr)
	}
}
