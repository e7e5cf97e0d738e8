package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goverbs/goverbs/bx"
)

// goverbs perf bx_lat, tcp_lat, bx_bw, tcp_bw: request/response calls of
// SIZE bytes each way between two processes, over ByteExpress (bx.Peer.Call
// to an echo handler) or over one kernel TCP connection with the same
// framing (a 4-byte length, bx's 48-byte header, the payload). The _lat
// tests make one call at a time and report the full round trip (t_typical
// is the median); the _bw tests keep --tx-depth calls outstanding (bx: that
// many goroutines calling; TCP: pipelined on the one connection). Both
// report the CPU time (user + system, getrusage) each process spent per
// call between the start and end barriers.
//
// The exchange is goverbs perf's (JSON lines on --port); the data plane is
// on --port + 1: bx's control plane (Listen/Dial) or the TCP connection.

var perfBXTests = map[string]bool{"bx_lat": true, "tcp_lat": true, "bx_bw": true, "tcp_bw": true,
	"grpc_lat": true, "grpc_tcp_lat": true, "grpc_bw": true, "grpc_tcp_bw": true}

// perfToken authenticates the two bx endpoints; both sides run goverbs
// perf, so a fixed token (or GOVERBS_PERF_TOKEN) is enough for a benchmark.
const perfToken = "goverbs-perf-bx-token"

type perfBXOptions struct {
	test    string
	dev     string
	size    int
	resp    int // response bytes (--resp-size; default size: an echo)
	iters   int
	window  int
	port    int
	spin    time.Duration
	shared  bool // bx Config.SharedTargets
	eager   int  // bx Config.EagerSize (--eager-size; 0: bx's default)
	split   int  // bx Config.SplitSize (--split-size; 0: bx's default, -1: never)
	zc      bool // --zero-copy: CallBuffer and Reply, no payload copies
	idle    time.Duration
	json    bool
	cpuprof string
	trace   string // --trace: a Go execution trace of the measured loop
	samples string // --samples: the client's every round trip, usec, one a line
	server  string
	bw, tcp bool
	grpc    bool // gRPC unary calls (perf_grpc.go) instead of bx Calls or the TCP framing
}

// perfBXCPU is one process's CPU time per call, in usec.
type perfBXCPU struct {
	Client float64 `json:"client_usec_per_call"`
	Server float64 `json:"server_usec_per_call"`
}

type perfBXReport struct {
	Test       string            `json:"test"`
	Role       string            `json:"role"`
	MeasuredBy string            `json:"measured_by"`
	Device     string            `json:"device,omitempty"`
	Transport  string            `json:"transport"`
	Window     int               `json:"window"`
	Spin       string            `json:"spin,omitempty"`
	Shared     bool              `json:"shared_targets,omitempty"`
	ZeroCopy   bool              `json:"zero_copy,omitempty"`
	EagerSize  int               `json:"eager_size,omitempty"`
	SplitSize  int               `json:"split_size,omitempty"`
	Units      map[string]string `json:"units"`
	Latency    []perfLatResult   `json:"latency,omitempty"`
	Bandwidth  []perfBWResult    `json:"bandwidth,omitempty"`
	CPU        perfBXCPU         `json:"cpu"`
	// Counts is bx's per-call counters of the measured loop, for the
	// process that printed the report (bx tests only).
	Counts map[string]float64 `json:"counts_per_call,omitempty"`
	// IdleCPU is the client's CPU time over --idle, connected and idle
	// after the warm-up calls, in percent of one core.
	IdleCPU *float64 `json:"idle_cpu_percent,omitempty"`
	Idle    string   `json:"idle,omitempty"`
}

// perfBXResult is what each side sends the other at the end barrier.
type perfBXResult struct {
	Latency   *perfLatResult `json:"latency,omitempty"`
	Bandwidth *perfBWResult  `json:"bandwidth,omitempty"`
	CPU       float64        `json:"cpu_usec_per_call"`
}

const perfBXUsage = `Usage:
  goverbs perf bx_lat|tcp_lat|bx_bw|tcp_bw [options]          server
  goverbs perf bx_lat|tcp_lat|bx_bw|tcp_bw [options] <host>   client
  goverbs perf grpc_lat|grpc_tcp_lat|grpc_bw|grpc_tcp_bw ...  (the same)

Calls of SIZE bytes each way to an echo server: over ByteExpress (bx) or
the same framing over one kernel TCP connection (tcp); grpc_*: gRPC unary
calls of raw bytes over bx Conns (package bx/bxgrpc) or over kernel TCP
(grpc_tcp_*). _lat: one call at a time, full round trip; _bw: --tx-depth
calls outstanding. Both sides report the CPU time per call of each
process.

Options:
  -d, --ib-dev=<dev>     RDMA device (bx tests; default the first device)
  -s, --size=<size>      payload bytes each way (default 64)
      --resp-size=<size> _lat tests: response payload bytes, when not SIZE
                         (give it to both sides; the client checks it)
  -n, --iters=<iters>    calls (default 1000 lat, 5000 bw; >= 5)
  -t, --tx-depth=<n>     outstanding calls (bw tests, default 16)
  -p, --port=<port>      TCP port of the exchange; the data plane uses port+1
                         (default 18515)
      --spin=<dur>       bx Config.Spin (default bx's; negative: event-driven)
      --eager-size=<n>   bx Config.EagerSize, both sides: the largest payload
                         sent in the message itself, larger ones by
                         rendezvous (default bx's, 8 KiB less the header)
      --split-size=<n>   bx Config.SplitSize, both sides: the largest payload
                         sent as several eager messages (parts) instead of by
                         rendezvous (default bx's, 9 receive buffers' worth;
                         -1: never)
      --zero-copy        bx_lat, both sides: the client writes each request
                         into a buffer from Endpoint.Alloc (its 8-byte count)
                         and calls CallBuffer; the echo handler builds its
                         response in place (Msg.Reply) from the request's
                         first 8 bytes: no payload is copied, as in raw
                         verbs' send_lat
      --shared-targets   bx Config.SharedTargets: one rkey for all rendezvous
                         targets, no memory window per transfer (the side
                         that receives rendezvous payloads decides)
      --idle=<dur>       client: before the measured calls, stay connected and
                         idle for <dur> and report this process's CPU time
                         over it (percent of a core)
      --json             print the results as one JSON object
      --cpuprofile=<f>   CPU profile of the measured loop
      --trace=<f>        Go execution trace of the measured loop (go tool
                         trace): which goroutine ran on which thread, and why
                         each one waited
      --samples=<f>      _lat tests, client: every call's full round trip in
                         usec, one a line in call order (what t_typical,
                         t_avg and p99 summarize)
`

// perfGRPCTests runs the grpc_* tests' gRPC side. perf_grpc.go, built
// only with -tags goverbs_grpc, sets perfGRPC; the shipped binary has no
// gRPC in it (about a hundred packages it would link otherwise).
type perfGRPCTests interface {
	// caller connects a client (over ep's bx Conns, or TCP when ep is
	// nil) and returns it with its close function.
	caller(ep *bx.Endpoint, addr string, size int) (perfCaller, func() error, error)
	// serve starts the echo server at laddr and returns its stop function.
	serve(ep *bx.Endpoint, laddr string, size int) (func(), error)
}

var perfGRPC perfGRPCTests

// errPerfNoGRPC is what a grpc_* test says in a goverbs built without gRPC.
var errPerfNoGRPC = &exitError{code: 1, msg: "this goverbs is built without gRPC: build it with -tags goverbs_grpc for the grpc_* tests (scripts/bench-bx --grpc does)"}

func runPerfBX(test string, args []string, stdout, stderr io.Writer) error {
	o := &perfBXOptions{test: test, bw: strings.HasSuffix(test, "_bw"), tcp: strings.Contains(test, "tcp_"), grpc: strings.HasPrefix(test, "grpc_")}
	fs := flag.NewFlagSet("goverbs perf "+test, flag.ContinueOnError)
	fs.SetOutput(stderr)
	for _, n := range []string{"d", "ib-dev"} {
		fs.StringVar(&o.dev, n, "", "")
	}
	for _, f := range []struct {
		p     *int
		names []string
		def   int
	}{{&o.size, []string{"s", "size"}, 64}, {&o.iters, []string{"n", "iters"}, 0}, {&o.window, []string{"t", "tx-depth"}, 16},
		{&o.port, []string{"p", "port"}, 18515}} {
		for _, n := range f.names {
			fs.IntVar(f.p, n, f.def, "")
		}
	}
	fs.IntVar(&o.resp, "resp-size", -1, "")
	fs.DurationVar(&o.spin, "spin", 0, "")
	fs.BoolVar(&o.shared, "shared-targets", false, "")
	fs.BoolVar(&o.zc, "zero-copy", false, "")
	fs.IntVar(&o.eager, "eager-size", 0, "")
	fs.IntVar(&o.split, "split-size", 0, "")
	fs.DurationVar(&o.idle, "idle", 0, "")
	fs.BoolVar(&o.json, "json", false, "")
	fs.StringVar(&o.cpuprof, "cpuprofile", "", "")
	fs.StringVar(&o.trace, "trace", "", "")
	fs.StringVar(&o.samples, "samples", "", "")
	fs.Usage = func() { fmt.Fprint(stderr, perfBXUsage) }
	rest, err := parseGetopt(fs, args)
	if err != nil {
		return err
	}
	if o.server, err = hostArg(rest); err != nil {
		return err
	}
	if o.grpc && perfGRPC == nil {
		return errPerfNoGRPC
	}
	set := givenFlags(fs)
	if !set["n"] && !set["iters"] {
		o.iters = 1000
		if o.bw {
			o.iters = 5000
		}
	}
	if set["resp-size"] && o.resp < 0 {
		return usageError("--resp-size %d: message size must be 0..%d", o.resp, perfMaxSize)
	}
	echo := !set["resp-size"]
	if echo {
		o.resp = o.size
	}
	switch {
	case o.size < 0 || o.size > perfMaxSize:
		return usageError("-s %d: message size must be 0..%d", o.size, perfMaxSize)
	case o.resp > perfMaxSize:
		return usageError("--resp-size %d: message size must be 0..%d", o.resp, perfMaxSize)
	case !echo && (o.bw || o.grpc):
		return usageError("--resp-size is for bx_lat and tcp_lat")
	case o.zc && (o.test != "bx_lat" || !echo):
		return usageError("--zero-copy is for bx_lat, with the response as large as the request")
	case o.eager != 0 && (o.tcp || o.grpc):
		return usageError("--eager-size is for the bx tests")
	case o.split != 0 && (o.tcp || o.grpc):
		return usageError("--split-size is for the bx tests")
	case o.iters < perfMinIters || o.iters > perfMaxIters:
		return usageError("-n %d: iterations must be %d..%d", o.iters, perfMinIters, perfMaxIters)
	case !o.bw && o.iters > perfMaxStamps:
		// measuredCalls keeps a timestamp per call (and latStats a
		// difference): -n 2^63-1 overflowed its make to a panic.
		return usageError("-n %d: a _lat test keeps a timestamp per call: iterations must be %d..%d", o.iters, perfMinIters, perfMaxStamps)
	case o.window < 1 || o.window > 1024:
		return usageError("-t %d: outstanding calls must be 1..1024", o.window)
	case o.port < 1 || o.port > 65534:
		return usageError("-p %d: TCP port must be 1..65534 (the data plane uses port+1)", o.port)
	case o.idle < 0 || o.idle > time.Hour:
		return usageError("--idle %v: must be 0..1h", o.idle)
	case o.idle > 0 && o.server == "":
		return usageError("--idle is the client's (it needs a HOST)")
	case o.samples != "" && o.bw:
		return usageError("--samples is for the _lat tests (a _bw test has calls outstanding, not one round trip at a time)")
	case o.samples != "" && o.server == "":
		return usageError("--samples is the client's (it needs a HOST)")
	}
	if err := checkEagerSize(o.eager); err != nil {
		return err
	}
	if err := checkSplitSize(o.split); err != nil {
		return err
	}
	// The output files are made now, so that a path that cannot be
	// written fails before the peer waits for us, not after the run.
	for _, f := range []struct{ flag, path string }{{"--samples", o.samples}, {"--trace", o.trace}} {
		if f.path == "" {
			continue
		}
		if err := os.WriteFile(f.path, nil, 0o644); err != nil {
			return usageError("%s: %v", f.flag, err)
		}
	}
	if !o.bw {
		o.window = 1
	}
	if set["d"] || set["ib-dev"] {
		if o.dev == "" {
			return usageError("-d \"\": empty device name")
		}
	}
	if !o.tcp {
		// A -d that names no device fails now, not after the server has
		// waited for a client (or the client reached the server).
		dev, err := pickDevice(o.dev)
		if err != nil {
			if o.dev != "" {
				return err
			}
			return fmt.Errorf("%w (-d names one; is rdma_rxe loaded and a device added?)", err)
		}
		o.dev = dev
	}
	return perfBXMain(o, stdout, stderr)
}

// cpuNow is this process's user + system CPU time.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// perfCaller makes one call of the test's transport.
type perfCaller interface {
	call(req []byte) ([]byte, func(), error)
}

// perfBXMain runs one side of a bx_*, tcp_* or grpc_* test: the steps
// below, each a method of perfBXRun. Whatever a step opens is closed when
// perfBXMain returns, the last opened first.
func perfBXMain(o *perfBXOptions, stdout, stderr io.Writer) error {
	r := newPerfBXRun(o, stdout, stderr)
	defer r.close()
	if err := r.connect(); err != nil {
		return err
	}
	if err := r.openEndpoint(); err != nil {
		return err
	}
	if err := r.startDataPlane(); err != nil {
		return err
	}
	if err := r.warmUp(); err != nil {
		return err
	}
	if err := r.startBarrier(); err != nil {
		return err
	}
	mine, peerB, err := r.measure()
	if err != nil {
		return err
	}
	peer, err := r.exchangeResults(mine, peerB)
	if err != nil {
		return err
	}
	return r.print(r.report(mine, peer))
}

// perfBXRun is one side of a run of perfBXMain and what its steps set up.
type perfBXRun struct {
	o        *perfBXOptions
	stdout   io.Writer
	info     io.Writer // the human messages: stdout, or stderr with --json
	client   bool
	params   perfParams
	req      []byte             // the client's request payload
	pc       *perfConn          // the exchange, on --port
	ep       *bx.Endpoint       // bx tests (and grpc_* over bx); nil for TCP
	caller   perfCaller         // the client's, on --port + 1
	idleCPU  *float64           // with --idle: the client's CPU, percent of a core
	counts   map[string]float64 // bx's counts per measured call (bx tests)
	times    []int64            // the client's _lat timestamps, for --samples
	cleanups []func()           // what close runs, the last added first
}

// newPerfBXRun is the run of o, before any step.
func newPerfBXRun(o *perfBXOptions, stdout, stderr io.Writer) *perfBXRun {
	r := &perfBXRun{o: o, stdout: stdout, info: stdout, client: o.server != "",
		params: perfParams{Version: perfWireVersion, Test: o.test, Conn: "RC", Sizes: []int{o.size}, Iters: o.iters, QPs: 1, PostList: 1, TxDepth: o.window}}
	if o.json {
		r.info = stderr
	}
	r.req = make([]byte, o.size)
	for i := range r.req {
		r.req[i] = byte(i)
	}
	return r
}

// atClose has close call f, before the functions given to it earlier.
func (r *perfBXRun) atClose(f func()) { r.cleanups = append(r.cleanups, f) }

// close closes what the steps opened, the last opened first.
func (r *perfBXRun) close() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// fail tells the peer about err, through the exchange, and returns it.
func (r *perfBXRun) fail(err error) error { r.pc.fail(err); return err }

// connect opens the exchange (the client dials, the server waits for it)
// and agrees on the parameters.
func (r *perfBXRun) connect() error {
	var err error
	if r.client {
		r.pc, err = perfDial(r.o.server, r.o.port)
	} else {
		printWaiting(r.info)
		r.pc, err = perfListen(r.o.port)
	}
	if err != nil {
		return err
	}
	pc := r.pc
	r.atClose(func() { pc.Close() })
	if !r.client {
		_, err := pc.clientParams(r.params)
		return err
	}
	if err := pc.send(perfMsg{Params: &r.params}); err != nil {
		return fmt.Errorf("couldn't send the parameters: %v", err)
	}
	_, err = pc.recv()
	return err
}

// openEndpoint opens the bx endpoint of a test over bx; the server's
// answers the calls.
func (r *perfBXRun) openEndpoint() error {
	o := r.o
	if o.tcp {
		return nil
	}
	token := []byte(perfToken)
	if t := os.Getenv("GOVERBS_PERF_TOKEN"); t != "" {
		token = []byte(t)
	}
	ep, err := bx.New(bx.Config{Device: o.dev, Token: token, Spin: o.spin, SharedTargets: o.shared, EagerSize: o.eager, SplitSize: o.split,
		MaxMessage: max(4<<20, o.size, o.resp, o.eager),
		LaneMsgs:   int64(max(64, 2*o.window))})
	if err != nil {
		return r.fail(err)
	}
	r.ep = ep
	r.atClose(func() { ep.Close() })
	// Only the server answers: a client endpoint with a handler
	// would wake its progress goroutine after every Call (requests
	// may arrive between Calls), which a client of bx does not pay.
	switch fixed := perfRespPayload(o); {
	case r.client:
	case fixed != nil:
		// Read-only: every call may return it at once.
		ep.HandleInline(1, func(context.Context, *bx.Peer, *bx.Msg) ([]byte, error) { return fixed, nil })
	case o.zc:
		ep.HandleInline(1, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
			resp, err := req.Reply(len(req.Data()))
			if err != nil {
				return nil, err
			}
			copy(resp, req.Data()[:min(8, len(req.Data()))])
			return resp, nil
		})
	default:
		ep.HandleInline(1, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) { return req.Data(), nil })
	}
	return nil
}

// startDataPlane connects the client's caller on --port + 1, or has the
// server listen there, send the parameters and accept the client.
func (r *perfBXRun) startDataPlane() error {
	if r.client {
		return r.dialDataPlane()
	}
	return r.serveDataPlane()
}

// dialDataPlane connects the client's caller: gRPC, TCP or a bx peer.
func (r *perfBXRun) dialDataPlane() error {
	o := r.o
	dataAddr := net.JoinHostPort(o.server, strconv.Itoa(o.port+1))
	// The server listens before it answers the hello.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if o.grpc {
		gc, closeGC, err := perfGRPC.caller(r.ep, dataAddr, o.size)
		if err != nil {
			return r.fail(err)
		}
		r.atClose(func() { closeGC() })
		r.caller = gc
	} else if o.tcp {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", dataAddr)
		if err != nil {
			return r.fail(err)
		}
		r.atClose(func() { c.Close() })
		r.caller = &perfTCPCaller{t: newPerfTCP(c)}
	} else {
		p, err := r.ep.Dial(ctx, dataAddr)
		if err != nil {
			return r.fail(err)
		}
		c := newPerfBXCaller(p)
		if o := r.o; o.zc {
			c.ep = r.ep
		}
		r.caller = c
	}
	return nil
}

// serveDataPlane starts the server's echo (gRPC, TCP or bx), then sends
// the parameters, the client's go-ahead, and accepts its bx peer.
func (r *perfBXRun) serveDataPlane() error {
	o := r.o
	laddr := ":" + strconv.Itoa(o.port+1)
	if o.grpc {
		stop, err := perfGRPC.serve(r.ep, laddr, o.size)
		if err != nil {
			return r.fail(err)
		}
		r.atClose(stop)
	} else if o.tcp {
		tl, err := net.Listen("tcp", laddr)
		if err != nil {
			return r.fail(err)
		}
		r.atClose(func() { tl.Close() })
		go perfTCPEcho(tl, perfRespPayload(o))
	} else if _, err := r.ep.Listen(laddr); err != nil {
		return r.fail(err)
	}
	if err := r.pc.send(perfMsg{Params: &r.params}); err != nil {
		return fmt.Errorf("couldn't send the parameters: %v", err)
	}
	// bx: the peer is accepted (its handshake done) before the start.
	if r.ep != nil && !o.grpc {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := r.ep.Accept(ctx)
		cancel()
		if err != nil {
			return r.fail(err)
		}
	}
	return nil
}

// warmUp makes the client's unmeasured calls, then with --idle measures
// its CPU time while connected and idle.
func (r *perfBXRun) warmUp() error {
	if !r.client {
		return nil
	}
	// A few calls so that both ends have their buffers and
	// connections in steady state; not measured.
	for range 10 {
		_, done, err := r.caller.call(r.req)
		if err != nil {
			return r.fail(err)
		}
		done()
	}
	if r.o.idle > 0 {
		// Both endpoints connected, nothing to do: what does it cost?
		// (The server waits for the start barrier meanwhile.)
		c0, t0 := cpuNow(), time.Now()
		time.Sleep(r.o.idle)
		pct := 100 * float64(cpuNow()-c0) / float64(time.Since(t0))
		r.idleCPU = &pct
	}
	return nil
}

// startBarrier starts the --cpuprofile profile and the --trace execution
// trace and meets the peer at the start barrier.
func (r *perfBXRun) startBarrier() error {
	stopProf, err := startCPUProfile(r.o.cpuprof)
	if err != nil {
		return r.fail(err)
	}
	r.atClose(stopProf)
	stopTrace, err := startExecTrace(r.o.trace)
	if err != nil {
		return r.fail(err)
	}
	r.atClose(stopTrace)
	if _, err := r.pc.barrier("start", nil); err != nil {
		return err
	}
	return nil
}

// measure is this process's measured share (the client's calls, or the
// server's wait for the client's end barrier, whose results are peerB)
// with its CPU time and bx counts per call.
func (r *perfBXRun) measure() (mine perfBXResult, peerB json.RawMessage, err error) {
	var before bx.Snapshot
	if r.ep != nil {
		before = r.ep.Snapshot()
	}
	cpu0 := cpuNow()
	if r.client {
		mine, err = r.measuredCalls()
	} else {
		peerB, err = r.awaitClientEnd()
	}
	if err != nil {
		return mine, nil, err
	}
	mine.CPU = float64(cpuNow()-cpu0) / 1e3 / float64(r.o.iters)
	if r.ep != nil {
		r.counts = perfBXCounts(before, r.ep.Snapshot(), r.o.iters)
	}
	// Written after the CPU time is taken, which it would add to.
	if err := writeSamples(r.o.samples, r.times); err != nil {
		return mine, nil, r.fail(err)
	}
	return mine, peerB, nil
}

// measuredCalls is the client's measured loop: perfBXBW's, or one call at
// a time with a timestamp before each.
func (r *perfBXRun) measuredCalls() (perfBXResult, error) {
	var mine perfBXResult
	o, caller, req := r.o, r.caller, r.req
	if o.bw {
		res, err := perfBXBW(caller, req, o.iters, o.window)
		if err != nil {
			return mine, r.fail(err)
		}
		mine.Bandwidth = &res
		return mine, nil
	}
	t := make([]int64, o.iters+1)
	base := time.Now()
	for i := range o.iters {
		t[i] = int64(time.Since(base))
		resp, done, err := caller.call(req)
		if err != nil {
			return mine, r.fail(fmt.Errorf("call %d: %v", i, err))
		}
		if len(resp) != o.resp {
			return mine, r.fail(fmt.Errorf("call %d: response of %d bytes, want %d", i, len(resp), o.resp))
		}
		done()
	}
	t[o.iters] = int64(time.Since(base))
	r.times = t
	res := latStats(t, o.size, 1)
	res.Iterations = o.iters
	mine.Latency = &res
	return mine, nil
}

// writeSamples writes --samples: the round trips between the timestamps
// t (taken before each call and after the last), usec, one a line. No
// file is asked for with path "".
func writeSamples(path string, t []int64) error {
	if path == "" {
		return nil
	}
	var b []byte
	for i := 1; i < len(t); i++ {
		b = strconv.AppendFloat(b, float64(t[i]-t[i-1])/1e3, 'f', 3, 64)
		b = append(b, '\n')
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("--samples: %w", err)
	}
	return nil
}

// awaitClientEnd is the server's share: it ends when the client is done.
// It waits for the client's end of the barrier and returns its results.
func (r *perfBXRun) awaitClientEnd() (json.RawMessage, error) {
	m, err := r.pc.recv()
	if err != nil {
		return nil, fmt.Errorf("barrier \"end\": %v", err)
	}
	if m.Sync != "end" {
		return nil, fmt.Errorf("barrier \"end\": the peer is at %q", m.Sync)
	}
	return m.Results, nil
}

// exchangeResults gives the peer mine at the end barrier and returns the
// peer's (the server has them already, in peerB).
func (r *perfBXRun) exchangeResults(mine perfBXResult, peerB json.RawMessage) (perfBXResult, error) {
	var peer perfBXResult
	b, _ := json.Marshal(mine)
	if r.client {
		var err error
		if peerB, err = r.pc.barrier("end", b); err != nil {
			return peer, err
		}
	} else if err := r.pc.send(perfMsg{Sync: "end", Results: b}); err != nil {
		return peer, fmt.Errorf("barrier \"end\": %v", err)
	}
	if err := json.Unmarshal(peerB, &peer); err != nil {
		return peer, fmt.Errorf("the peer's results %q: %v", peerB, err)
	}
	return peer, nil
}

// report is the run's report: the client's measurement, both CPU times.
func (r *perfBXRun) report(mine, peer perfBXResult) perfBXReport {
	o := r.o
	rep := perfBXReport{Test: o.test, Role: "server", MeasuredBy: "client", Device: o.dev, Transport: "bx", Window: o.window, Counts: r.counts, IdleCPU: r.idleCPU}
	if r.idleCPU != nil {
		rep.Idle = o.idle.String()
	}
	if o.tcp {
		rep.Transport, rep.Device = "tcp", ""
	} else {
		rep.Shared, rep.ZeroCopy, rep.EagerSize, rep.SplitSize = o.shared, o.zc, o.eager, o.split
		if o.spin != 0 {
			rep.Spin = o.spin.String()
		}
	}
	if o.grpc {
		rep.Transport = "grpc over " + rep.Transport
	}
	meas := peer
	if r.client {
		rep.Role = "client"
		meas = mine
		rep.CPU = perfBXCPU{Client: mine.CPU, Server: peer.CPU}
	} else {
		rep.CPU = perfBXCPU{Client: peer.CPU, Server: mine.CPU}
	}
	if o.bw {
		rep.Units = map[string]string{"bw_peak": "MiB/s", "bw_avg": "MiB/s", "msg_rate": "Mpps", "cpu": "usec/call"}
		if meas.Bandwidth != nil {
			rep.Bandwidth = []perfBWResult{*meas.Bandwidth}
		}
	} else {
		rep.Units = map[string]string{"t": "usec (full round trip)", "cpu": "usec/call"}
		if meas.Latency != nil {
			rep.Latency = []perfLatResult{*meas.Latency}
		}
	}
	return rep
}

// print writes rep to stdout: one JSON object with --json, else text.
func (r *perfBXRun) print(rep perfBXReport) error {
	o, stdout := r.o, r.stdout
	if o.json {
		b, err := json.Marshal(rep)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s\n", b)
		return err
	}
	if o.resp != o.size {
		fmt.Fprintf(stdout, "%s %s: %d bytes request, %d bytes response, full round trip, %d outstanding\n", rep.Test, rep.Transport, o.size, o.resp, o.window)
	} else {
		fmt.Fprintf(stdout, "%s %s: %d bytes each way, full round trip, %d outstanding\n", rep.Test, rep.Transport, o.size, o.window)
	}
	pr := perfReport{bw: o.bw, Latency: rep.Latency, Bandwidth: rep.Bandwidth}
	pr.printLast(stdout)
	fmt.Fprint(stdout, perfLine)
	fmt.Fprintf(stdout, " CPU per call [usec]: client %.2f, server %.2f\n", rep.CPU.Client, rep.CPU.Server)
	if rep.IdleCPU != nil {
		fmt.Fprintf(stdout, " idle for %v, connected: client CPU %.2f%% of a core\n", o.idle, *rep.IdleCPU)
	}
	return nil
}

// perfBXCounts is what the bx snapshot counted per call of the loop.
func perfBXCounts(a, b bx.Snapshot, iters int) map[string]float64 {
	n := float64(iters)
	return map[string]float64{
		"sent":           float64(b.Counters.Sent-a.Counters.Sent) / n,
		"received":       float64(b.Counters.Received-a.Counters.Received) / n,
		"credit_updates": float64(b.Counters.CreditUpdates-a.Counters.CreditUpdates) / n,
		"self_polled":    float64(b.Counters.SelfPolled-a.Counters.SelfPolled) / n,
		"resumes":        float64(b.Counters.Resumes-a.Counters.Resumes) / n,
		"hand_backs":     float64(b.Counters.HandBacks-a.Counters.HandBacks) / n,
		"deferred":       float64(b.Counters.Deferred-a.Counters.Deferred) / n,
		"arms":           float64(b.Counters.Arms-a.Counters.Arms) / n,
		"wakeups":        float64(b.Counters.Wakeups-a.Counters.Wakeups) / n,
		"ticks":          float64(b.Counters.Ticks-a.Counters.Ticks) / n,
		"compact":        float64(b.Counters.Compact-a.Counters.Compact) / n,
	}
}

// perfBXBW keeps window calls outstanding until iters are done.
func perfBXBW(c perfCaller, req []byte, iters, window int) (perfBWResult, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, window)
	start := time.Now()
	if tc, ok := c.(*perfTCPCaller); ok {
		if err := tc.t.pipeline(req, iters, window); err != nil {
			return perfBWResult{}, err
		}
	} else {
		for range window {
			wg.Add(1)
			c := c
			if cc, ok := c.(interface{ concurrent() perfCaller }); ok {
				c = cc.concurrent() // a caller of its own (gRPC: its response buffer)
			}
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(iters) {
					resp, done, err := c.call(req)
					if err != nil {
						errc <- err
						return
					}
					if len(resp) != len(req) {
						errc <- fmt.Errorf("response of %d bytes, want %d", len(resp), len(req))
						return
					}
					done()
				}
			}()
		}
		wg.Wait()
	}
	el := time.Since(start)
	select {
	case err := <-errc:
		return perfBWResult{}, err
	default:
	}
	const mib = 1 << 20
	bw := float64(len(req)) * float64(iters) / el.Seconds() / mib
	return perfBWResult{Bytes: len(req), Iterations: iters, BWPeak: bw, BWAvg: bw, MsgRate: float64(iters) / el.Seconds() / 1e6}, nil
}

// perfBXCaller calls on one goroutine: its release function, made once,
// releases the last response (a method value m.Release would be one
// allocation per call in the loop that bx_lat times).
type perfBXCaller struct {
	p   *bx.Peer
	m   *bx.Msg
	rel func()
	ep  *bx.Endpoint // --zero-copy: requests are written into its buffers
	n   uint64       // --zero-copy: the calls made, each request's first 8 bytes
}

func newPerfBXCaller(p *bx.Peer) *perfBXCaller {
	c := &perfBXCaller{p: p}
	c.rel = func() { c.m.Release() }
	return c
}

// concurrent is a caller of its own for one of bx_bw's goroutines.
func (c *perfBXCaller) concurrent() perfCaller { return newPerfBXCaller(c.p) }

func (c *perfBXCaller) call(req []byte) ([]byte, func(), error) {
	if c.ep != nil {
		return c.callBuffer(len(req))
	}
	m, err := c.p.Call(context.Background(), 1, req)
	if err != nil {
		return nil, nil, err
	}
	c.m = m
	return m.Data(), c.rel, nil
}

// callBuffer is call with --zero-copy: the request of n bytes is written
// where bx sends it from, and the response checked in place.
func (c *perfBXCaller) callBuffer(n int) ([]byte, func(), error) {
	b, err := c.ep.Alloc(n)
	if err != nil {
		return nil, nil, err
	}
	c.n++
	var stamp [8]byte
	binary.LittleEndian.PutUint64(stamp[:], c.n)
	copy(b.Payload(), stamp[:])
	m, err := c.p.CallBuffer(context.Background(), 1, b)
	if err != nil {
		return nil, nil, err
	}
	c.m = m
	if d := m.Data(); !bytes.Equal(d[:min(8, len(d))], stamp[:min(8, n)]) {
		m.Release()
		return nil, nil, fmt.Errorf("bx_lat --zero-copy: call %d answered %x", c.n, d[:min(8, len(d))])
	}
	return m.Data(), c.rel, nil
}

type perfTCPCaller struct{ t *perfTCP }

func (c *perfTCPCaller) call(req []byte) ([]byte, func(), error) {
	resp, err := c.t.call(req)
	return resp, func() {}, err
}

// perfTCP is the framing: a 4-byte length (header + payload), bx's
// header, the payload.
type perfTCP struct {
	c    net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	hdr  [4 + bx.HeaderSize]byte
	resp []byte
}

func newPerfTCP(c net.Conn) *perfTCP {
	return &perfTCP{c: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10)}
}

func (t *perfTCP) write(hdr []byte, req []byte) error {
	binary.LittleEndian.PutUint32(hdr[:4], uint32(bx.HeaderSize+len(req)))
	t.w.Write(hdr)
	t.w.Write(req)
	return t.w.Flush()
}

func (t *perfTCP) read() ([]byte, error) {
	if _, err := io.ReadFull(t.r, t.hdr[:]); err != nil {
		return nil, err
	}
	n := int(binary.LittleEndian.Uint32(t.hdr[:4])) - bx.HeaderSize
	if n < 0 || n > perfMaxSize {
		return nil, fmt.Errorf("frame of %d bytes", n)
	}
	// Grown as the bytes arrive, not to n at once: n is the peer's claim,
	// and one that claimed 8 MiB and sent nothing more held that much on
	// each connection.
	t.resp = t.resp[:0]
	for len(t.resp) < n {
		if len(t.resp) == cap(t.resp) {
			t.resp = slices.Grow(t.resp, min(n, max(2*cap(t.resp), 64<<10))-len(t.resp))
		}
		m, err := io.ReadFull(t.r, t.resp[len(t.resp):min(n, cap(t.resp))])
		t.resp = t.resp[:len(t.resp)+m]
		if err != nil {
			return t.resp, err
		}
	}
	return t.resp, nil
}

func (t *perfTCP) call(req []byte) ([]byte, error) {
	var hdr [4 + bx.HeaderSize]byte
	if err := t.write(hdr[:], req); err != nil {
		return nil, err
	}
	return t.read()
}

// pipeline sends iters requests with up to window unanswered.
func (t *perfTCP) pipeline(req []byte, iters, window int) error {
	sem := make(chan struct{}, window)
	errc := make(chan error, 1)
	go func() {
		var hdr [4 + bx.HeaderSize]byte
		for range iters {
			sem <- struct{}{}
			if err := t.write(hdr[:], req); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i := range iters {
		resp, err := t.read()
		if err != nil {
			return fmt.Errorf("response %d: %v", i, err)
		}
		if len(resp) != len(req) {
			return fmt.Errorf("response %d of %d bytes, want %d", i, len(resp), len(req))
		}
		<-sem
	}
	return <-errc
}

// perfRespPayload is the server's fixed response (--resp-size), or nil for
// an echo.
func perfRespPayload(o *perfBXOptions) []byte {
	if o.resp == o.size {
		return nil
	}
	b := make([]byte, o.resp)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

// perfTCPEcho answers every frame on every connection with its payload,
// or with fixed if it is not nil.
func perfTCPEcho(l net.Listener, fixed []byte) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		go func() {
			defer c.Close()
			t := newPerfTCP(c)
			var hdr [4 + bx.HeaderSize]byte
			for {
				p, err := t.read()
				if err != nil {
					return
				}
				if fixed != nil {
					p = fixed
				}
				// A pipelining client: flush only when nothing more is
				// buffered.
				binary.LittleEndian.PutUint32(hdr[:4], uint32(bx.HeaderSize+len(p)))
				t.w.Write(hdr[:])
				t.w.Write(p)
				if t.r.Buffered() == 0 {
					if t.w.Flush() != nil {
						return
					}
				}
			}
		}()
	}
}
