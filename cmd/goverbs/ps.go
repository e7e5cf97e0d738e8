package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hist"
	"github.com/goverbs/goverbs/metrics"
	"github.com/goverbs/goverbs/ps"
	"github.com/goverbs/goverbs/uverbs"
)

// goverbs ps: the parameter server (package ps) as real processes.
//
//	goverbs ps serve  --transport rdma|tcp --listen IP:PORT [--device DEV] [--metrics ADDR]
//	goverbs ps bench  --transport rdma|tcp --workload inference|training|incast
//	                  [--workers N] [--servers M] [--duration D] [--json] [--metrics ADDR]
//	goverbs ps report [--plots DIR] FILE.json...
//	goverbs ps worker ...   (started by bench)
//
// bench without --addrs starts M `ps serve` children on the server device
// (the second ACTIVE RDMA device: rxe1/10.99.0.2 in the guest) and worker
// children on the first (rxe0), runs the workload for --duration and
// reports latency per operation, throughput and CPU (getrusage of every
// server and worker process, over the measured window).

const psTokenEnv = "GOVERBS_PS_TOKEN"

func psToken() []byte {
	if t := os.Getenv(psTokenEnv); t != "" {
		return []byte(t)
	}
	return []byte("goverbs-ps-default-token")
}

func runPS(args []string, stdout, stderr io.Writer) error {
	// GOVERBS_PS_CPUPROFILE=PREFIX writes PREFIX.<command>.<pid> CPU
	// profiles of serve and worker processes.
	if pfx := os.Getenv("GOVERBS_PS_CPUPROFILE"); pfx != "" && len(args) > 0 && (args[0] == "serve" || args[0] == "worker") {
		if stop, err := startCPUProfile(fmt.Sprintf("%s.%s.%d", pfx, args[0], os.Getpid())); err == nil {
			defer stop()
		}
	}
	if len(args) > 0 && (args[0] == "serve" || args[0] == "bench" || args[0] == "worker") {
		defer dumpOnSignal("ps "+args[0], stderr)()
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		w := stderr
		if len(args) > 0 {
			w = stdout
		}
		fmt.Fprint(w, psUsage)
		if len(args) == 0 {
			return usageError("")
		}
		return nil
	}
	switch args[0] {
	case "serve":
		return psServe(args[1:], stdout, stderr)
	case "bench":
		return psBench(args[1:], stdout, stderr)
	case "worker":
		return psWorker(args[1:], stdout, stderr)
	case "report":
		return psReport(args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, psUsage)
	return usageError("unknown ps command %q", args[0])
}

// dumpOnSignal makes SIGUSR1 write bx's flow-control state (bx.DumpState)
// and every goroutine's stack to w, for diagnosing a stall without ending
// the process (scripts/ps-cluster sends it to a bench or server that
// overran its bound). The returned func stops it.
func dumpOnSignal(what string, w io.Writer) func() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
			case <-done:
				return
			}
			// Every line tagged: a bench and its workers share stderr
			// and dump at the same moment. The stacks first, in one
			// write: they show a stall even if bx's state cannot be
			// read (DumpState reports a lock held too long and goes on,
			// but the stacks must not wait for it).
			tag := fmt.Sprintf("[%s %d] ", what, os.Getpid())
			who := fmt.Sprintf("goverbs %s (pid %d): SIGUSR1: ", what, os.Getpid())
			var b bytes.Buffer
			pprof.Lookup("goroutine").WriteTo(&b, 2)
			w.Write(tagLines(tag, who+"goroutines", b.Bytes()))
			b.Reset()
			bx.DumpState(&b)
			w.Write(tagLines(tag, who+"bx state", b.Bytes()))
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}

// tagLines returns text with every line prefixed by tag, between a
// "title" line and an "end of title" line.
func tagLines(tag, title string, text []byte) []byte {
	var out bytes.Buffer
	fmt.Fprintf(&out, "%s%s\n", tag, title)
	for _, l := range strings.SplitAfter(string(text), "\n") {
		if l != "" {
			out.WriteString(tag + l)
		}
	}
	fmt.Fprintf(&out, "\n%send of %s\n", tag, title)
	return out.Bytes()
}

const psUsage = `Usage: goverbs ps COMMAND [flags]

  serve   --transport rdma|tcp --listen IP:PORT [--device DEV] [--nan reject|skip] [--max-batch N]
          [--max-bytes N] [--metrics ADDR] [--spin D] [--shared-targets] [--eager-size N] [--split-size N]
          serve one parameter shard; prints {"addr": ...} when ready, serves until SIGTERM
          (serve, bench, worker: SIGUSR1 writes bx's flow-control state and every goroutine's
          stack to stderr, for diagnosing a stall; the process goes on)
  bench   --transport rdma|tcp --workload inference|training|incast|pull [--workers N] [--servers M]
          [--worker-procs P] [--duration D] [--json] [--addrs A,B,...] [--device DEV]
          [--server-device DEV] [--metrics ADDR] [--spin D] [--shared-targets] [--depth K]
          [--eager-size N] [--split-size N] [--rate OPS | --rates A,B,...]
          run workers against servers (its own children unless --addrs) and report latency,
          throughput and CPU per 1000 ops; closed loop, or open loop at --rate steps per
          second (Poisson arrivals, latency from the scheduled start), one row per --rates rate

  --metrics ADDR serves Prometheus metrics (goverbs_bx_*, goverbs_ps_*) on http://ADDR/metrics
  while the command runs (off by default; port 0 picks one, serve prints it as "metrics");
  bench serves its servers' and workers' metrics there, labelled process="server0", "worker0", ...
  report  [--plots DIR] FILE.json...
          side-by-side table of bench --json results (per MTU and load), the paper's table
          (rdma/tcp against its goals; with scripts/demo's {"rtt": ...} lines, the bare round
          trips of the same bytes); PNG plots into DIR: latency CDFs, latency against offered load

`

func psServe(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("goverbs ps serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	transport := fs.String("transport", "rdma", "rdma (ByteExpress) or tcp")
	listen := fs.String("listen", "", "IP:PORT to listen on (required)")
	device := fs.String("device", "", "RDMA device (default: the one whose GID is the listen IP)")
	nan := fs.String("nan", "reject", "NaN/Inf gradients: reject the push, or skip the rows")
	maxBatch := fs.Int("max-batch", 65536, "largest number of keys in one request")
	maxBytes := fs.Int64("max-bytes", ps.DefaultMaxBytes, "bytes of parameter storage the shard holds at most, all parameters together (ps StoreConfig.MaxBytes)")
	spin := fs.Duration("spin", 0, "rdma: bx Config.Spin, how long the progress goroutine polls an idle CQ before sleeping (0: bx's default, 250us; negative: event-driven)")
	sharedTargets := fs.Bool("shared-targets", false, "rdma: bx Config.SharedTargets: one rkey for all rendezvous targets instead of a memory window per transfer (faster; only among trusted peers)")
	var eager, split int
	bxSizeFlags(fs, &eager, &split, "")
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics on HOST:PORT at /metrics (default: off)")
	if err := parseNoOperands(fs, args); err != nil {
		return err
	}
	if *listen == "" {
		return usageError("--listen is required")
	}
	if *maxBatch < 1 {
		return usageError("--max-batch %d: want keys per request > 0", *maxBatch)
	}
	if *maxBytes < 1 {
		return usageError("--max-bytes %d: want bytes of parameter storage > 0", *maxBytes)
	}
	if err := checkEagerSize(eager); err != nil {
		return err
	}
	if err := checkSplitSize(split); err != nil {
		return err
	}
	if err := checkMetricsAddr(*metricsAddr); err != nil {
		return err
	}
	pol, err := ps.ParseNaNPolicy(*nan)
	if err != nil {
		return usageError("%v", err)
	}
	s, err := ps.NewServer(ps.ServerConfig{Transport: *transport, Listen: *listen, Device: *device, Token: psToken(),
		Store: ps.StoreConfig{NaN: pol, MaxBatch: *maxBatch, MaxBytes: *maxBytes}, BX: bx.Config{Spin: *spin, SharedTargets: *sharedTargets, EagerSize: eager, SplitSize: split}})
	if err != nil {
		return err
	}
	defer s.Close()
	dev := ""
	mc := metrics.NewCollector()
	if ep := s.Endpoint(); ep != nil {
		dev = ep.Device()
		if err := mc.AddBX(ep); err != nil {
			return err
		}
	}
	if err := mc.AddPSServer(s); err != nil {
		return err
	}
	hello := map[string]any{"addr": s.Addr().String(), "transport": *transport, "device": dev, "pid": os.Getpid()}
	if *metricsAddr != "" {
		url, stop, err := startMetrics(*metricsAddr, mc, nil)
		if err != nil {
			return err
		}
		defer stop()
		hello["metrics"] = url
	}
	json.NewEncoder(stdout).Encode(hello)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, os.Interrupt)
	<-ch
	return nil
}

// workload parameters.
type psWorkload struct {
	name    string
	workers int
	specs   []ps.Spec
}

const (
	embDim  = 32
	embRows = 1 << 20
)

func psWorkloadOf(name string, servers int) (psWorkload, error) {
	emb := ps.Spec{Name: "emb", Kind: ps.Sparse, Dim: embDim, Rows: embRows, Opt: ps.Optimizer{Kind: ps.Adagrad, LR: 0.05, Eps: 1e-6, InitAcc: 0.1}, Seed: 1}
	switch name {
	case "inference":
		return psWorkload{name, 4, []ps.Spec{emb}}, nil
	case "pull":
		return psWorkload{name, 1, []ps.Spec{emb}}, nil
	case "training":
		return psWorkload{name, 4, []ps.Spec{emb,
			{Name: "dense_small", Kind: ps.Dense, Size: 4096, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.01}, Seed: 2},
			{Name: "dense_large", Kind: ps.Dense, Size: 65536, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.01}, Seed: 3}}}, nil
	case "incast":
		return psWorkload{name, 16, []ps.Spec{{Name: incastTensor(servers), Kind: ps.Dense, Size: 16384, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.01}, Seed: 4}}}, nil
	}
	return psWorkload{}, fmt.Errorf("workload %q: want inference, training, incast or pull", name)
}

// incastTensor is a dense tensor name the ring places on server 0: every
// incast worker pushes to that one server.
func incastTensor(servers int) string {
	r := ps.NewRing(servers, 0)
	for i := 0; ; i++ {
		if n := "incast" + strconv.Itoa(i); r.Tensor(n) == 0 {
			return n
		}
	}
}

// step runs one iteration of a workload, recording each call's latency.
type psStepper struct {
	c        *ps.Client
	w        psWorkload
	rng      *mrand.Rand
	keys     []uint64
	rows     []float32
	small    []float32
	large    []float32
	incast   []float32
	n        int
	pull     *hist.Fine
	push     *hist.Fine
	ops      *atomic.Int64
	incastNm string
	// slots, with --depth N > 1 (pull workload, closed loop): the N pulls
	// this worker goroutine keeps outstanding, each with its own buffers.
	slots []pullSlot
	// sched, when set (open loop, an arrival that was due before a worker
	// goroutine was free), is the scheduled start of the step: its first
	// operation's latency counts from it, so time spent queued behind
	// earlier arrivals is not hidden. Cleared once used.
	sched time.Time
}

// pullSlot is one outstanding pull (--depth).
type pullSlot struct {
	keys   []uint64
	rows   []float32
	p      *ps.Pending
	t0     time.Time
	record bool
}

// pullDeep is a pull step with several outstanding: it waits for the
// oldest (recording its latency from its start until its Wait returned)
// and starts the next in its slot.
func (s *psStepper) pullDeep(ctx context.Context, h *hist.Fine) error {
	sl := &s.slots[s.n%len(s.slots)]
	var err error
	if sl.p != nil {
		_, err = sl.p.Wait()
		if sl.record && h != nil {
			h.Add(time.Since(sl.t0))
			s.ops.Add(1)
		}
	}
	for i := range sl.keys {
		sl.keys[i] = s.rng.Uint64N(embRows)
	}
	sl.t0, sl.record = time.Now(), h != nil
	sl.p = s.c.PullAsync(ctx, "emb", sl.keys, sl.rows)
	return err
}

// drain waits for the pulls still outstanding (not recorded: they end
// after the measured time).
func (s *psStepper) drain() {
	for i := range s.slots {
		if p := s.slots[i].p; p != nil {
			p.Wait()
			s.slots[i].p = nil
		}
	}
}

func checkDepth(depth int, workload string, rate float64) error {
	switch {
	case depth < 1 || depth > 1024:
		return usageError("--depth %d: want 1..1024", depth)
	case depth > 1 && workload != "pull":
		return usageError("--depth %d: for the pull workload", depth)
	case depth > 1 && rate != 0:
		return usageError("--depth %d: closed loop only (not with --rate)", depth)
	}
	return nil
}

func (s *psStepper) timed(h *hist.Fine, f func() error) error {
	t0 := time.Now()
	if !s.sched.IsZero() {
		t0, s.sched = s.sched, time.Time{}
	}
	err := f()
	if h != nil {
		h.Add(time.Since(t0))
		s.ops.Add(1)
	}
	return err
}

func (s *psStepper) randKeys(n int) []uint64 {
	k := s.keys[:n]
	for i := range k {
		k[i] = s.rng.Uint64N(embRows)
	}
	return k
}

func (s *psStepper) grads(v []float32) {
	for i := range v {
		v[i] = float32(s.rng.NormFloat64() * 0.001)
	}
}

func (s *psStepper) step(ctx context.Context, record bool) error {
	pull, push := s.pull, s.push
	if !record {
		pull, push = nil, nil
	}
	s.n++
	switch s.w.name {
	case "inference":
		// Pull-heavy: small sparse batches; one in 20 also pushes.
		keys := s.randKeys(32)
		rows := s.rows[:32*embDim]
		if err := s.timed(pull, func() error { return s.c.Pull(ctx, "emb", keys, rows) }); err != nil {
			return err
		}
		if s.n%20 == 0 {
			s.grads(rows)
			return s.timed(push, func() error { _, err := s.c.Push(ctx, "emb", keys, rows); return err })
		}
	case "pull":
		// Inference's pull alone (32 keys of dim 32: a 271-byte request,
		// a 4116-byte response), to set against the bare transport
		// (scripts/bench-ps).
		if s.slots != nil {
			return s.pullDeep(ctx, pull)
		}
		keys := s.randKeys(32)
		return s.timed(pull, func() error { return s.c.Pull(ctx, "emb", keys, s.rows[:32*embDim]) })
	case "training":
		keys := s.randKeys(128)
		rows := s.rows[:128*embDim]
		if err := s.timed(pull, func() error { return s.c.Pull(ctx, "emb", keys, rows) }); err != nil {
			return err
		}
		if err := s.timed(pull, func() error { return s.c.PullDense(ctx, "dense_small", s.small) }); err != nil {
			return err
		}
		if err := s.timed(pull, func() error { return s.c.PullDense(ctx, "dense_large", s.large) }); err != nil {
			return err
		}
		s.grads(rows)
		s.grads(s.small)
		s.grads(s.large)
		if err := s.timed(push, func() error { _, err := s.c.Push(ctx, "emb", keys, rows); return err }); err != nil {
			return err
		}
		if err := s.timed(push, func() error { _, err := s.c.PushDense(ctx, "dense_small", s.small); return err }); err != nil {
			return err
		}
		return s.timed(push, func() error { _, err := s.c.PushDense(ctx, "dense_large", s.large); return err })
	case "incast":
		return s.timed(push, func() error { _, err := s.c.PushDense(ctx, s.incastNm, s.incast); return err })
	}
	return nil
}

// workerResult is what a worker process reports.
type workerResult struct {
	Pull, Push *hist.Fine
	CPUns      int64
	Wallns     int64
	Errors     int64
	FirstErr   string
	Steps      int64 // open loop: steps scheduled; closed loop: steps done
	Late       int64 // open loop: arrivals that no worker goroutine started before the end
}

// arrivals is an open loop's schedule: Poisson arrivals at rate per
// second from the start until end. A free worker goroutine takes the next
// arrival, sleeps until it is due and runs one step; if it is past due
// (every goroutine was busy), it runs it at once and the latency counts
// from the scheduled time, so queueing is not hidden. One taken at or
// after end stops the goroutine.
type arrivals struct {
	mu     sync.Mutex
	next   time.Time
	end    time.Time
	rate   float64
	rng    *mrand.Rand
	before int64 // arrivals taken that fell before end (each one started)
}

func (a *arrivals) gap() time.Duration {
	return time.Duration(a.rng.ExpFloat64() / a.rate * float64(time.Second))
}

func (a *arrivals) take() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.next = a.next.Add(a.gap())
	if a.next.Before(a.end) {
		a.before++
	}
	return a.next
}

// count, once the workers are done, is how many arrivals fell before end
// (steps) and how many of them no worker goroutine started (late: the
// workers stopped at end with those still to come).
func (a *arrivals) count() (steps, late int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if rest := a.end.Sub(a.next).Seconds() * a.rate; rest > 1e6 {
		// Far more than a million to go (a rate no machine serves):
		// the expected count rather than a million draws.
		return a.before + int64(rest), int64(rest)
	}
	for t := a.next; t.Before(a.end); {
		t = t.Add(a.gap())
		if t.Before(a.end) {
			late++
		}
	}
	return a.before + late, late
}

// psWorkerOpts are `goverbs ps worker`'s flags, checked, and the
// workload they name.
type psWorkerOpts struct {
	transport, workload, device, metricsAddr string
	servers                                  []string
	w                                        psWorkload
	workers, depth, eager, split             int
	duration, spin                           time.Duration
	seed                                     uint64
	rate                                     float64
}

// parsePSWorker reads and checks a worker's flags.
func parsePSWorker(args []string, stderr io.Writer) (*psWorkerOpts, error) {
	o := &psWorkerOpts{}
	fs := flag.NewFlagSet("goverbs ps worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.transport, "transport", "rdma", "rdma or tcp")
	addrs := fs.String("addrs", "", "server addresses, comma separated")
	fs.StringVar(&o.workload, "workload", "inference", "inference, training, incast or pull")
	fs.IntVar(&o.workers, "workers", 1, "worker goroutines")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured time")
	fs.StringVar(&o.device, "device", "", "RDMA device")
	fs.Uint64Var(&o.seed, "seed", 1, "random seed")
	fs.DurationVar(&o.spin, "spin", 0, "rdma: bx Config.Spin (0: bx's default, 250us; negative: event-driven)")
	fs.StringVar(&o.metricsAddr, "metrics", "", "serve Prometheus metrics on HOST:PORT")
	fs.Float64Var(&o.rate, "rate", 0, "open loop: steps per second of this process, Poisson arrivals, each taken by a free worker goroutine (0: closed loop)")
	fs.IntVar(&o.depth, "depth", 1, "pull workload, closed loop: pulls each worker goroutine keeps outstanding (ps.Client.PullAsync)")
	bxSizeFlags(fs, &o.eager, &o.split, "")
	if err := parseNoOperands(fs, args); err != nil {
		return nil, err
	}
	if err := checkEagerSize(o.eager); err != nil {
		return nil, err
	}
	if err := checkSplitSize(o.split); err != nil {
		return nil, err
	}
	if err := checkDepth(o.depth, o.workload, o.rate); err != nil {
		return nil, err
	}
	if err := checkMetricsAddr(o.metricsAddr); err != nil {
		return nil, err
	}
	if o.rate < 0 || math.IsNaN(o.rate) || math.IsInf(o.rate, 0) {
		return nil, usageError("--rate %v: want steps per second >= 0", o.rate)
	}
	if o.workers < 1 || o.workers > psMaxWorkers {
		return nil, usageError("--workers %d: want 1..%d worker goroutines", o.workers, psMaxWorkers)
	}
	if o.duration <= 0 {
		return nil, usageError("--duration %v: want a measured time > 0", o.duration)
	}
	if *addrs == "" {
		return nil, usageError("--addrs is required (the servers' IP:PORT, comma separated)")
	}
	o.servers = strings.Split(*addrs, ",")
	w, err := psWorkloadOf(o.workload, len(o.servers))
	if err != nil {
		return nil, usageError("%v", err)
	}
	o.w = w
	return o, nil
}

// psWorker is one worker process of `ps bench`: it warms up, says it is
// ready, waits for the parent's go (a line on stdin), steps for the
// duration while it reports progress, and reports its result, each a
// JSON line on stdout.
func psWorker(args []string, stdout, stderr io.Writer) error {
	o, err := parsePSWorker(args, stderr)
	if err != nil {
		return err
	}
	c, err := ps.Dial(ps.ClientConfig{Transport: o.transport, Servers: o.servers, Device: o.device, Token: psToken(), BX: bx.Config{Spin: o.spin, EagerSize: o.eager, SplitSize: o.split}})
	if err != nil {
		return err
	}
	defer c.Close()
	ready := map[string]any{"ready": true}
	if o.metricsAddr != "" {
		url, stop, err := serveClientMetrics(c, o.metricsAddr, nil)
		if err != nil {
			return err
		}
		defer stop()
		ready["metrics"] = url
	}
	out := json.NewEncoder(stdout)
	ctx := context.Background()
	var ops atomic.Int64
	steppers, err := o.steppers(ctx, c, &ops)
	if err != nil {
		return err
	}
	out.Encode(ready)
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return fmt.Errorf("waiting for go: %w", err)
	}
	res := o.drive(ctx, steppers, &ops, out)
	return out.Encode(map[string]any{"result": res})
}

// serveClientMetrics serves c's metrics (its bx endpoint's, if it has
// one, and the ps client's) with extra gatherers on addr.
func serveClientMetrics(c *ps.Client, addr string, labels prometheus.Labels, extra ...prometheus.Gatherer) (url string, stop func(), err error) {
	mc := metrics.NewCollector()
	if ep := c.Endpoint(); ep != nil {
		if err := mc.AddBX(ep); err != nil {
			return "", nil, err
		}
	}
	if err := mc.AddPSClient(c); err != nil {
		return "", nil, err
	}
	return startMetrics(addr, mc, labels, extra...)
}

// steppers makes a stepper per worker goroutine and warms each up
// (connections, buffers, the servers' first touch).
func (o *psWorkerOpts) steppers(ctx context.Context, c *ps.Client, ops *atomic.Int64) ([]*psStepper, error) {
	steppers := make([]*psStepper, o.workers)
	for i := range steppers {
		steppers[i] = &psStepper{c: c, w: o.w, rng: mrand.New(mrand.NewPCG(o.seed, uint64(i))), keys: make([]uint64, 128),
			rows: make([]float32, 128*embDim), small: make([]float32, 4096), large: make([]float32, 65536),
			incast: make([]float32, 16384), pull: hist.NewFine(), push: hist.NewFine(), ops: ops, incastNm: incastTensor(len(o.servers))}
		if o.depth > 1 {
			steppers[i].slots = make([]pullSlot, o.depth)
			for j := range steppers[i].slots {
				steppers[i].slots[j] = pullSlot{keys: make([]uint64, 32), rows: make([]float32, 32*embDim)}
			}
		}
		for range 3 {
			if err := steppers[i].step(ctx, false); err != nil {
				return nil, fmt.Errorf("warm-up: %w", err)
			}
		}
	}
	return steppers, nil
}

// drive runs the steppers for the duration, a goroutine each, writes
// the operations done so far to out every second, and returns what they
// measured. Closed loop: each worker goroutine steps again as soon as
// its step is done. Open loop (--rate): arrivals come on a schedule
// whatever the completions, and a free worker goroutine takes the next
// one.
func (o *psWorkerOpts) drive(ctx context.Context, steppers []*psStepper, ops *atomic.Int64, out *json.Encoder) workerResult {
	u0, s0 := ps.CPUTime()
	t0 := time.Now()
	end := t0.Add(o.duration)
	var wg sync.WaitGroup
	var errs atomic.Int64
	var firstErr atomic.Value
	var steps atomic.Int64 // closed loop: steps done in the measured time
	var arr *arrivals
	if o.rate > 0 {
		arr = &arrivals{next: t0, end: end, rate: o.rate, rng: mrand.New(mrand.NewPCG(o.seed, 1<<32))}
	}
	for _, st := range steppers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer st.drain()
			for time.Now().Before(end) {
				if arr != nil {
					at := arr.take()
					if !at.Before(end) {
						return
					}
					if d := time.Until(at); d > 0 {
						// Free before it is due: the step starts when
						// the timer wakes us (Go's timers may overshoot
						// by up to a millisecond, the harness's delay,
						// not the system's).
						time.Sleep(d)
					} else {
						// Due while every goroutine was busy: the wait
						// is queueing, counted from the scheduled time.
						st.sched = at
					}
				}
				err := st.step(ctx, true)
				steps.Add(1)
				if err != nil {
					if errs.Add(1) == 1 {
						firstErr.Store(err.Error())
					}
					if errs.Load() > 100 {
						return
					}
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
loop:
	for {
		select {
		case <-done:
			break loop
		case <-tick.C:
			out.Encode(map[string]any{"progress": ops.Load()})
		}
	}
	res := workerResult{Pull: hist.NewFine(), Push: hist.NewFine()}
	if arr != nil {
		res.Steps, res.Late = arr.count()
	} else {
		res.Steps = steps.Load()
	}
	u1, s1 := ps.CPUTime()
	res.Wallns = int64(time.Since(t0))
	res.CPUns = int64(u1 - u0 + s1 - s0)
	for _, st := range steppers {
		res.Pull.Merge(st.pull)
		res.Push.Merge(st.push)
	}
	res.Errors = errs.Load()
	if e, ok := firstErr.Load().(string); ok {
		res.FirstErr = e
	}
	return res
}

// benchResult is bench's --json output.
type benchResult struct {
	Transport string    `json:"transport"`
	Workload  string    `json:"workload"`
	Ops       []benchOp `json:"ops"`
	Workers   int       `json:"workers"`
	Depth     int       `json:"depth,omitempty"` // pulls outstanding per worker (--depth)
	Servers   int       `json:"servers"`
	// WorkerProcs is how many worker processes ran the workers.
	WorkerProcs int     `json:"worker_procs,omitempty"`
	Duration    float64 `json:"duration_s"`
	CPU         float64 `json:"cpu_s"`
	ServerCPU   float64 `json:"server_cpu_s"`
	WorkerCPU   float64 `json:"worker_cpu_s"`
	Errors      int64   `json:"errors"`
	// Open loop (--rate, --rates): the offered steps per second, those
	// started and finished per second, and the arrivals no worker
	// goroutine started before the end. In closed loop Offered and Late
	// are zero and Achieved is the steps done per second: the saturation
	// throughput, from which scripts/demo derives its open-loop rates.
	Offered  float64 `json:"offered_steps_per_s,omitempty"`
	Achieved float64 `json:"achieved_steps_per_s,omitempty"`
	Late     int64   `json:"late,omitempty"`
	// MTU is the link MTU of the servers' network device (the netdev
	// under their RDMA device; tcp crosses the same link), IBMTU that
	// device's active_mtu; zero where unknown (no RDMA device).
	MTU      int         `json:"mtu,omitempty"`
	IBMTU    int         `json:"ib_mtu,omitempty"`
	RNR      *uint64     `json:"rnr_nak_retries,omitempty"`
	Counters rdmaCounter `json:"rdma_counters,omitempty"`
}

type benchOp struct {
	Op        string      `json:"op"`
	Count     int64       `json:"count"`
	Mean      float64     `json:"mean_us"`
	P50       float64     `json:"p50_us"`
	P99       float64     `json:"p99_us"`
	P999      float64     `json:"p999_us"`
	OpsPerSec float64     `json:"ops_per_s"`
	CPUPerKop float64     `json:"cpu_s_per_kop"`
	Hist      [][2]uint64 `json:"hist,omitempty"` // [bucket upper bound in ns, count]
}

type rdmaCounter map[string]uint64

// psBenchOpts are `goverbs ps bench`'s flags, checked.
type psBenchOpts struct {
	transport, workload      string
	workers, servers, procs  int
	duration                 time.Duration
	json                     bool
	addrs, device, srvDevice string
	spin                     time.Duration
	sharedTargets            bool
	metricsAddr              string
	depth, eager, split      int
	rates                    []float64 // one run each; 0 is closed loop
}

// psMaxWorkers and psMaxServers bound what bench and worker start: each
// worker goroutine holds a client's connections, each server a process.
const (
	psMaxWorkers = 4096
	psMaxServers = 32
)

// parsePSBench reads and checks bench's flags.
func parsePSBench(args []string, stderr io.Writer) (*psBenchOpts, error) {
	o := &psBenchOpts{}
	fs := flag.NewFlagSet("goverbs ps bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.transport, "transport", "rdma", "rdma (ByteExpress) or tcp")
	fs.StringVar(&o.workload, "workload", "inference", "inference (pull-heavy, small sparse batches), training (dense and sparse push+pull), incast (all workers push to one server), pull (inference's pull alone, one worker)")
	fs.IntVar(&o.workers, "workers", 0, "worker goroutines in all (default: 4, incast 16)")
	fs.IntVar(&o.servers, "servers", 2, "servers to start")
	fs.IntVar(&o.procs, "worker-procs", 0, "worker processes (default: one per 8 workers)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured time")
	fs.BoolVar(&o.json, "json", false, "print one JSON object")
	fs.StringVar(&o.addrs, "addrs", "", "existing servers (IP:PORT,...); default: start --servers children")
	fs.StringVar(&o.device, "device", "", "workers' RDMA device (default: the first ACTIVE one)")
	fs.StringVar(&o.srvDevice, "server-device", "", "servers' RDMA device (default: the second ACTIVE one, else the first)")
	fs.DurationVar(&o.spin, "spin", 0, "rdma: bx Config.Spin of servers and workers (0: bx's default, 250us; negative: event-driven)")
	fs.BoolVar(&o.sharedTargets, "shared-targets", false, "rdma: the servers' bx Config.SharedTargets (one rkey for all rendezvous targets instead of a memory window per transfer)")
	fs.StringVar(&o.metricsAddr, "metrics", "", "serve the servers' and workers' Prometheus metrics on HOST:PORT at /metrics (default: off)")
	fs.IntVar(&o.depth, "depth", 1, "pull workload, closed loop: pulls each worker keeps outstanding (ps.Client.PullAsync)")
	bxSizeFlags(fs, &o.eager, &o.split, " of servers and workers")
	rate := fs.Float64("rate", 0, "open loop: offer this many steps per second in all (Poisson arrivals; latency from each arrival's scheduled time); an inference step is one pull (and a push every 20th), training 3 pulls and 3 pushes, incast one push. 0: closed loop")
	rates := fs.String("rates", "", "open loop at each of these rates in turn (A,B,C steps per second), one row each; the servers stay up between them")
	if err := parseNoOperands(fs, args); err != nil {
		return nil, err
	}
	o.rates = []float64{*rate}
	if *rates != "" {
		if *rate != 0 {
			return nil, usageError("--rate and --rates: give one")
		}
		o.rates = o.rates[:0]
		for _, f := range strings.Split(*rates, ",") {
			r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil || !(r > 0) || math.IsInf(r, 0) { // !(r > 0): NaN too
				return nil, usageError("--rates %q: %q is not a rate (steps per second > 0)", *rates, f)
			}
			o.rates = append(o.rates, r)
		}
	}
	if *rate < 0 || math.IsNaN(*rate) || math.IsInf(*rate, 0) {
		return nil, usageError("--rate %v: want steps per second > 0, or 0 for closed loop", *rate)
	}
	if err := checkEagerSize(o.eager); err != nil {
		return nil, err
	}
	if err := checkSplitSize(o.split); err != nil {
		return nil, err
	}
	if err := checkDepth(o.depth, o.workload, *rate+float64(len(*rates))); err != nil {
		return nil, err
	}
	if o.metricsAddr != "" && len(o.rates) > 1 {
		return nil, usageError("--metrics serves one run: not with --rates")
	}
	if o.transport != "rdma" && o.transport != "tcp" {
		return nil, usageError("--transport %q: want rdma or tcp", o.transport)
	}
	if err := checkMetricsAddr(o.metricsAddr); err != nil {
		return nil, err
	}
	switch {
	case o.workers < 0 || o.workers > psMaxWorkers:
		return nil, usageError("--workers %d: want 1..%d worker goroutines in all (0: the workload's default)", o.workers, psMaxWorkers)
	case o.procs < 0 || o.procs > psMaxWorkers:
		return nil, usageError("--worker-procs %d: want 1..%d worker processes (0: one per 8 workers)", o.procs, psMaxWorkers)
	case o.duration <= 0:
		return nil, usageError("--duration %v: want a measured time > 0", o.duration)
	case o.addrs == "" && (o.servers < 1 || o.servers > psMaxServers):
		return nil, usageError("--servers %d: want 1..%d servers to start", o.servers, psMaxServers)
	}
	w, err := psWorkloadOf(o.workload, max(o.servers, 1))
	if err != nil {
		return nil, usageError("%v", err)
	}
	if o.workers <= 0 {
		o.workers = w.workers
	}
	if o.procs <= 0 {
		o.procs = (o.workers + 7) / 8
	}
	o.procs = min(o.procs, o.workers)
	return o, nil
}

// psBencher runs bench: its server and worker children, its own control
// client, and the metrics the children serve.
type psBencher struct {
	o      *psBenchOpts
	stderr io.Writer
	self   string // this executable, run as the children

	srvIP, cliDev, srvDev string
	list                  []string // the servers' addresses
	children              []*exec.Cmd
	childMetrics          []prometheus.Gatherer
	ctl                   *ps.Client
}

func psBench(args []string, stdout, stderr io.Writer) error {
	o, err := parsePSBench(args, stderr)
	if err != nil {
		return err
	}
	b := &psBencher{o: o, stderr: stderr}
	if b.self, err = os.Executable(); err != nil {
		return err
	}
	if err := b.placeDevices(); err != nil {
		return err
	}
	if os.Getenv(psTokenEnv) == "" {
		var t [16]byte
		rand.Read(t[:])
		os.Setenv(psTokenEnv, hex.EncodeToString(t[:]))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer b.stopChildren()
	if err := b.startServers(); err != nil {
		return err
	}
	if err := b.dialControl(ctx); err != nil {
		return err
	}
	defer b.ctl.Close()
	var all []benchResult
	for _, rate := range o.rates {
		res, err := b.run(ctx, rate)
		if err != nil {
			return err
		}
		if o.json {
			if err := json.NewEncoder(stdout).Encode(res); err != nil {
				return err
			}
		}
		all = append(all, res)
	}
	if !o.json {
		printBench(stdout, all)
	}
	return nil
}

// placeDevices puts the servers on the second ACTIVE device and its IP,
// the workers on the first; tcp uses the same addresses (so its traffic
// crosses the same link), or loopback without devices.
func (b *psBencher) placeDevices() error {
	devs, _ := ps.ActiveDevices()
	b.srvIP, b.cliDev, b.srvDev = "127.0.0.1", b.o.device, b.o.srvDevice
	if len(devs) > 0 {
		s := devs[len(devs)-1]
		if len(devs) > 1 {
			s = devs[1]
		}
		if b.srvDev != "" {
			for _, d := range devs {
				if d.Name == b.srvDev {
					s = d
				}
			}
		}
		b.srvDev, b.srvIP = s.Name, s.IP.String()
		if b.cliDev == "" {
			b.cliDev = devs[0].Name
		}
	}
	if b.o.transport == "rdma" && b.cliDev == "" {
		return errors.New("no ACTIVE RDMA device for rdma (run it through scripts/vm, or use --transport tcp)")
	}
	return nil
}

// childArgs are a child's arguments: with --metrics every child serves
// its own on a loopback port and this process serves them all, each
// labelled with its process.
func (b *psBencher) childArgs(args ...string) []string {
	if b.o.metricsAddr != "" {
		args = append(args, "--metrics", "127.0.0.1:0")
	}
	return args
}

// addChild scrapes the metrics a child reported serving at url.
func (b *psBencher) addChild(name, url string) error {
	if b.o.metricsAddr == "" {
		return nil
	}
	if url == "" {
		return fmt.Errorf("%s did not report its metrics endpoint", name)
	}
	g, err := metrics.Scraped(url, map[string]string{"process": name})
	if err != nil {
		return err
	}
	b.childMetrics = append(b.childMetrics, g)
	return nil
}

// stopChildren ends every child: SIGTERM, then SIGKILL after 5 s.
func (b *psBencher) stopChildren() {
	for _, c := range b.children {
		c.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range b.children {
		done := make(chan struct{})
		go func() { c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			c.Process.Kill()
			<-done
		}
	}
}

// startServers starts --servers `ps serve` children and reads each one's
// address, or takes the servers of --addrs.
func (b *psBencher) startServers() error {
	o := b.o
	if o.addrs != "" {
		b.list = strings.Split(o.addrs, ",")
		return nil
	}
	for i := range o.servers {
		cmd := exec.Command(b.self, b.childArgs("ps", "serve", "--transport", o.transport, "--listen", b.srvIP+":0", "--device", b.srvDev, "--spin", o.spin.String(), "--shared-targets="+strconv.FormatBool(o.sharedTargets), "--eager-size", strconv.Itoa(o.eager), "--split-size", strconv.Itoa(o.split))...)
		cmd.Stderr = b.stderr
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			return err
		}
		b.children = append(b.children, cmd)
		var hello struct{ Addr, Metrics string }
		line, err := bufio.NewReader(out).ReadBytes('\n')
		if err == nil {
			err = json.Unmarshal(line, &hello)
		}
		if err != nil || hello.Addr == "" {
			return fmt.Errorf("server child did not start: %q %v", line, err)
		}
		b.list = append(b.list, hello.Addr)
		if err := b.addChild(fmt.Sprintf("server%d", i), hello.Metrics); err != nil {
			return err
		}
	}
	return nil
}

// dialControl dials the parent's own client, which defines the
// parameters and reads the servers' CPU. It is event-driven (Spin < 0):
// a polling endpoint registers its process as a poller (bx/pollers.go),
// and a third poller on a two-CPU guest turned every server and worker
// endpoint to events.
func (b *psBencher) dialControl(ctx context.Context) error {
	w, _ := psWorkloadOf(b.o.workload, len(b.list))
	ctl, err := ps.Dial(ps.ClientConfig{Transport: b.o.transport, Servers: b.list, Device: b.cliDev, Token: psToken(), BX: bx.Config{Spin: -1, EagerSize: b.o.eager}})
	if err != nil {
		return err
	}
	if err := ctl.Define(ctx, w.specs...); err != nil {
		ctl.Close()
		return err
	}
	b.ctl = ctl
	return nil
}

// wproc is one `ps worker` child of a run and what it reported.
type wproc struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines *bufio.Scanner
	prog  atomic.Int64
	res   *workerResult
	err   error
}

// run runs the workers once: in closed loop (rate 0) or at rate steps
// per second in all, split over the worker processes by their
// goroutines.
func (b *psBencher) run(ctx context.Context, rate float64) (benchResult, error) {
	wps, err := b.startWorkers(rate)
	if err != nil {
		return benchResult{}, err
	}
	if b.o.metricsAddr != "" {
		stop, err := b.serveMetrics()
		if err != nil {
			return benchResult{}, err
		}
		defer stop()
	}
	before, err := b.ctl.Stats(ctx)
	if err != nil {
		return benchResult{}, err
	}
	c0 := readRDMACounters()
	for _, p := range wps {
		io.WriteString(p.in, "go\n")
	}
	b.wait(wps)
	after, err := b.ctl.Stats(ctx)
	if err != nil {
		return benchResult{}, err
	}
	c1 := readRDMACounters()
	return b.result(rate, wps, before, after, c0, c1)
}

// startWorkers starts the worker processes of a run, each with its share
// of the workers and of the rate, and waits until each is ready.
func (b *psBencher) startWorkers(rate float64) ([]*wproc, error) {
	o := b.o
	var wps []*wproc
	for i := range o.procs {
		n := o.workers / o.procs
		if i < o.workers%o.procs {
			n++
		}
		cmd := exec.Command(b.self, b.childArgs("ps", "worker", "--transport", o.transport, "--addrs", strings.Join(b.list, ","), "--workload", o.workload,
			"--workers", strconv.Itoa(n), "--duration", o.duration.String(), "--device", b.cliDev, "--seed", strconv.Itoa(i+1), "--spin", o.spin.String(),
			"--rate", strconv.FormatFloat(rate*float64(n)/float64(o.workers), 'g', -1, 64), "--depth", strconv.Itoa(o.depth), "--eager-size", strconv.Itoa(o.eager), "--split-size", strconv.Itoa(o.split))...)
		cmd.Stderr = b.stderr
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		b.children = append(b.children, cmd)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		wps = append(wps, &wproc{cmd: cmd, in: in, lines: sc})
	}
	for i, p := range wps {
		var ready struct {
			Ready   bool
			Metrics string
		}
		if !p.lines.Scan() || json.Unmarshal(p.lines.Bytes(), &ready) != nil || !ready.Ready {
			return nil, fmt.Errorf("worker %d did not get ready: %q", i, p.lines.Text())
		}
		if err := b.addChild(fmt.Sprintf("worker%d", i), ready.Metrics); err != nil {
			return nil, err
		}
	}
	return wps, nil
}

// serveMetrics serves every child's metrics and the parent's own client's
// (as process="bench") on --metrics.
func (b *psBencher) serveMetrics() (stop func(), err error) {
	url, stop, err := serveClientMetrics(b.ctl, b.o.metricsAddr, prometheus.Labels{"process": "bench"}, b.childMetrics...)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(b.stderr, "ps bench: metrics of %d processes on %s\n", len(b.childMetrics)+1, url)
	return stop, nil
}

// wait reads the workers' progress and results until every one has
// exited, printing the progress every 2 s in runs of 4 s or more.
func (b *psBencher) wait(wps []*wproc) {
	var wg sync.WaitGroup
	for _, p := range wps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p.lines.Scan() {
				var m struct {
					Progress *int64
					Result   *workerResult
				}
				if err := json.Unmarshal(p.lines.Bytes(), &m); err != nil {
					continue
				}
				if m.Progress != nil {
					p.prog.Store(*m.Progress)
				}
				if m.Result != nil {
					p.res = m.Result
				}
			}
			p.err = p.cmd.Wait()
		}()
	}
	start := time.Now()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	progress := b.o.duration >= 4*time.Second
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			if progress {
				var n int64
				for _, p := range wps {
					n += p.prog.Load()
				}
				fmt.Fprintf(b.stderr, "ps bench %s %s: %.0fs/%v, %d ops\n", b.o.transport, b.o.workload, time.Since(start).Seconds(), b.o.duration, n)
			}
		}
	}
}

// result merges the workers' reports, the servers' CPU (Stats before and
// after) and the RDMA counters into a run's row.
func (b *psBencher) result(rate float64, wps []*wproc, before, after []ps.ServerStats, c0, c1 map[string]uint64) (benchResult, error) {
	o := b.o
	res := benchResult{Transport: o.transport, Workload: o.workload, Workers: o.workers, Servers: len(b.list), WorkerProcs: o.procs}
	if o.depth > 1 {
		res.Depth = o.depth
	}
	pull, push := hist.NewFine(), hist.NewFine()
	var wall, steps, late int64
	for i, p := range wps {
		if p.res == nil {
			return benchResult{}, fmt.Errorf("worker %d reported nothing (%v)", i, p.err)
		}
		pull.Merge(p.res.Pull)
		push.Merge(p.res.Push)
		res.WorkerCPU += float64(p.res.CPUns) / 1e9
		res.Errors += p.res.Errors
		if p.res.FirstErr != "" {
			fmt.Fprintf(b.stderr, "ps bench: worker %d: %d errors, first: %s\n", i, p.res.Errors, p.res.FirstErr)
		}
		wall = max(wall, p.res.Wallns)
		steps += p.res.Steps
		late += p.res.Late
	}
	for i := range after {
		res.ServerCPU += (after[i].User + after[i].System - before[i].User - before[i].System).Seconds()
	}
	res.CPU = res.ServerCPU + res.WorkerCPU
	res.Duration = float64(wall) / 1e9
	total := pull.N + push.N
	if total > 0 && wall <= 0 {
		// Operations in no time: a rate of +Inf, which --json cannot
		// encode (a worker's bad report, not a result).
		return benchResult{}, fmt.Errorf("workers reported %d operations in a measured time of %d ns", total, wall)
	}
	for _, op := range []struct {
		name string
		h    *hist.Fine
	}{{"pull", pull}, {"push", push}} {
		if op.h.N == 0 {
			continue
		}
		row := benchOp{Op: op.name, Count: op.h.N, Mean: op.h.Mean() / 1e3, P50: op.h.Quantile(0.5) / 1e3, P99: op.h.Quantile(0.99) / 1e3,
			P999: op.h.Quantile(0.999) / 1e3, OpsPerSec: float64(op.h.N) / res.Duration, Hist: op.h.Buckets()}
		if total > 0 {
			row.CPUPerKop = res.CPU / (float64(total) / 1000)
		}
		res.Ops = append(res.Ops, row)
	}
	if c0 != nil && c1 != nil {
		res.Counters = rdmaCounter{}
		for k, v := range c1 {
			res.Counters[k] = v - c0[k]
		}
		var rnr uint64
		for k, v := range res.Counters {
			if strings.Contains(k, "rnr") {
				rnr += v
			}
		}
		res.RNR = &rnr
	}
	if res.Duration > 0 {
		res.Achieved = float64(steps-late) / res.Duration
	}
	if rate > 0 {
		res.Offered = rate
		res.Late = late
	}
	res.MTU, res.IBMTU = linkMTU(b.srvDev)
	return res, nil
}

// linkMTU is the MTU of the network device under RDMA device dev and
// the active MTU of dev's port 1 (0, 0 where unknown).
func linkMTU(dev string) (mtu, ibMTU int) {
	if dev == "" {
		return 0, 0
	}
	if c, err := uverbs.Open(dev); err == nil {
		if pa, err := c.QueryPort(1); err == nil {
			ibMTU = pa.ActiveMTU.Bytes()
		}
		c.Close()
	}
	if nd, err := os.ReadFile(filepath.Join("/sys/class/infiniband", dev, "parent")); err == nil {
		b, _ := os.ReadFile(filepath.Join("/sys/class/net", strings.TrimSpace(string(nd)), "mtu"))
		mtu, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	return mtu, ibMTU
}

// readRDMACounters sums the hw_counters of every device's port 1 (rxe's
// retransmit and RNR counters), or nil without devices.
func readRDMACounters() map[string]uint64 {
	dirs, _ := filepath.Glob("/sys/class/infiniband/*/ports/1/hw_counters")
	if len(dirs) == 0 {
		return nil
	}
	m := map[string]uint64{}
	for _, d := range dirs {
		for _, name := range []string{"rcvd_rnr_err", "send_rnr_err", "retry_rnr_exceeded_err", "rnr_nak_retry_err", "completer_retry_err", "retry_exceeded_err", "rcvd_seq_err", "duplicate_request", "out_of_seq_request"} {
			b, err := os.ReadFile(filepath.Join(d, name))
			if err != nil {
				continue
			}
			v, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
			m[name] += v
		}
	}
	return m
}

func printBench(w io.Writer, rs []benchResult) {
	fmt.Fprintf(w, "%-9s %5s %-11s %-9s %-4s %9s %9s %9s %9s %9s %9s %11s %9s\n", "workload", "mtu", "load", "transport", "op", "count", "mean_us", "p50_us", "p99_us", "p999_us", "ops/s", "cpu_s/kop", "steps/s")
	for _, r := range rs {
		for _, o := range r.Ops {
			fmt.Fprintf(w, "%-9s %5s %-11s %-9s %-4s %9d %9.1f %9.1f %9.1f %9.1f %9.0f %11.4f %9.0f\n", r.Workload, mtuString(r.MTU), loadString(r.Offered), r.Transport,
				o.Op, o.Count, o.Mean, o.P50, o.P99, o.P999, o.OpsPerSec, o.CPUPerKop, r.Achieved)
		}
		if r.Late > 0 {
			fmt.Fprintf(w, "%-9s %5s %-11s %-9s open loop: %d arrivals not started by the end (offered more than served)\n", r.Workload, mtuString(r.MTU), loadString(r.Offered), r.Transport, r.Late)
		}
	}
}

// loadString names a run's load: "closed" (closed loop) or "open@R"
// (open loop at R steps per second).
func loadString(offered float64) string {
	if offered == 0 {
		return "closed"
	}
	return "open@" + strconv.FormatFloat(offered, 'f', -1, 64)
}

func mtuString(mtu int) string {
	if mtu == 0 {
		return "-"
	}
	return strconv.Itoa(mtu)
}

// bxSizeFlags registers --eager-size and --split-size, bx's
// Config.EagerSize and SplitSize, with one help text for every ps command
// that takes them; whose says whose endpoints they set ("": this
// process's: then the peers' must match).
func bxSizeFlags(fs *flag.FlagSet, eager, split *int, whose string) {
	same := ""
	if whose == "" {
		same = "; servers and workers must use the same"
	}
	fs.IntVar(eager, "eager-size", 0, "rdma: bx Config.EagerSize"+whose+", the largest payload sent in one message (0: bx's default, 8 KiB less the header)"+same)
	fs.IntVar(split, "split-size", 0, "rdma: bx Config.SplitSize"+whose+", the largest payload sent as several eager messages instead of by rendezvous (0: bx's default; -1: never)")
}

// parseNoOperands parses args (getopt style) for a command that takes
// flags only: an operand left over (a value whose flag was mistyped, say)
// is an error, not ignored.
func parseNoOperands(fs *flag.FlagSet, args []string) error {
	rest, err := parseGetopt(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageError("unexpected argument %q (%s takes flags only)", rest[0], fs.Name())
	}
	return nil
}

// checkSplitSize checks a --split-size (0: bx's default, -1: never; a
// size at most EagerSize sends nothing split, as bx does with it).
func checkSplitSize(n int) error {
	if n < -1 {
		return usageError("--split-size %d: must be -1 (never), 0 (bx's default) or a size", n)
	}
	return nil
}

// checkEagerSize checks an --eager-size (0: bx's default).
func checkEagerSize(n int) error {
	if n != 0 && (n < 64 || n+bx.HeaderSize > 1<<20) {
		return usageError("--eager-size %d: must be 64..%d (0: bx's default)", n, 1<<20-bx.HeaderSize)
	}
	return nil
}
