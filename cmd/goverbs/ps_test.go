package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/hist"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/ps"
)

// TestPSBench runs the bench end to end (servers and workers as child
// processes) for each transport this machine has, and the report on its
// output.
func TestPSBench(t *testing.T) {
	transports := []string{"tcp"}
	if len(rxetest.Active(t)) >= 2 {
		transports = append(transports, "rdma")
	}
	dir := t.TempDir()
	var files []string
	for _, tr := range transports {
		for _, wl := range []string{"inference", "training", "incast"} {
			r := goverbs(t, 90*time.Second, "ps", "bench", "--transport", tr, "--workload", wl, "--workers", "2", "--duration", "1s", "--json")
			if r.code != 0 {
				t.Fatalf("%s %s: exit %d: %s %s", tr, wl, r.code, r.stdout, r.stderr)
			}
			var res benchResult
			if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
				t.Fatalf("%s %s: %v: %q", tr, wl, err, r.stdout)
			}
			if res.Transport != tr || res.Workload != wl || len(res.Ops) == 0 || res.Errors != 0 {
				t.Fatalf("%s %s: %+v", tr, wl, res)
			}
			for _, o := range res.Ops {
				if o.Count == 0 || o.Mean <= 0 || o.P50 > o.P99 || o.P99 > o.P999 || o.OpsPerSec <= 0 || o.CPUPerKop <= 0 {
					t.Errorf("%s %s %s: %+v", tr, wl, o.Op, o)
				}
			}
			if tr == "rdma" && (res.RNR == nil || *res.RNR != 0) {
				t.Errorf("rdma %s: RNR NAK retries %v", wl, res.RNR)
			}
			if res.Achieved <= 0 || res.Offered != 0 {
				t.Errorf("%s %s: closed loop: achieved %v steps/s, offered %v", tr, wl, res.Achieved, res.Offered)
			}
			if tr == "rdma" && (res.MTU < 576 || res.IBMTU < 256 || res.IBMTU > res.MTU) {
				t.Errorf("rdma %s: link MTU %d, IB MTU %d", wl, res.MTU, res.IBMTU)
			}
			f := filepath.Join(dir, tr+"-"+wl+".json")
			os.WriteFile(f, []byte(r.stdout), 0o644)
			files = append(files, f)
		}
	}
	r := goverbs(t, 60*time.Second, append([]string{"ps", "report", "--plots", dir}, files...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "inference") {
		t.Fatalf("report: %d %s %s", r.code, r.stdout, r.stderr)
	}
	for _, p := range []string{"p99.png", "cdf-inference*.png", "cdf-incast*.png"} {
		m, _ := filepath.Glob(filepath.Join(dir, p))
		if len(m) != 1 {
			t.Errorf("plot %s: %v", p, m)
			continue
		}
		if st, err := os.Stat(m[0]); err != nil || st.Size() < 1000 {
			t.Errorf("plot %s: %v", m[0], err)
		}
	}
}

// psResult is a bench result of n operations of op, all lat long, with
// cpu seconds in all: what ps bench --json prints.
func psResult(tr, wl, op string, mtu int, offered, achieved float64, lat time.Duration, cpu float64) benchResult {
	const n = 200
	h := hist.NewFine()
	for range n {
		h.Add(lat)
	}
	rnr := uint64(0)
	r := benchResult{Transport: tr, Workload: wl, Workers: 4, Servers: 2, WorkerProcs: 1, Duration: 2, CPU: cpu, MTU: mtu, Offered: offered, Achieved: achieved,
		Ops: []benchOp{{Op: op, Count: n, Mean: h.Mean() / 1e3, P50: h.Quantile(0.5) / 1e3, P99: h.Quantile(0.99) / 1e3, P999: h.Quantile(0.999) / 1e3,
			OpsPerSec: n / 2, CPUPerKop: cpu / (n / 1000.0), Hist: h.Buckets()}}}
	if tr == "rdma" {
		r.RNR = &rnr
	}
	return r
}

// TestPSReportPaper: ps report's paper table reads the ratios rdma/tcp
// against the paper's goals, takes the open-loop rate nearest half the
// lower closed-loop throughput, prints the bare round trips, and plots
// latency against offered load.
func TestPSReportPaper(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	enc := json.NewEncoder(f)
	us := time.Microsecond
	for _, r := range []benchResult{
		// closed loop: rdma half tcp's latency, the same CPU per op;
		// knee = min(100, 200) = 100 steps/s, so the table's open loop is 45.
		psResult("rdma", "inference", "pull", 9000, 0, 100, 300*us, 1),
		psResult("tcp", "inference", "pull", 9000, 0, 200, 600*us, 1),
		psResult("rdma", "inference", "pull", 9000, 20, 20, 100*us, 1),
		psResult("tcp", "inference", "pull", 9000, 20, 20, 100*us, 1),
		psResult("rdma", "inference", "pull", 9000, 45, 45, 200*us, 0.5),
		psResult("tcp", "inference", "pull", 9000, 45, 45, 1000*us, 1),
		psResult("rdma", "inference", "pull", 9000, 90, 90, 5000*us, 1),
		psResult("tcp", "inference", "pull", 9000, 90, 90, 1000*us, 1),
		psResult("rdma", "incast", "push", 9000, 0, 50, 5000*us, 1),
		psResult("tcp", "incast", "push", 9000, 0, 60, 10000*us, 1),
	} {
		enc.Encode(r)
	}
	for _, l := range []rttLine{
		{&rttResult{Workload: "inference", MTU: 9000, Req: 271, Resp: 4116, Verbs: 100, BX: 150, TCP: 200}},
		{&rttResult{Workload: "inference", MTU: 9000, Req: 271, Resp: 4116, Verbs: 120, BX: 170, TCP: 200}},
		{&rttResult{Workload: "inference", MTU: 9000, Req: 271, Resp: 4116, Verbs: 900, BX: 900, TCP: 200}},
	} {
		enc.Encode(l)
	}
	f.Close()
	r := goverbs(t, 60*time.Second, "ps", "report", "--plots", dir, f.Name())
	if r.code != 0 {
		t.Fatalf("report: exit %d: %s %s", r.code, r.stdout, r.stderr)
	}
	line := func(prefix string) string {
		for _, l := range strings.Split(r.stdout, "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), prefix) {
				return l
			}
		}
		t.Errorf("no line %q in\n%s", prefix, r.stdout)
		return ""
	}
	for _, c := range []struct{ prefix, want string }{
		{"paper table, link MTU 9000", "(rxe active_mtu -, servers 2, worker processes 1)"},
		{"figure", "open loop (inference 45, incast 0 steps/s)"},
		{"inference pull mean", "0.500 MET (300/600)"},
		{"inference pull mean", "0.200 MET (200/1000)"},
		{"inference pull P99", "0.500 MET"},
		{"inference CPU per op", "1.000 no"},
		{"inference CPU per op", "0.500 MET"},
		{"incast push P99", "0.500 no"},
		{"RNR NAK retries", "0 MET (all 5 rdma runs"},
		{"knee", "inference 100, incast 50"},
		{"inference    271 -> 4116", "verbs    120.0  bx    170.0  tcp    200.0  verbs/tcp 0.600"},
		{"inference    271 -> 4116", "closed-loop pull mean rdma/tcp 0.500 MET"},
	} {
		if l := line(c.prefix); !strings.Contains(l, c.want) {
			t.Errorf("%q line %q: want %q", c.prefix, l, c.want)
		}
	}
	for _, p := range []string{"cdf-inference-mtu9000.png", "load-inference-mtu9000.png", "cdf-incast-mtu9000.png", "p99.png"} {
		if st, err := os.Stat(filepath.Join(dir, p)); err != nil || st.Size() < 1000 {
			t.Errorf("plot %s: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "load-incast-mtu9000.png")); err == nil {
		t.Errorf("load-incast-mtu9000.png without open-loop incast runs")
	}
}

func TestPSUsage(t *testing.T) {
	for _, args := range [][]string{{"ps"}, {"ps", "nope"}, {"ps", "bench", "--transport", "udp"}, {"ps", "bench", "--workload", "x"}, {"ps", "serve"}} {
		if r := goverbs(t, 20*time.Second, args...); r.code != 1 {
			t.Errorf("%v: exit %d, want 1: %s", args, r.code, r.stderr)
		}
	}
}

// The open loop's schedule: every arrival before the end is counted once,
// either taken (and started) or late, whatever the point where the
// workers stop taking; the gaps average 1/rate.
func TestPSArrivals(t *testing.T) {
	t0 := time.Unix(1000, 0)
	end := t0.Add(10 * time.Second)
	mk := func() *arrivals {
		return &arrivals{next: t0, end: end, rate: 500, rng: mrand.New(mrand.NewPCG(7, 1))}
	}
	// All arrivals before end, from the same sequence.
	var want int64
	for a := mk(); a.take().Before(end); {
		want++
	}
	if want < 4500 || want > 5500 {
		t.Fatalf("%d arrivals in 10 s at 500/s", want)
	}
	for _, stopAfter := range []int64{0, 1, want / 2, want - 1, want, want + 1} {
		a := mk()
		var taken int64
		for taken < stopAfter {
			taken++
			if !a.take().Before(end) {
				break
			}
		}
		steps, late := a.count()
		started := min(stopAfter, want)
		if steps != want || late != want-started {
			t.Errorf("workers stopped after %d takes: steps %d late %d, want %d and %d", stopAfter, steps, late, want, want-started)
		}
	}
}

// TestPSBenchOpenLoop: --rates runs the workers once per rate with the
// servers up, one JSON line each with the offered and achieved rates; a
// rate far above what any machine serves leaves arrivals late and its
// latency (counted from the schedule) above the light rate's.
func TestPSBenchOpenLoop(t *testing.T) {
	transports := []string{"tcp"}
	if len(rxetest.Active(t)) >= 2 {
		transports = append(transports, "rdma")
	}
	for _, tr := range transports {
		r := goverbs(t, 90*time.Second, "ps", "bench", "--transport", tr, "--workload", "inference", "--workers", "2",
			"--duration", "2s", "--rates", "20,1e7", "--json")
		if r.code != 0 {
			t.Fatalf("%s: exit %d: %s %s", tr, r.code, r.stdout, r.stderr)
		}
		var rs []benchResult
		dec := json.NewDecoder(strings.NewReader(r.stdout))
		for dec.More() {
			var res benchResult
			if err := dec.Decode(&res); err != nil {
				t.Fatalf("%s: %v: %q", tr, err, r.stdout)
			}
			rs = append(rs, res)
		}
		if len(rs) != 2 || rs[0].Offered != 20 || rs[1].Offered != 1e7 {
			t.Fatalf("%s: want two results offered 20 and 1e7 steps/s: %+v", tr, rs)
		}
		light, heavy := rs[0], rs[1]
		if light.Errors != 0 || heavy.Errors != 0 || light.Achieved <= 0 || light.Achieved > 100 || len(light.Ops) == 0 || len(heavy.Ops) == 0 {
			t.Errorf("%s: light %+v heavy %+v", tr, light, heavy)
		}
		if heavy.Late == 0 || heavy.Achieved >= heavy.Offered {
			t.Errorf("%s: 1e7 steps/s offered: achieved %.0f, late %d; want arrivals left late", tr, heavy.Achieved, heavy.Late)
		}
		if heavy.Ops[0].P50 <= light.Ops[0].P50 {
			t.Errorf("%s: pull p50 %.1f us overloaded, %.1f us at 20 steps/s: queueing not counted", tr, heavy.Ops[0].P50, light.Ops[0].P50)
		}
		t.Logf("%s: 20/s: achieved %.1f, pull p50 %.0f us; 1e7/s: achieved %.0f, late %d, pull p50 %.0f us", tr,
			light.Achieved, light.Ops[0].P50, heavy.Achieved, heavy.Late, heavy.Ops[0].P50)
	}
	if r := goverbs(t, 20*time.Second, "ps", "bench", "--transport", "tcp", "--rates", "10,x"); r.code != 1 || !strings.Contains(r.stderr, `"x" is not a rate`) {
		t.Errorf("--rates 10,x: exit %d: %s", r.code, r.stderr)
	}
	if r := goverbs(t, 20*time.Second, "ps", "bench", "--transport", "tcp", "--rate", "-5"); r.code != 1 || !strings.Contains(r.stderr, "--rate") {
		t.Errorf("--rate -5: exit %d: %s", r.code, r.stderr)
	}
}

// TestPSBenchDepth: --depth keeps several pulls outstanding per worker
// (ps.Client.PullAsync); it is refused where it has no meaning.
func TestPSBenchDepth(t *testing.T) {
	transports := []string{"tcp"}
	if len(rxetest.Active(t)) >= 2 {
		transports = append(transports, "rdma")
	}
	for _, tr := range transports {
		r := goverbs(t, 90*time.Second, "ps", "bench", "--transport", tr, "--workload", "pull", "--servers", "1", "--depth", "4", "--duration", "1s", "--json")
		if r.code != 0 {
			t.Fatalf("%s: exit %d: %s %s", tr, r.code, r.stdout, r.stderr)
		}
		var res benchResult
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
			t.Fatalf("%s: %v: %q", tr, err, r.stdout)
		}
		if res.Depth != 4 || res.Workload != "pull" || res.Errors != 0 || len(res.Ops) != 1 || res.Ops[0].Op != "pull" || res.Ops[0].Count == 0 {
			t.Errorf("%s: %+v", tr, res)
		}
	}
	for _, args := range [][]string{
		{"--workload", "inference", "--depth", "2"},
		{"--workload", "pull", "--depth", "2", "--rate", "100"},
		{"--workload", "pull", "--depth", "0"},
	} {
		r := goverbs(t, 30*time.Second, append([]string{"ps", "bench", "--transport", "tcp"}, args...)...)
		if r.code == 0 || !strings.Contains(r.stderr, "--depth") {
			t.Errorf("%v: exit %d, stderr %q; want a usage error about --depth", args, r.code, r.stderr)
		}
	}
}

// TestPSBenchEagerSize: --eager-size and --split-size reach the servers,
// the workers and the bench's own control client alike (bx refuses a peer
// of another EagerSize; a child that did not take a flag would exit with
// a usage error), so an incast of 64 KiB pushes runs with them sent
// eagerly, split (bx's default) or by rendezvous.
func TestPSBenchEagerSize(t *testing.T) {
	if len(rxetest.Active(t)) < 2 {
		t.Skip("rdma ps bench needs two active RDMA devices")
	}
	for _, flags := range [][]string{{"--eager-size", "131024"}, {"--split-size", "-1"}} {
		args := append([]string{"ps", "bench", "--transport", "rdma", "--workload", "incast", "--servers", "1", "--workers", "2",
			"--duration", "1s", "--json"}, flags...)
		r := goverbs(t, 90*time.Second, args...)
		if r.code != 0 {
			t.Fatalf("%v: exit %d: %s %s", flags, r.code, r.stdout, r.stderr)
		}
		var res benchResult
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
			t.Fatalf("%v: %v: %q", flags, err, r.stdout)
		}
		if res.Errors != 0 || len(res.Ops) != 1 || res.Ops[0].Op != "push" || res.Ops[0].Count == 0 {
			t.Errorf("%v: %+v", flags, res)
		}
	}
}

// TestPSBenchPollers: in `ps bench` only the servers and workers may poll
// their CQs. The bench's own control client (Define, the servers' CPU)
// must not register as a poller: with one server and one worker process
// on a two-CPU machine a third registered process would push every
// endpoint to events (bx/pollers.go), and the rdma pull would measure
// event wake-ups instead of the polling path (it did: ps/bare 4.0 at p50).
func TestPSBenchPollers(t *testing.T) {
	if len(rxetest.Active(t)) < 2 {
		t.Skip("rdma ps bench needs two active RDMA devices")
	}
	base := t.TempDir()
	t.Setenv("GOVERBS_POLLERS_DIR", base) // the children inherit it
	reg := filepath.Join(base, fmt.Sprintf("goverbs-pollers-%d", os.Getuid()))
	stop := make(chan struct{})
	most := make(chan int, 1)
	go func() {
		n := 0
		for {
			if ents, err := os.ReadDir(reg); err == nil {
				n = max(n, len(ents))
			}
			select {
			case <-stop:
				most <- n
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	r := goverbs(t, 90*time.Second, "ps", "bench", "--transport", "rdma", "--workload", "pull", "--servers", "1", "--duration", "2s", "--json")
	close(stop)
	n := <-most
	if r.code != 0 {
		t.Fatalf("exit %d: %s %s", r.code, r.stdout, r.stderr)
	}
	// The server and the worker register; nothing else of the bench does.
	if n != 2 {
		t.Errorf("%d processes registered as pollers during ps bench --servers 1, want 2 (the server and the worker)", n)
	}
}

// TestPSServeMaxBytes: `ps serve --max-bytes` bounds the shard's parameter
// storage (ps StoreConfig.MaxBytes): a define over it is refused with
// ErrTooLarge naming the limit, one under it works. Over tcp, on the host.
func TestPSServeMaxBytes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(time.Minute)) // a hang bound
	defer cancel()
	var hello struct{ Addr string }
	startServe(t, ctx, os.Stderr, &hello, "--transport", "tcp", "--listen", "127.0.0.1:0", "--max-bytes", "65536")
	c, err := ps.Dial(ps.ClientConfig{Transport: "tcp", Servers: []string{hello.Addr}, Token: psToken()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	big := ps.Spec{Name: "big", Kind: ps.Dense, Size: 1 << 15, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.1}} // 128 KiB of values
	if err := c.Define(ctx, big); !errors.Is(err, ps.ErrTooLarge) || !strings.Contains(err.Error(), "64 KiB") {
		t.Errorf("define of 128 KiB under --max-bytes 65536: %v, want ErrTooLarge naming 64 KiB", err)
	}
	small := ps.Spec{Name: "small", Kind: ps.Dense, Size: 1 << 10, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.1}}
	if err := c.Define(ctx, small); err != nil {
		t.Errorf("define of 4 KiB under --max-bytes 65536: %v", err)
	}
}
