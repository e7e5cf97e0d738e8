package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/metrics"
	"github.com/goverbs/goverbs/ps"
)

func TestTopHistQuantiles(t *testing.T) {
	const b = `goverbs_x_seconds_bucket{device="rxe0",le="%s"}`
	bk := func(le string) string { return strings.Replace(b, "%s", le, 1) }
	prev := map[string]float64{bk("0.001"): 10, bk("0.002"): 10, bk("0.004"): 10, bk("+Inf"): 10,
		`goverbs_x_seconds_count{device="rxe0"}`: 10, `goverbs_y_total{a="1"}`: 100}
	cur := map[string]float64{bk("0.001"): 10, bk("0.002"): 60, bk("0.004"): 110, bk("+Inf"): 110,
		`goverbs_x_seconds_count{device="rxe0"}`: 110, `goverbs_y_total{a="1"}`: 300, `goverbs_g{a="1"}`: 5,
		// A histogram without observations in the interval gets no
		// quantiles; one whose observations are all above the last bound
		// gets that bound.
		`goverbs_idle_seconds_bucket{le="1"}`: 3, `goverbs_idle_seconds_bucket{le="+Inf"}`: 3,
		`goverbs_slow_seconds_bucket{le="1"}`: 0, `goverbs_slow_seconds_bucket{le="+Inf"}`: 4}
	prev[`goverbs_idle_seconds_bucket{le="1"}`], prev[`goverbs_idle_seconds_bucket{le="+Inf"}`] = 3, 3
	got := map[string]topMetric{}
	for _, m := range topMetrics(prev, cur, 2) {
		got[m.Name] = m
	}
	// 100 observations in the interval: 50 in (1ms, 2ms], 50 in (2ms, 4ms].
	for name, want := range map[string]float64{
		`goverbs_x_seconds_p50{device="rxe0"}`: 0.002,
		`goverbs_x_seconds_p99{device="rxe0"}`: 0.002 + 0.002*49/50,
		`goverbs_slow_seconds_p50{}`:           1,
	} {
		if m, ok := got[name]; !ok || math.Abs(m.Value-want) > 1e-12 {
			t.Errorf("%s = %+v (present %v), want %v", name, m, ok, want)
		}
	}
	if m := got[`goverbs_x_seconds_count{device="rxe0"}`]; m.PerS != 50 {
		t.Errorf("count rate %+v, want 50/s", m)
	}
	if m := got[`goverbs_y_total{a="1"}`]; m.PerS != 100 || m.Value != 300 {
		t.Errorf("counter %+v, want 300 at 100/s", m)
	}
	if m := got[`goverbs_g{a="1"}`]; m.PerS != 0 || m.Value != 5 {
		t.Errorf("gauge %+v", m)
	}
	for name := range got {
		if strings.Contains(name, "_bucket") || strings.HasPrefix(name, "goverbs_idle_seconds_p") {
			t.Errorf("listed %s", name)
		}
	}
	if l := splitLabels(`a="x,y",b="\"q,",c="z"`); len(l) != 3 || l[1] != `b="\"q,"` {
		t.Errorf("splitLabels: %q", l)
	}
}

type fakeSnap struct{ s bx.Snapshot }

func (f fakeSnap) Snapshot() bx.Snapshot { return f.s }

// TestTopScrape: what package metrics serves is what top lists.
func TestTopScrape(t *testing.T) {
	var h bx.Histogram
	h.Buckets[5], h.Count, h.Sum = 3, 3, 90*time.Microsecond // (16.384, 32.768] us
	c := metrics.NewCollector()
	if err := c.AddBX(fakeSnap{bx.Snapshot{Device: "rxe0", Counters: bx.Counters{Sent: 17},
		Classes: []bx.ClassSnapshot{{Class: "7", Latency: h}}}}); err != nil {
		t.Fatal(err)
	}
	reg, err := metrics.NewRegistry(c)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop, err := metrics.ServeListener(ln, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	sctx, cancel := context.WithTimeout(context.Background(), hang.Scale(time.Minute)) // a hang bound
	defer cancel()
	m, err := topScrapeCtx(sctx, "http://"+ln.Addr().String()+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if v := m[`goverbs_bx_messages_sent_total{device="rxe0"}`]; v != 17 {
		t.Errorf("sent %v", v)
	}
	if v := m[`goverbs_bx_rpc_latency_seconds_count{device="rxe0",stream_class="7"}`]; v != 3 {
		t.Errorf("count %v", v)
	}
	for k := range m {
		if !strings.HasPrefix(k, "goverbs_") {
			t.Errorf("scraped %s", k)
		}
	}
	list := topMetrics(nil, m, 1)
	var p50 float64
	for _, x := range list {
		if x.Name == `goverbs_bx_rpc_latency_seconds_p50{device="rxe0",stream_class="7"}` {
			p50 = x.Value
		}
	}
	if p50 <= 16.384e-6 || p50 > 32.768e-6 {
		t.Errorf("p50 %v, want in (16.384, 32.768] us", p50)
	}
}

func TestPSMetricsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"ps", "serve", "--transport", "tcp", "--listen", "127.0.0.1:0", "--metrics", "nocolon"},
		{"ps", "bench", "--transport", "tcp", "--metrics", "nocolon"},
	} {
		if r := goverbs(t, time.Minute, args...); r.code != 1 || !strings.Contains(r.stderr, "--metrics") {
			t.Errorf("%q: exit %d, want 1 with a --metrics message (%s)", args, r.code, r.stderr)
		}
	}
}

// TestPSServeMetrics: `ps serve --metrics` serves the server's bx and ps
// metrics; N pulls over rdma show as N pull requests, at least N bx
// messages received, and, through `goverbs top --once --json --metrics`,
// with a rate and latency quantiles of the interval.
func TestPSServeMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(3*time.Minute)) // a hang bound
	defer cancel()
	var srvErr strings.Builder
	sv := startPSServe(t, ctx, &srvErr, "--metrics", "127.0.0.1:0")
	if sv.hello.Metrics == "" {
		t.Fatalf("hello without a metrics address: %+v (%s)", sv.hello, srvErr.String())
	}
	c, srvDev, hello := sv.c, sv.srvDev, sv.hello
	const n = 200
	row := make([]float32, 8)
	pulls := func() {
		for i := range n {
			if err := c.Pull(ctx, "emb", []uint64{uint64(i)}, row); err != nil {
				t.Fatal(err)
			}
		}
	}
	pulls()
	m, err := topScrapeCtx(ctx, hello.Metrics) // the test's hang bound, not top's 2 s
	if err != nil {
		t.Fatal(err)
	}
	reqs := `goverbs_ps_server_requests_total{op="pull",transport="rdma"}`
	recv := `goverbs_bx_messages_received_total{device="` + srvDev + `"}`
	if m[reqs] != n || m[recv] < n+1 || m[`goverbs_bx_peers{device="`+srvDev+`"}`] != 1 {
		t.Errorf("after %d pulls: %s = %v, %s = %v, peers %v", n, reqs, m[reqs], recv, m[recv], m[`goverbs_bx_peers{device="`+srvDev+`"}`])
	}
	if v := m[`goverbs_bx_allocator_in_use_bytes{device="`+srvDev+`",pool="eager"}`]; v <= 0 {
		t.Errorf("eager pool in use %v", v)
	}

	if os.Geteuid() != 0 {
		t.Skip("goverbs top needs root")
	}
	top := exec.CommandContext(ctx, goverbsBin, "top", "--once", "--interval", "4s", "--json", "--metrics", hello.Metrics)
	top.Env = append(os.Environ(), goverbsEnv...)
	var topOut strings.Builder
	top.Stdout = &topOut
	errPipe, err := top.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := top.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(errPipe)
	var topErr strings.Builder
	for sc.Scan() {
		topErr.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "sampling for") {
			break
		}
	}
	go func() {
		for sc.Scan() {
		}
	}()
	// Pull until top is done: its first scrape comes after it says it is
	// sampling, and a fixed batch of pulls (a few ms with ps's hot path)
	// can finish before it.
	stop := make(chan struct{})
	pulled := make(chan int)
	go func() {
		k := 0
		for {
			select {
			case <-stop:
				pulled <- k
				return
			default:
			}
			if err := c.Pull(ctx, "emb", []uint64{uint64(k % n)}, row); err != nil {
				t.Error(err)
				pulled <- k
				return
			}
			k++
		}
	}()
	werr := top.Wait()
	close(stop)
	during := <-pulled
	if werr != nil {
		t.Fatalf("top: %v: %s", werr, topErr.String())
	}
	var r struct {
		Metrics      []topMetric `json:"metrics"`
		MetricsError string      `json:"metrics_error"`
	}
	if err := json.Unmarshal([]byte(topOut.String()), &r); err != nil {
		t.Fatalf("%v: %s", err, topOut.String())
	}
	got := map[string]topMetric{}
	for _, x := range r.Metrics {
		got[x.Name] = x
	}
	if v := got[reqs].Value; r.MetricsError != "" || v <= n || v > float64(n+during) || got[reqs].PerS <= 0 {
		t.Errorf("top: %s = %+v (error %q), want more than %d, at most %d, with a rate", reqs, got[reqs], r.MetricsError, n, n+during)
	}
	if p50 := got[`goverbs_ps_server_latency_seconds_p50{op="pull",transport="rdma"}`]; p50.Value <= 0 {
		t.Errorf("top: no pull latency p50 (%+v)", p50)
	}
	for name := range got {
		if strings.Contains(name, "_bucket") {
			t.Errorf("top lists %s", name)
		}
	}
	t.Logf("top listed %d metrics; pulls %+v", len(r.Metrics), got[reqs])
}

// TestPSServeStateDump: SIGUSR1 makes `goverbs ps serve` write bx's
// flow-control state (its endpoint and the connected peer) and its
// goroutines' stacks to stderr and go on serving (scripts/ps-cluster sends
// it to a process past its hang bound).
func TestPSServeStateDump(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(2*time.Minute)) // a hang bound
	defer cancel()
	errR, errW := io.Pipe()
	sv := startPSServe(t, ctx, errW)
	t.Cleanup(func() { errR.Close() }) // first: the server's exit never blocks on its stderr
	srv, c := sv.cmd, sv.c
	if err := srv.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	var dump strings.Builder
	sc := bufio.NewScanner(errR)
	for sc.Scan() {
		dump.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "end of goverbs ps serve") && strings.Contains(sc.Text(), "SIGUSR1: bx state") {
			break
		}
	}
	d := dump.String()
	for _, want := range []string{"SIGUSR1: goroutines", "SIGUSR1: bx state", "bx endpoint", "  peer ", "lane 0 live true", "goroutine ", "main.psServe"} {
		if !strings.Contains(d, want) {
			t.Errorf("the dump lacks %q:\n%s", want, d)
		}
	}
	// It goes on serving.
	row := make([]float32, 8)
	if err := c.Pull(ctx, "emb", []uint64{1}, row); err != nil {
		t.Fatalf("pull after the dump: %v", err)
	}
	go io.Copy(io.Discard, errR)
	srv.Process.Signal(os.Interrupt)
	if err := srv.Wait(); err != nil {
		t.Errorf("serve after SIGINT: %v", err)
	}
}

// testServe is a `goverbs ps serve --transport rdma` of a test and a ps
// client connected to it, with the "emb" tensor (8 wide, 1000 rows)
// defined.
type testServe struct {
	cmd    *exec.Cmd
	hello  struct{ Addr, Metrics string }
	c      *ps.Client
	srvDev string
}

// startServe starts `goverbs ps serve` with args, its stderr to w, reads
// its hello line into hello, and interrupts and waits for it at the
// test's end.
func startServe(t *testing.T, ctx context.Context, w io.Writer, hello any, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(ctx, goverbsBin, append([]string{"ps", "serve"}, args...)...)
	cmd.Env = append(os.Environ(), goverbsEnv...)
	cmd.Stderr = w
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadBytes('\n'); err != nil || json.Unmarshal(line, hello) != nil {
		t.Fatalf("hello %q %v", line, err)
	}
	return cmd
}

// startPSServe starts the server on the second device of the rxe pair
// (extra flags in args, its stderr to w), reads its hello and dials it
// from the first. The test's end closes the client, interrupts the server
// and waits for it.
func startPSServe(t *testing.T, ctx context.Context, w io.Writer, args ...string) *testServe {
	t.Helper()
	cliDev, srvDev := rxetest.Pair(t)
	devs, err := ps.ActiveDevices()
	if err != nil || len(devs) < 2 {
		t.Fatalf("active devices %v %v", devs, err)
	}
	sv := &testServe{srvDev: srvDev}
	sv.cmd = startServe(t, ctx, w, &sv.hello, append([]string{"--transport", "rdma", "--listen", devs[1].IP.String() + ":0", "--device", srvDev}, args...)...)
	if sv.c, err = ps.Dial(ps.ClientConfig{Transport: "rdma", Servers: []string{sv.hello.Addr}, Device: cliDev, Token: psToken()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sv.c.Close() })
	emb := ps.Spec{Name: "emb", Kind: ps.Sparse, Dim: 8, Rows: 1000, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.1}, Seed: 1}
	if err := sv.c.Define(ctx, emb); err != nil {
		t.Fatal(err)
	}
	return sv
}
