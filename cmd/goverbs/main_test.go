package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/uverbs"
)

// goverbsBin is the goverbs binary the tests run: inside a scripts/vm
// guest, the harness's own copy (GOVERBS_VM_BIN: scripts/vm builds it from
// this checkout with CGO_ENABLED=0, so the link under TCG is saved; set
// GOVERBS_TEST_BUILD=1 to build anyway); else built into a temporary
// folder by TestMain with CGO_ENABLED=0 go build, or, when no go tool is at
// hand (or GOVERBS_TEST_BUILD=0), this test binary itself re-executed as
// goverbs (GOVERBS_TEST_MAIN=1 makes TestMain run main instead of tests).
var goverbsBin string

var goverbsEnv []string

func TestMain(m *testing.M) {
	if os.Getenv("GOVERBS_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	flag.Parse()
	// The linker maps its output file, which fails on the 9p share that
	// holds /tmp in the scripts/vm guest: prefer a tmpfs.
	tmp := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		tmp = "/dev/shm"
	}
	dir, err := os.MkdirTemp(tmp, "goverbs-cmd-test")
	if err != nil {
		dir, err = os.MkdirTemp("", "goverbs-cmd-test")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	goverbsBin = filepath.Join(dir, "goverbs")
	how := "built with CGO_ENABLED=0 go build"
	t0 := time.Now()
	if b := os.Getenv("GOVERBS_VM_BIN"); b != "" && os.Getenv("GOVERBS_VM_GUEST") == "1" && os.Getenv("GOVERBS_TEST_BUILD") != "1" {
		goverbsBin, how = b, "the guest harness's copy (GOVERBS_VM_BIN)"
	} else if err := build(goverbsBin); err != nil {
		self, err2 := os.Executable()
		if err2 != nil {
			fmt.Fprintln(os.Stderr, err, err2)
			os.Exit(2)
		}
		goverbsBin, goverbsEnv = self, []string{"GOVERBS_TEST_MAIN=1"}
		how = fmt.Sprintf("the test binary re-executed (%v)", err)
	}
	if testing.Verbose() {
		fmt.Printf("goverbs binary: %s, %s in %v\n", goverbsBin, how, time.Since(t0).Round(time.Millisecond))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func build(out string) error {
	if os.Getenv("GOVERBS_TEST_BUILD") == "0" {
		return fmt.Errorf("GOVERBS_TEST_BUILD=0")
	}
	gotool, err := exec.LookPath("go")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(3*time.Minute)) // a hang bound
	defer cancel()
	cmd := exec.CommandContext(ctx, gotool, "build", "-o", out, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOTMPDIR="+filepath.Dir(out))
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v: %s", err, b)
	}
	return nil
}

type result struct {
	stdout, stderr string
	code           int
	err            error
}

// goverbs runs the goverbs binary, killed if it hangs (see runCmd).
func goverbs(t *testing.T, idle time.Duration, args ...string) result {
	t.Helper()
	return runCmd(t, idle, goverbsBin, goverbsEnv, args...)
}

// runCmd runs bin and kills it once it has printed nothing for idle
// (scaled to the machine's speed, hang.Scale): a tool that prints as it
// goes may run as long as it makes progress; one that prints only at its
// end gets idle, scaled, in all.
func runCmd(t *testing.T, idle time.Duration, bin string, env []string, args ...string) result {
	t.Helper()
	return runCmdCtx(t, context.Background(), idle, bin, env, args...)
}

// runCmdCtx is runCmd that also kills bin when parent ends.
func runCmdCtx(t *testing.T, parent context.Context, idle time.Duration, bin string, env []string, args ...string) result {
	t.Helper()
	ctx, wd := hang.Watch(parent, filepath.Base(bin)+" "+strings.Join(args, " "), idle)
	defer wd.Stop()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = wd.Writer(&o), wd.Writer(&e)
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	r := result{stdout: o.String(), stderr: e.String(), err: err}
	if cmd.ProcessState != nil {
		r.code = cmd.ProcessState.ExitCode()
	}
	if ctx.Err() != nil {
		r.err = fmt.Errorf("killed: %v (%v)", hang.Err(ctx), err)
	}
	return r
}

// refusal is a command line goverbs must refuse, and what its message
// must hold.
type refusal struct {
	args []string
	want string
}

// checkRefused checks that each command line exits 1 with its want in
// stderr.
func checkRefused(t *testing.T, cases []refusal) {
	t.Helper()
	for _, tc := range cases {
		r := goverbs(t, time.Minute, tc.args...)
		if r.code != 1 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("goverbs %q: exit %d (want 1), stderr %q (want it to contain %q)", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

func TestBadFlags(t *testing.T) {
	checkRefused(t, []refusal{
		{[]string{"rc-pingpong", "-m", "300"}, "-m 300"},
		{[]string{"rc-pingpong", "-s", "0"}, "-s 0"},
		{[]string{"rc-pingpong", "-r", "0"}, "-r 0"},
		{[]string{"rc-pingpong", "--linger", "-1s"}, "--linger -1s"},
		{[]string{"rc-pingpong", "-p", "70000"}, "-p 70000"},
		{[]string{"rc-pingpong", "-e", "-n", "0"}, "-n 0"}, // -e is supported: the bad -n is what fails
		{[]string{"rc-pingpong", "-o"}, "not supported"},
		{[]string{"rc-pingpong", "-t"}, "not supported"},
		{[]string{"rc-pingpong", "-j"}, "not supported"},
		{[]string{"rc-pingpong", "-x"}, "not defined: -x"},
		{[]string{"rc-pingpong", "a", "b"}, "at most one HOST"},
		{[]string{"rc-pingpong", "-d", "nosuchdev9"}, "nosuchdev9"},
		{[]string{"devices", "-d", "nosuchdev9"}, "nosuchdev9"},
		{[]string{"perf", "tcp_lat", "--zero-copy"}, "--zero-copy is for bx_lat"},
		{[]string{"perf", "bx_lat", "--zero-copy", "--resp-size", "8"}, "--zero-copy is for bx_lat"},
		{[]string{"perf", "tcp_lat", "--eager-size", "100000"}, "--eager-size is for the bx tests"},
		{[]string{"perf", "bx_lat", "--eager-size", "10"}, "--eager-size 10"},
		{[]string{"perf", "tcp_lat", "--split-size", "100000"}, "--split-size is for the bx tests"},
		{[]string{"perf", "bx_lat", "--split-size", "-5"}, "--split-size -5"},
		{[]string{"ps", "bench", "--eager-size", "2000000"}, "--eager-size 2000000"},
		{[]string{"ps", "serve", "--listen", "127.0.0.1:0", "--eager-size", "10"}, "--eager-size 10"},
		{[]string{"ps", "bench", "--split-size", "-2"}, "--split-size -2"},
		{[]string{"ps", "serve", "--listen", "127.0.0.1:0", "--split-size", "-3"}, "--split-size -3"},
		{[]string{"ps", "worker", "--addrs", "127.0.0.1:1", "--split-size", "-4"}, "--split-size -4"},
		{[]string{"perf", "bx_lat", "-n", "0"}, "-n 0: iterations must be 5.."},
		{[]string{"perf", "tcp_lat", "--iters", "-3"}, "-n -3"},
		{[]string{"perf", "bx_lat", "--resp-size", "-2"}, "--resp-size -2"},
		{[]string{"perf", "tcp_lat", "--resp-size", "-1"}, "--resp-size -1"},
		{[]string{"ps", "bench", "--transport", "tcp", "--workers", "-1"}, "--workers -1"},
		{[]string{"ps", "bench", "--transport", "tcp", "--worker-procs", "-2"}, "--worker-procs -2"},
		{[]string{"ps", "bench", "--transport", "tcp", "--duration", "-1s"}, "--duration -1s"},
		{[]string{"ps", "bench", "--transport", "tcp", "--duration", "0s"}, "--duration 0s"},
		{[]string{"ps", "bench", "--transport", "tcp", "--servers", "0"}, "--servers 0"},
		{[]string{"ps", "bench", "--transport", "tcp", "--servers", "1000"}, "--servers 1000"},
		{[]string{"ps", "serve", "--transport", "tcp", "--listen", "127.0.0.1:0", "--max-batch", "-1"}, "--max-batch -1"},
		{[]string{"ps", "serve", "--transport", "tcp", "--listen", "127.0.0.1:0", "--max-bytes", "0"}, "--max-bytes 0"},
		{[]string{"ps", "serve", "--transport", "tcp", "--listen", "127.0.0.1:0", "--max-bytes", "4G"}, "flag -max-bytes"},
		{[]string{"ps", "worker", "--transport", "tcp", "--addrs", "127.0.0.1:1", "--workers", "0"}, "--workers 0"},
		{[]string{"ps", "worker", "--transport", "tcp", "--addrs", "127.0.0.1:1", "--duration", "-1s"}, "--duration -1s"},
		{[]string{"ps", "worker", "--transport", "tcp"}, "--addrs is required"},
		{[]string{"top", "-n", "0"}, "-n 0"},
		{[]string{"devices", "-v", "-i", "-1"}, "-i -1: port must be 1..255"},
		{[]string{"nosuchcommand"}, "unknown command"},
	})
}

func TestGetoptStyle(t *testing.T) {
	// Clustered and attached short options, operands before options,
	// long options with =: all parse (and fail later for the bad MTU).
	for _, args := range [][]string{
		{"rc-pingpong", "-ce", "-m300"},
		{"rc-pingpong", "host", "-n10", "--mtu=300"},
		{"rc-pingpong", "--iters", "10", "-m", "300", "host"},
	} {
		r := goverbs(t, time.Minute, args...)
		if r.code != 1 || !(strings.Contains(r.stderr, "-m 300") || strings.Contains(r.stderr, "-e (sleep on CQ events)")) {
			t.Errorf("goverbs %q: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
}

func TestVersion(t *testing.T) {
	r := goverbs(t, time.Minute, "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "goverbs ") {
		t.Fatalf("version: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
}

func TestDevices(t *testing.T) {
	a, b := rxetest.Pair(t)
	r := goverbs(t, time.Minute, "devices")
	if r.code != 0 {
		t.Fatalf("devices: exit %d: %s", r.code, r.stderr)
	}
	t.Logf("\n%s", r.stdout)
	for _, name := range []string{a, b} {
		re := regexp.MustCompile(`(?m)^` + name + `\s+[0-9a-f]{16}\s+\S+\s+\S+\s+1:ACTIVE\b`)
		if !re.MatchString(r.stdout) {
			t.Errorf("devices: no ACTIVE row for %s", name)
		}
	}
	r = goverbs(t, time.Minute, "devices", "-d", b)
	if r.code != 0 || strings.Contains(r.stdout, a+" ") || !strings.Contains(r.stdout, b) {
		t.Errorf("devices -d %s: exit %d\n%s", b, r.code, r.stdout)
	}
}

func TestDevicesVerbose(t *testing.T) {
	a, _ := rxetest.Pair(t)
	info, err := uverbs.LookupWithoutGIDs(a)
	if err != nil {
		t.Fatal(err)
	}
	r := goverbs(t, time.Minute, "devices", "-v", "-d", a)
	if r.code != 0 {
		t.Fatalf("devices -v: exit %d: %s", r.code, r.stderr)
	}
	t.Logf("\n%s", r.stdout)
	want := []string{
		"hca_id:\t" + a + "\n",
		"\tnode_guid:\t\t\t" + info.NodeGUID + "\n", // QUERY_DEVICE's, byte order checked against sysfs
		"\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n",
		"\t\t\tlink_layer:\t\tEthernet\n",
		"\tmax_qp:\t\t\t\t",
		"\tatomic_cap:\t\t\t",
		"\t\t\tgid_tbl_len:\t\t",
	}
	for _, g := range info.Port(1).GIDs {
		var raw [16]byte
		copy(raw[:], g.GID.To16())
		want = append(want, fmt.Sprintf("\t\t\tGID[%3d]:\t\t%s, %s, %s\n", g.Index, ntop(raw), g.Type, g.Netdev))
	}
	if a == "rxe0" && info.Parent == "v0" { // the scripts/vm guest
		want = append(want, ":\t\t::ffff:10.99.0.1, RoCE v2, v0\n")
	}
	for _, w := range want {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("devices -v: missing %q", w)
		}
	}
}

// serverTarget is where clients reach the server device: the IPv4 address
// in its RoCE v2 GID (10.99.0.2 for rxe1 in the guest) and that GID's index.
func serverTarget(t *testing.T, dev string) (host string, gidx int) {
	t.Helper()
	ctx := rxetest.Open(t, dev)
	g, err := ctx.DefaultGID(1)
	if err != nil {
		t.Fatal(err)
	}
	if g.GID.To4() == nil {
		t.Skipf("%s has no IPv4 RoCE v2 GID to reach it by", dev)
	}
	return g.GID.To4().String(), g.Index
}

// waitListen waits until a TCP socket listens on port (read from
// /proc/net/tcp{,6}: connecting to probe would use up the server's only
// accept).
func waitListen(t *testing.T, port int, done <-chan struct{}) {
	t.Helper()
	hexPort := fmt.Sprintf(":%04X ", port)
	deadline := time.Now().Add(hang.Scale(60 * time.Second))
	for time.Now().Before(deadline) {
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			b, _ := os.ReadFile(f)
			sc := bufio.NewScanner(bytes.NewReader(b))
			for sc.Scan() {
				fields := strings.Fields(sc.Text())
				if len(fields) > 3 && strings.HasSuffix(fields[1]+" ", hexPort) && fields[3] == "0A" {
					return
				}
			}
		}
		select {
		case <-done:
			return // the server exited; its result tells why
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("nothing listens on port %d after 60 s", port)
}

// serverClient runs `goverbs srvArgs...` in the background, waits until
// something listens on TCP port (or the server exited), then runs
// `goverbs cliArgs...`; it returns both results once both exited. idle
// bounds each run, as in goverbs.
func serverClient(t *testing.T, idle time.Duration, port int, srvArgs, cliArgs []string) (client, server result) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		server = goverbs(t, idle, srvArgs...)
	}()
	waitListen(t, port, done)
	client = goverbs(t, idle, cliArgs...)
	<-done
	return client, server
}

var itersRE = regexp.MustCompile(`(?m)^(\d+) iters in ([0-9.]+) seconds = ([0-9.]+) usec/iter$`)
var bytesRE = regexp.MustCompile(`(?m)^(\d+) bytes in ([0-9.]+) seconds = ([0-9.]+) Mbit/sec$`)

func parseIters(t *testing.T, who, out string, iters, size int) float64 {
	t.Helper()
	m := itersRE.FindStringSubmatch(out)
	if m == nil {
		t.Errorf("%s: no iters line in %q", who, out)
		return 0
	}
	if n, _ := strconv.Atoi(m[1]); n != iters {
		t.Errorf("%s: %d iters, want %d", who, n, iters)
	}
	if b := bytesRE.FindStringSubmatch(out); b == nil || b[1] != strconv.Itoa(2*iters*size) {
		t.Errorf("%s: bytes line %q, want %d bytes", who, b, 2*iters*size)
	}
	if !strings.Contains(out, "  local address:  LID 0x") || !strings.Contains(out, "  remote address: LID 0x") {
		t.Errorf("%s: no address lines in %q", who, out)
	}
	us, _ := strconv.ParseFloat(m[3], 64)
	return us
}

var nextPort = 18600

func TestPingpongInterop(t *testing.T) {
	cli, srv := rxetest.Pair(t)
	host, gidx := serverTarget(t, srv)
	ibv := lookIbv(t, "ibv_rc_pingpong")
	const iters = 200
	g := strconv.Itoa(gidx)
	for _, pair := range []struct{ server, client string }{
		{"goverbs", "ibv"}, {"ibv", "goverbs"}, {"goverbs", "goverbs"},
	} {
		for _, size := range []int{64, 4096} {
			for _, chk := range []bool{false, true} {
				if chk && size == 64 {
					continue
				}
				name := fmt.Sprintf("%s-server/%s-client/s%d", pair.server, pair.client, size)
				if chk {
					name += "/chk"
				}
				t.Run(name, func(t *testing.T) {
					port := nextPort
					nextPort++
					common := []string{"-p", strconv.Itoa(port), "-n", strconv.Itoa(iters), "-s", strconv.Itoa(size), "-g", g}
					if chk {
						common = append(common, "-c")
					}
					start := func(who, dev string, extra ...string) (func() result, chan struct{}) {
						args := append(append([]string{"-d", dev}, common...), extra...)
						done := make(chan struct{})
						var r result
						var once sync.Once
						go func() {
							defer close(done)
							if who == "ibv" {
								r = runCmd(t, 3*time.Minute, ibv, nil, args...)
							} else {
								r = goverbs(t, 3*time.Minute, append([]string{"rc-pingpong"}, args...)...)
							}
						}()
						return func() result { once.Do(func() { <-done }); return r }, done
					}
					srvRes, srvDone := start(pair.server, srv)
					waitListen(t, port, srvDone)
					cliRes, _ := start(pair.client, cli, host)
					rc, rs := cliRes(), srvRes()
					for _, x := range []struct {
						who string
						r   result
					}{{pair.client + " client", rc}, {pair.server + " server", rs}} {
						if x.r.code != 0 || x.r.err != nil {
							t.Errorf("%s: exit %d (%v)\nstdout:\n%s\nstderr:\n%s", x.who, x.r.code, x.r.err, x.r.stdout, x.r.stderr)
							continue
						}
						if strings.Contains(x.r.stdout, "invalid data") {
							t.Errorf("%s: %s", x.who, x.r.stdout)
						}
						us := parseIters(t, x.who, x.r.stdout, iters, size)
						t.Logf("%s: %.2f usec/iter", x.who, us)
					}
				})
			}
		}
	}
}

func TestPingpongJSON(t *testing.T) {
	cli, srv := rxetest.Pair(t)
	host, gidx := serverTarget(t, srv)
	port := 18700
	rc, rs := serverClient(t, 3*time.Minute, port,
		[]string{"rc-pingpong", "-d", srv, "-g", strconv.Itoa(gidx), "-p", strconv.Itoa(port), "-n", "100", "-s", "128"},
		// No -g: goverbs picks the RoCE v2 IPv4 GID itself.
		[]string{"rc-pingpong", "-d", cli, "-p", strconv.Itoa(port), "-n", "100", "-s", "128", "--json", host})
	if rs.code != 0 || rc.code != 0 {
		t.Fatalf("server exit %d: %s\nclient exit %d: %s", rs.code, rs.stderr, rc.code, rc.stderr)
	}
	var out struct {
		Bytes       int64   `json:"bytes"`
		Seconds     float64 `json:"seconds"`
		MbitPerS    float64 `json:"mbit_per_s"`
		Iters       int     `json:"iters"`
		USecPerIter float64 `json:"usec_per_iter"`
	}
	dec := json.NewDecoder(strings.NewReader(rc.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		t.Fatalf("client stdout %q: %v", rc.stdout, err)
	}
	if out.Bytes != 2*100*128 || out.Iters != 100 || out.Seconds <= 0 || out.USecPerIter <= 0 || out.MbitPerS <= 0 {
		t.Errorf("json %+v", out)
	}
	if !strings.Contains(rc.stderr, "  local address:") || !strings.Contains(rc.stderr, "using GID index") {
		t.Errorf("client stderr %q: want the address lines and the GID choice", rc.stderr)
	}
}
