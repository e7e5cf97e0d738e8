package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestPerfBX runs bx_lat, tcp_lat, bx_bw and tcp_bw, and their gRPC
// counterparts, as two processes (server on the second device, client on
// the first) and checks both reports.
func TestPerfBX(t *testing.T) {
	cli, srv := rxetest.Pair(t)
	host, _ := serverTarget(t, srv)
	for _, tc := range []struct {
		args    string
		iters   int
		cliArgs string // the client's only
	}{
		{"bx_lat", 50, ""},
		{"bx_lat", 20, "--idle 1s"},
		{"bx_lat -s 4096", 50, ""},
		{"bx_lat -s 100000", 10, ""},
		{"bx_lat --spin=-1ns", 20, ""},
		{"tcp_lat", 50, ""},
		{"tcp_lat -s 100000", 10, ""},
		{"bx_lat -s 271 --resp-size 4116", 20, ""}, // a ps pull's bytes (scripts/bench-ps)
		{"bx_lat --zero-copy -s 3", 20, ""},        // shorter than the 8-byte count
		{"bx_lat --zero-copy -s 4096", 50, ""},
		{"bx_lat --zero-copy -s 100000", 10, ""},
		{"bx_lat -s 32768 --eager-size 65488", 10, ""}, // eager, not rendezvous: both sides raised
		{"bx_lat -s 32768", 10, ""},                    // split in parts (bx's default SplitSize)
		{"bx_lat -s 32768 --split-size -1", 10, ""},    // by rendezvous
		{"tcp_lat -s 271 --resp-size 4116", 20, ""},
		{"bx_bw -s 4096 -t 8", 200, ""},
		{"tcp_bw -s 4096 -t 8", 200, ""},
		{"grpc_lat", 30, ""},
		{"grpc_lat -s 100000", 10, ""},
		{"grpc_tcp_lat", 30, ""},
		{"grpc_bw -s 4096 -t 8", 100, ""},
		{"grpc_tcp_bw -s 4096 -t 8", 100, ""},
	} {
		t.Run(strings.TrimSpace(tc.args+" "+tc.cliArgs), func(t *testing.T) {
			port := perfPort
			perfPort += 2
			common := append([]string{"perf"}, strings.Fields(tc.args)...)
			common = append(common, "-n", strconv.Itoa(tc.iters), "-p", strconv.Itoa(port), "--json")
			if strings.HasPrefix(tc.args, "grpc_") && !goverbsHasGRPC(t) {
				t.Skip("goverbs built without -tags goverbs_grpc (it says so, checked); scripts/vm's copy has it")
			}
			rc, rs := serverClient(t, 4*time.Minute, port, slices.Concat(common, []string{"-d", srv}),
				slices.Concat(common, strings.Fields(tc.cliArgs), []string{"-d", cli, host}))
			test := strings.Fields(tc.args)[0]
			for _, x := range []struct {
				who string
				r   result
			}{{"client", rc}, {"server", rs}} {
				if x.r.code != 0 || x.r.err != nil {
					t.Fatalf("%s: exit %d (%v)\nstdout:\n%s\nstderr:\n%s", x.who, x.r.code, x.r.err, x.r.stdout, x.r.stderr)
				}
				var rep perfBXReport
				dec := json.NewDecoder(strings.NewReader(x.r.stdout))
				dec.DisallowUnknownFields()
				if err := dec.Decode(&rep); err != nil {
					t.Fatalf("%s: stdout %q: %v", x.who, x.r.stdout, err)
				}
				if rep.Test != test || rep.Role != x.who || rep.MeasuredBy != "client" {
					t.Errorf("%s: test %q role %q measured by %q", x.who, rep.Test, rep.Role, rep.MeasuredBy)
				}
				want := "bx"
				if strings.Contains(test, "tcp_") {
					want = "tcp"
				}
				if strings.HasPrefix(test, "grpc_") {
					want = "grpc over " + want
				}
				if rep.Transport != want {
					t.Errorf("%s: transport %q, want %q", x.who, rep.Transport, want)
				}
				if never := strings.Contains(tc.args, "--split-size -1"); never != (rep.SplitSize == -1) {
					t.Errorf("%s: split_size %d reported", x.who, rep.SplitSize)
				}
				if zc := strings.Contains(tc.args, "--zero-copy"); rep.ZeroCopy != zc {
					t.Errorf("%s: zero_copy %v, want %v", x.who, rep.ZeroCopy, zc)
				}
				if rep.CPU.Client <= 0 || rep.CPU.Server <= 0 {
					t.Errorf("%s: CPU per call %+v", x.who, rep.CPU)
				}
				if idle := tc.cliArgs != "" && x.who == "client"; idle != (rep.IdleCPU != nil) {
					t.Errorf("%s: idle CPU %v, want it reported: %v", x.who, rep.IdleCPU, idle)
				} else if idle {
					// An idle endpoint sleeps: a bound on CPU time, not on
					// speed (a busy loop would show ~100%).
					if *rep.IdleCPU < 0 || *rep.IdleCPU > 50 {
						t.Errorf("client: %.1f%% of a core while idle", *rep.IdleCPU)
					}
					t.Logf("client idle for %s: %.2f%% of a core", rep.Idle, *rep.IdleCPU)
				}
				if strings.HasSuffix(test, "_lat") {
					if len(rep.Latency) != 1 {
						t.Fatalf("%s: %d latency results", x.who, len(rep.Latency))
					}
					l := rep.Latency[0]
					if l.Iterations != tc.iters || l.TMin <= 0 || l.TMin > l.TTypical || l.TTypical > l.TMax || l.P99 < l.TTypical {
						t.Errorf("%s: latency result %+v", x.who, l)
					}
					t.Logf("%s: t_typical %.1f usec, CPU/call client %.1f server %.1f usec", x.who, l.TTypical, rep.CPU.Client, rep.CPU.Server)
					continue
				}
				if len(rep.Bandwidth) != 1 || rep.Bandwidth[0].Iterations != tc.iters || rep.Bandwidth[0].BWAvg <= 0 {
					t.Fatalf("%s: bandwidth results %+v", x.who, rep.Bandwidth)
				}
				t.Logf("%s: %.2f MiB/s, CPU/call client %.1f server %.1f usec", x.who, rep.Bandwidth[0].BWAvg, rep.CPU.Client, rep.CPU.Server)
			}
		})
	}
}

// goverbsHasGRPC reports whether the goverbs under test has the grpc_*
// tests (-tags goverbs_grpc: scripts/vm's copy in the guest does, a plain
// go build does not). A goverbs without them must refuse them with exit
// status 1 and a message naming the tag, before it looks at its flags
// (-s -1 is refused by one with them).
func goverbsHasGRPC(t *testing.T) bool {
	t.Helper()
	r := goverbs(t, time.Minute, "perf", "grpc_lat", "-s", "-1")
	if strings.Contains(r.stderr, "built without gRPC") {
		if r.code != 1 || !strings.Contains(r.stderr, "-tags goverbs_grpc") {
			t.Fatalf("goverbs perf grpc_lat without gRPC: exit %d, stderr %q; want exit 1 and the tag named", r.code, r.stderr)
		}
		return false
	}
	if r.code == 0 || !strings.Contains(r.stderr, "-s -1") {
		t.Fatalf("goverbs perf grpc_lat -s -1: exit %d, stderr %q; want a usage error naming -s -1", r.code, r.stderr)
	}
	return true
}

// TestPerfBXSamplesTrace runs bx_lat with --samples and --trace: the
// samples are the round trips the report summarizes (as many, the same
// smallest), and each side's trace is a Go execution trace.
func TestPerfBXSamplesTrace(t *testing.T) {
	cli, srv := rxetest.Pair(t)
	host, _ := serverTarget(t, srv)
	dir := t.TempDir()
	samples, ctrace, strace := filepath.Join(dir, "samples"), filepath.Join(dir, "cli.trace"), filepath.Join(dir, "srv.trace")
	const iters = 40
	port := perfPort
	perfPort += 2
	common := []string{"perf", "bx_lat", "-n", strconv.Itoa(iters), "-p", strconv.Itoa(port), "--json"}
	rc, rs := serverClient(t, 4*time.Minute, port, slices.Concat(common, []string{"--trace", strace, "-d", srv}),
		slices.Concat(common, []string{"--samples", samples, "--trace", ctrace, "-d", cli, host}))
	for _, r := range []result{rc, rs} {
		if r.code != 0 || r.err != nil {
			t.Fatalf("exit %d (%v)\nstdout:\n%s\nstderr:\n%s", r.code, r.err, r.stdout, r.stderr)
		}
	}
	var rep perfBXReport
	if err := json.Unmarshal([]byte(rc.stdout), &rep); err != nil || len(rep.Latency) != 1 {
		t.Fatalf("client report %q: %v", rc.stdout, err)
	}
	b, err := os.ReadFile(samples)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(b))
	if len(lines) != iters {
		t.Fatalf("%d samples, want %d:\n%s", len(lines), iters, b)
	}
	lo := math.Inf(1)
	for _, l := range lines {
		v, err := strconv.ParseFloat(l, 64)
		if err != nil || v <= 0 {
			t.Fatalf("sample %q: %v", l, err)
		}
		lo = min(lo, v)
	}
	if l := rep.Latency[0]; math.Abs(lo-l.TMin) > 0.001 {
		t.Errorf("smallest sample %.3f usec, the report's t_min %.3f", lo, l.TMin)
	}
	for _, f := range []string{ctrace, strace} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// A Go execution trace starts "go 1.NN trace".
		if len(b) < 1024 || !bytes.HasPrefix(b, []byte("go 1.")) {
			t.Errorf("%s: %d bytes starting %q, not an execution trace", f, len(b), b[:min(len(b), 16)])
		}
	}
}
