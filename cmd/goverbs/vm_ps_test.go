package main

import (
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/ps"
)

// The parameter server across three guests: servers on node1 and node2
// (each its own rxe0 and address), the workers on node0, over rdma and over
// tcp (scripts/ps-cluster does the running). The NIC counters of every node
// must show at least the payload the reported operations carried, and what
// nodes 1 and 2 received node0 must have sent (and back): the traffic
// crossed the virtual network, not a loopback path.
//
// Workloads: inference (small sparse pulls, eager messages only) and
// training (16 and 256 KiB dense tensors through bx's rendezvous path: RTS,
// CTS, RDMA WRITE, FIN).
func TestVMClusterPS(t *testing.T) {
	needGuests(t)
	t.Parallel()
	script, err := filepath.Abs("../../scripts/ps-cluster")
	if err != nil {
		t.Fatal(err)
	}
	workloads := []string{"inference", "training"}
	transports := []string{"rdma", "tcp"}
	const nodes = 3
	t0 := time.Now()
	r := vmRun(t, 10*time.Minute, nil, "--nodes", strconv.Itoa(nodes), "--timeout", strconv.Itoa(int(hang.Scale(540*time.Second).Seconds())), "--verbose", "--",
		"bash", script, "-t", strings.Join(transports, ","), "-w", strings.Join(workloads, ","), "-d", "3s")
	took := time.Since(t0)
	if r.code != 0 || !strings.Contains(r.stdout, "ps-cluster: done") {
		t.Errorf("exit %d\n%s\n%s", r.code, r.stdout, psClusterStderr(r.stderr))
	}
	runs, err := parsePSCluster(r.stdout, nodes)
	if err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	for _, w := range workloads {
		for _, tr := range transports {
			run := runs[tr+" "+w]
			if run == nil {
				t.Errorf("%s %s: no result in the output", tr, w)
				continue
			}
			sum, problems := checkPSCluster(run, nodes)
			t.Logf("%s", sum)
			for _, p := range problems {
				t.Errorf("%s %s: %s", tr, w, p)
			}
		}
	}
	t.Logf("3 guests, %d bench runs: %v in all (%s)", len(runs), took.Round(time.Second), timingLine(r.stderr))
}

// psClusterStderr drops the guests' kernel consoles (--verbose) from
// stderr.
func psClusterStderr(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.Contains(l, " console] ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func timingLine(stderr string) string {
	for _, l := range strings.Split(stderr, "\n") {
		if strings.Contains(l, "node(s)") {
			return strings.TrimSpace(l)
		}
	}
	return "no timing line"
}

// psClusterRun is one bench run of scripts/ps-cluster.
type psClusterRun struct {
	transport, workload string
	rc, secs            int
	res                 benchResult
	rx, tx              []int64 // per node, bytes during the bench
	dropped             int64   // frames the switch dropped during the bench
	dev                 []string
}

var (
	psClusterCounters = regexp.MustCompile(`^ps-cluster: (\S+) (\S+) node(\d+) (\S+) \S+ rx \+(\d+) tx \+(\d+)$`)
	psClusterBench    = regexp.MustCompile(`^ps-cluster: (\S+) (\S+) bench rc=(\d+) (\d+)s (.*)$`)
	psClusterDropped  = regexp.MustCompile(`^ps-cluster: (\S+) (\S+) switch dropped \+(\d+) frames$`)
)

// parsePSCluster reads scripts/ps-cluster's output: runs by
// "TRANSPORT WORKLOAD".
func parsePSCluster(out string, nodes int) (map[string]*psClusterRun, error) {
	runs := map[string]*psClusterRun{}
	get := func(tr, w string) *psClusterRun {
		k := tr + " " + w
		if runs[k] == nil {
			runs[k] = &psClusterRun{transport: tr, workload: w, rc: -1, rx: make([]int64, nodes), tx: make([]int64, nodes), dev: make([]string, nodes)}
			for i := range nodes {
				runs[k].rx[i], runs[k].tx[i] = -1, -1
			}
		}
		return runs[k]
	}
	for _, l := range strings.Split(out, "\n") {
		if m := psClusterCounters.FindStringSubmatch(l); m != nil {
			r := get(m[1], m[2])
			i, _ := strconv.Atoi(m[3])
			if i >= nodes {
				return nil, fmt.Errorf("counters of node%d in a %d-node cluster", i, nodes)
			}
			r.dev[i] = m[4]
			r.rx[i], _ = strconv.ParseInt(m[5], 10, 64)
			r.tx[i], _ = strconv.ParseInt(m[6], 10, 64)
		} else if m := psClusterDropped.FindStringSubmatch(l); m != nil {
			get(m[1], m[2]).dropped, _ = strconv.ParseInt(m[3], 10, 64)
		} else if m := psClusterBench.FindStringSubmatch(l); m != nil {
			r := get(m[1], m[2])
			r.rc, _ = strconv.Atoi(m[3])
			r.secs, _ = strconv.Atoi(m[4])
			if r.rc == 0 {
				if err := json.Unmarshal([]byte(m[5]), &r.res); err != nil {
					return nil, fmt.Errorf("%s %s: bench output: %v", m[1], m[2], err)
				}
			}
		}
	}
	if len(runs) == 0 {
		return nil, fmt.Errorf("no ps-cluster results")
	}
	return runs, nil
}

// psPayload is a lower bound on the bytes the operations a bench reported
// carried to and from each server: keys, gradient and parameter values
// only (no headers, no warm-up, no connection setup). The sparse rows go to
// servers in the ring's proportions (estimated by sampling keys; counted at
// 75% of that share), the dense tensors to their owners. It follows
// psStepper.step: inference pulls 32 keys and pushes them every 20th step,
// training pulls and pushes 128 keys and every dense tensor per step.
func psPayload(res benchResult) (to, from []float64, err error) {
	n := res.Servers
	if n < 1 {
		return nil, nil, fmt.Errorf("%d servers", n)
	}
	w, err := psWorkloadOf(res.Workload, n)
	if err != nil {
		return nil, nil, err
	}
	var pulls, pushes int64
	for _, o := range res.Ops {
		switch o.Op {
		case "pull":
			pulls = o.Count
		case "push":
			pushes = o.Count
		}
	}
	ring := ps.NewRing(n, 0)
	share := make([]float64, n)
	rng := mrand.New(mrand.NewPCG(1, 2))
	const samples = 1 << 16
	for range samples {
		share[ring.Key("emb", rng.Uint64N(embRows))]++
	}
	for i := range share {
		share[i] = 0.75 * share[i] / samples
	}
	row := float64(4 * embDim)
	to, from = make([]float64, n), make([]float64, n)
	switch res.Workload {
	case "inference":
		for i := range n {
			to[i] = share[i] * 32 * (float64(pulls)*8 + float64(pushes)*(8+row))
			from[i] = share[i] * 32 * float64(pulls) * row
		}
	case "training":
		// Complete steps: a worker's pushes come 3 per step, in order.
		steps := float64(max(0, (pushes-2*int64(res.Workers))/3))
		for i := range n {
			to[i] = steps * share[i] * 128 * (8 + 8 + row)
			from[i] = steps * share[i] * 128 * row
		}
		for _, s := range w.specs {
			if s.Kind == ps.Dense {
				o := ring.Tensor(s.Name)
				to[o] += steps * float64(4*s.Size)
				from[o] += steps * float64(4*s.Size)
			}
		}
	default:
		return nil, nil, fmt.Errorf("no payload model for workload %q", res.Workload)
	}
	return to, from, nil
}

// checkPSCluster judges one run (workers on node 0, server I-1 on node I):
// a summary and what is wrong.
func checkPSCluster(r *psClusterRun, nodes int) (summary string, problems []string) {
	bad := func(f string, a ...any) { problems = append(problems, fmt.Sprintf(f, a...)) }
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: bench %ds", r.transport, r.workload, r.secs)
	for _, o := range r.res.Ops {
		fmt.Fprintf(&b, ", %s %d (%.0f/s, p50 %.1f ms, p99 %.1f ms)", o.Op, o.Count, o.OpsPerSec, o.P50/1e3, o.P99/1e3)
	}
	if r.rc != 0 {
		bad("bench exited %d", r.rc)
		return b.String(), problems
	}
	res := r.res
	if res.Transport != r.transport || res.Workload != r.workload || res.Servers != nodes-1 || len(res.Ops) == 0 {
		bad("bench result %s %s with %d servers and %d ops kinds", res.Transport, res.Workload, res.Servers, len(res.Ops))
	}
	if res.Errors != 0 {
		bad("%d failed operations", res.Errors)
	}
	for i := range nodes {
		if r.rx[i] < 0 || r.tx[i] < 0 {
			bad("no counters of node%d", i)
			return b.String(), problems
		}
	}
	to, from, err := psPayload(res)
	if err != nil || len(to) != nodes-1 {
		bad("payload: %v", err)
		return b.String(), problems
	}
	var sumTo, sumFrom float64
	var srvRx, srvTx int64
	for i := range to {
		sumTo += to[i]
		sumFrom += from[i]
		srvRx += r.rx[i+1]
		srvTx += r.tx[i+1]
	}
	fmt.Fprintf(&b, "\n  payload at least %.0f B to the servers, %.0f B back; the switch dropped %d frames", sumTo, sumFrom, r.dropped)
	for i := range nodes {
		role, want := "workers", fmt.Sprintf("(payload: rx >= %.0f, tx >= %.0f)", sumFrom, sumTo)
		if i > 0 {
			role, want = fmt.Sprintf("server %d", i-1), fmt.Sprintf("(payload: rx >= %.0f, tx >= %.0f)", to[i-1], from[i-1])
		}
		fmt.Fprintf(&b, "\n  node%d %-8s %s rx %10d B  tx %10d B  %s", i, role, r.dev[i], r.rx[i], r.tx[i], want)
	}
	// A run too small to tell a crossing from noise proves nothing.
	if sumFrom < 128<<10 {
		bad("only %.0f B of payload: too few operations (%+v) to judge", sumFrom, res.Ops)
	}
	if float64(r.rx[0]) < sumFrom || float64(r.tx[0]) < sumTo {
		bad("node0 (workers) received %d B and sent %d B, less than the payload %.0f / %.0f B: the traffic did not cross its NIC", r.rx[0], r.tx[0], sumFrom, sumTo)
	}
	for i := range to {
		if float64(r.rx[i+1]) < to[i] || float64(r.tx[i+1]) < from[i] {
			bad("node%d (server %d) received %d B and sent %d B, less than its payload %.0f / %.0f B", i+1, i, r.rx[i+1], r.tx[i+1], to[i], from[i])
		}
	}
	// Only node0 talks to the servers: what their NICs received, node0's
	// sent, and the other way round (broadcasts and a little slack aside).
	// Not equal: the switch may drop frames (tail drop; the senders
	// retransmit), so more can be sent than arrives.
	within := func(got, sent int64) bool { return got <= sent+sent/20+64<<10 }
	if !within(srvRx, r.tx[0]) || !within(r.rx[0], srvTx) {
		bad("the servers' nodes received %d B, node0 sent %d B; node0 received %d B, the servers' nodes sent %d B: traffic from elsewhere", srvRx, r.tx[0], r.rx[0], srvTx)
	}
	return b.String(), problems
}

// checkPSCluster on made-up runs: it accepts what a real run looks like and
// rejects missing traffic, a loopback path and failed operations.
func TestPSClusterCheck(t *testing.T) {
	mk := func(rx, tx []int64, errors int64) string {
		res := benchResult{Transport: "rdma", Workload: "inference", Workers: 4, Servers: 2, Errors: errors,
			Ops: []benchOp{{Op: "pull", Count: 840, P50: 14680, P99: 60817, OpsPerSec: 209}, {Op: "push", Count: 40}}}
		js, _ := json.Marshal(res)
		var b strings.Builder
		for i := range rx {
			fmt.Fprintf(&b, "ps-cluster: rdma inference node%d eth0 10.77.0.%d rx +%d tx +%d\n", i, i+1, rx[i], tx[i])
		}
		fmt.Fprintf(&b, "ps-cluster: rdma inference bench rc=0 5s %s\nps-cluster: done\n", js)
		return b.String()
	}
	// Figures of a real run (docs/vm.md).
	real := []int64{4076028, 403448, 410550}
	realTx := []int64{813984, 2001654, 2074444}
	for _, tc := range []struct {
		name   string
		rx, tx []int64
		errors int64
		want   string // "" = passes
	}{
		{"real run", real, realTx, 0, ""},
		{"loopback (no NIC traffic)", []int64{1200, 300, 300}, []int64{900, 600, 600}, 0, "node0 (workers) received"},
		{"node2 idle", []int64{2000000, 403448, 300}, []int64{413000, 2001654, 400}, 0, "node2 (server 1)"},
		{"servers talk to each other", []int64{4076028, 403448, 2410550}, []int64{813984, 4001654, 2074444}, 0, "traffic from elsewhere"},
		{"frames dropped on the way", []int64{4076028, 303448, 310550}, realTx, 0, ""},
		{"failed operations", real, realTx, 3, "3 failed operations"},
	} {
		runs, err := parsePSCluster(mk(tc.rx, tc.tx, tc.errors), 3)
		if err != nil {
			t.Fatal(err)
		}
		sum, problems := checkPSCluster(runs["rdma inference"], 3)
		got := strings.Join(problems, "; ")
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("%s: problems %q, want %q\n%s", tc.name, got, tc.want, sum)
		}
	}
}

// TestVMPSBenchMTU: ps bench in open loop (--rate) in a guest booted with
// --mtu 9000 runs over the jumbo link, and says so: link MTU 9000, rxe's
// active MTU 4096, the offered rate, no errors, no RNR.
func TestVMPSBenchMTU(t *testing.T) {
	needGuests(t)
	t.Parallel()
	// $GOVERBS_VM_BIN: goverbs vm's own copy of this binary, in the guest.
	r := vmRun(t, 5*time.Minute, nil, "--mtu", "9000", "--", "bash", "-c",
		`"$GOVERBS_VM_BIN" ps bench --transport rdma --workload inference --workers 2 --rate 40 --duration 2s --json`)
	if r.code != 0 {
		t.Fatalf("exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	var res benchResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("%v: %q", err, r.stdout)
	}
	if res.MTU != 9000 || res.IBMTU != 4096 {
		t.Errorf("link MTU %d, IB MTU %d; want 9000, 4096", res.MTU, res.IBMTU)
	}
	if res.Offered != 40 || res.Achieved <= 0 || res.Achieved > 80 || res.Errors != 0 || len(res.Ops) == 0 || res.Ops[0].Count == 0 {
		t.Errorf("open loop at 40 steps/s: %+v", res)
	}
	if res.RNR == nil || *res.RNR != 0 {
		t.Errorf("RNR NAK retries %v", res.RNR)
	}
}
