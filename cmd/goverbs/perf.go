package main

import (
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"runtime"
	"strings"
)

// goverbs perf: perftest's latency and bandwidth tests (ib_send_lat,
// ib_write_lat, ib_read_lat, ib_atomic_lat, ib_send_bw, ib_write_bw,
// ib_read_bw, ib_atomic_bw) on the goverbs API, with perftest's flags,
// defaults, measurement conventions and report format. The exchange is
// perftest's own, over TCP (perf_xchg.go) or with -R over rdma_cm
// (perf_cm.go), so either side may be perftest's ib_TEST.
//
// What is measured, as in perftest 4.5 (src/perftest_resources.c):
//
//   - send_lat (run_iter_lat_send): both sides ping-pong; the client sends
//     first. Per iteration: wait for the peer's message on the receive CQ
//     (repost that receive while rcnt+rx_depth <= iters), stamp the time,
//     post one signaled SEND, poll the send CQ for it.
//   - write_lat (run_iter_lat_write): both sides ping-pong with RDMA WRITE;
//     a side learns of the peer's write by spinning on the last byte of its
//     receive buffer (the peer writes the iteration number there), not by a
//     completion. Per iteration: wait for that byte, stamp, set the byte in
//     our send buffer, post one signaled WRITE, poll the send CQ for it.
//   - read_lat, atomic_lat (run_iter_lat): the client alone; stamp, post one
//     signaled READ (or FETCH_AND_ADD / CMP_AND_SWAP), poll the send CQ.
//   - latency report (print_report_lat): the n-1 differences between
//     consecutive stamps, sorted, the 2 largest dropped; t_min, t_max (the
//     largest kept), t_typical (median), t_avg, t_stdev, 99% and 99.9%
//     percentiles, in usec; send and write report half the round trip,
//     read and atomic the full one.
//   - *_bw (run_iter_bw): the client keeps up to tx_depth work requests in
//     flight per QP, posting post_list at a time (one doorbell per list),
//     every cq_mod-th signaled (and the last); the time of every post and
//     completion is stamped. BW average = bytes / (last completion - first
//     post); BW peak = the best such rate over any window from a post to a
//     later completion (unless -N or iters > 20000); MsgRate in Mpps. MB/sec
//     is MiB/s (2^20), as perftest prints it. The send_bw server receives
//     (run_iter_bw_server), reposting receives in batches.
//
// Defaults as perftest's: size 2 (lat), 65536 (bw), 8 (atomic); iters 1000
// (lat), 5000 (bw); tx depth 1 (lat), 128 (bw); rx depth 512; CQ moderation
// 100, or 1 above 8 KiB unless -Q, or the post list; outstanding reads the
// device maximum; inline data up to 220 (write lat), 236 (RC send lat), 188
// (UD send lat), 0 otherwise, and 0 on devices perftest does not know (rxe,
// siw: perftest 4.5 disables inline there, so we do too unless -I asks).
// No warm-up (perftest's is off unless --perform_warm_up).

type perfVerb int

const (
	verbSend perfVerb = iota
	verbWrite
	verbRead
	verbAtomic
)

type perfKind struct {
	name  string
	verb  perfVerb
	bw    bool
	title string
}

var perfKinds = []perfKind{
	{"send_lat", verbSend, false, "Send Latency Test"},
	{"write_lat", verbWrite, false, "RDMA_Write Latency Test"},
	{"read_lat", verbRead, false, "RDMA_Read Latency Test"},
	{"atomic_lat", verbAtomic, false, "Atomic Latency Test"},
	{"send_bw", verbSend, true, "Send BW Test"},
	{"write_bw", verbWrite, true, "RDMA_Write BW Test"},
	{"read_bw", verbRead, true, "RDMA_Read BW Test"},
	{"atomic_bw", verbAtomic, true, "Atomic BW Test"},
}

// Limits, as perftest's (perftest_parameters.h).
const (
	perfMaxSize    = 8 << 20 // MAX_SIZE
	perfMinIters   = 5       // MIN_ITER
	perfMaxTx      = 15000   // MAX_TX
	perfMaxRx      = 16384   // MAX_RX
	perfMaxQPs     = 16384   // MAX_QP_NUM
	perfMaxCQMod   = 1024    // MAX_CQ_MOD
	perfMaxInline  = 1024    // MAX_INLINE
	perfNoPeakOver = 20000   // iters above which perftest skips the peak
	perfCQModLimit = 8192    // MSG_SIZE_CQ_MOD_LIMIT
	perfUDMaxRx    = 16000   // UC_MAX_RX
	perfQKey       = 0x11111111
	// perfMaxStamps bounds the timestamps a run keeps, one or two int64
	// per message (iterations times QPs): 2^27 of them take 1 or 2 GiB,
	// and an allocation the machine cannot make is a fatal error in Go,
	// not an error to report (perftest's malloc fails cleanly instead).
	perfMaxStamps = 1 << 27
	perfMaxIters  = 1<<31 - 1
)

type perfOptions struct {
	kind     perfKind
	dev      string
	ibPort   int
	gidx     int
	size     int
	iters    int
	all      bool
	postList int
	qps      int
	events   bool
	port     int
	conn     string
	mtu      int
	txDepth  int
	rxDepth  int
	cqMod    int
	inline   int
	outReads int
	atomic   string
	noPeak   bool
	json     bool
	cpuprof  string
	server   string // the host to connect to; "" for the server
	cpuFreqF bool
	dontXchg bool
	rdmaCM   bool

	// serverAddr is server resolved, with -R (rdma_cm resolves an
	// address, not a name).
	serverAddr netip.Addr

	set map[string]bool // flags given on the command line, by long name

	// Resolved by resolve (and, for the device-dependent ones, by setup).
	sizes []int
}

func (o *perfOptions) given(name string) bool { return o.set[name] }

func perfFlags(stderr io.Writer) (*flag.FlagSet, *perfOptions) {
	o := &perfOptions{}
	fs := flag.NewFlagSet("goverbs perf", flag.ContinueOnError)
	fs.SetOutput(stderr)
	both := func(short, long string, f func(name string)) {
		if short != "" {
			f(short)
		}
		f(long)
	}
	intFlag := func(p *int, short, long string, def int, usage string) {
		both(short, long, func(n string) { fs.IntVar(p, n, def, usage) })
	}
	boolFlag := func(p *bool, short, long string, usage string) {
		both(short, long, func(n string) { fs.BoolVar(p, n, false, usage) })
	}
	strFlag := func(p *string, short, long, def, usage string) {
		both(short, long, func(n string) { fs.StringVar(p, n, def, usage) })
	}
	strFlag(&o.dev, "d", "ib-dev", "", "use IB device `dev` (default first device found)")
	intFlag(&o.ibPort, "i", "ib-port", 1, "use `port` of IB device")
	intFlag(&o.gidx, "x", "gid-index", -1, "local port GID `index` (default: the RoCE v2 IPv4 GID)")
	intFlag(&o.size, "s", "size", 0, "`size` of message")
	intFlag(&o.iters, "n", "iters", 0, "number of exchanges")
	boolFlag(&o.all, "a", "all", "run sizes from 2 to 2^23")
	intFlag(&o.postList, "l", "post_list", 1, "post `n` work requests with one doorbell (bw tests)")
	intFlag(&o.qps, "q", "qp", 1, "number of QPs (bw tests)")
	boolFlag(&o.events, "e", "events", "sleep on CQ events")
	intFlag(&o.port, "p", "port", 18515, "listen on/connect to TCP `port`")
	strFlag(&o.conn, "c", "connection", "RC", "connection type RC or UD (UD: send tests)")
	intFlag(&o.mtu, "m", "mtu", 0, "path MTU: 256..4096 (default the port's active MTU)")
	intFlag(&o.txDepth, "t", "tx-depth", 0, "size of the tx queue (default 128 bw, 1 lat)")
	intFlag(&o.rxDepth, "r", "rx-depth", 512, "receives to keep posted (send tests)")
	intFlag(&o.cqMod, "Q", "cq-mod", 100, "a completion every `n` sends (bw tests)")
	intFlag(&o.inline, "I", "inline_size", -1, "max `size` of message to send inline (default: perftest's, see docs)")
	intFlag(&o.outReads, "o", "outs", 0, "outstanding reads/atomics (default device max)")
	strFlag(&o.atomic, "A", "atomic_type", "FETCH_AND_ADD", "atomic `type`: CMP_AND_SWAP or FETCH_AND_ADD")
	boolFlag(&o.noPeak, "N", "noPeak", "do not compute the peak bandwidth")
	boolFlag(&o.rdmaCM, "R", "rdma_cm", "connect the QPs with rdma_cm and run the exchange over it (perftest's -R)")
	boolFlag(&o.cpuFreqF, "F", "CPU-freq", "accepted for perftest compatibility; goverbs does not count cycles")
	fs.BoolVar(&o.dontXchg, "dont_xchg_versions", false, "do not exchange versions, page sizes and MTU with the peer")
	fs.BoolVar(&o.json, "json", false, "print one JSON object with the results instead of the report")
	fs.StringVar(&o.cpuprof, "cpuprofile", "", "write a CPU profile of the measured loops to `file` (debugging)")
	fs.Usage = func() { fmt.Fprint(stderr, perfUsage) }
	return fs, o
}

const perfUsage = `Usage:
  goverbs perf TEST [options]          start a server and wait for connection
  goverbs perf TEST [options] <host>   connect to server at <host>

TEST is send_lat, write_lat, read_lat, atomic_lat, send_bw, write_bw,
read_bw or atomic_bw: perftest's ib_TEST, with its flags, defaults and
report. The exchange is perftest's, over TCP or with -R over rdma_cm:
either side may be perftest's ib_TEST or goverbs perf. The exchange does
not carry -s, -n or -c: both sides must be given the same; a latency test
whose peer disagrees fails after 10 s without progress, and so does a step
of the exchange that hears nothing from the peer.
bx_lat, tcp_lat, bx_bw and tcp_bw compare ByteExpress calls with the same
framing over kernel TCP (goverbs perf bx_lat --help).

Options:
  -d, --ib-dev=<dev>        use IB device <dev> (default first device found)
  -i, --ib-port=<port>      use port <port> of IB device (default 1)
  -x, --gid-index=<index>   local port GID index (default: the RoCE v2 IPv4 GID)
  -s, --size=<size>         message size (default 2 lat, 65536 bw, 8 atomic;
                            1..8388608)
  -n, --iters=<iters>       number of exchanges (default 1000 lat, 5000 bw; >= 5)
  -a, --all                 run sizes 2 .. 2^23 (UD: up to the MTU)
  -l, --post_list=<n>       post lists of n work requests, one doorbell each
                            (bw tests; iters must be a multiple of n)
  -q, --qp=<n>              number of QPs (bw tests, default 1)
  -e, --events              sleep on CQ events instead of busy polling
  -p, --port=<port>         TCP port of the exchange (default 18515)
  -c, --connection=<RC|UD>  connection type (default RC; UD for send tests)
  -m, --mtu=<mtu>           path MTU (default the port's active MTU)
  -t, --tx-depth=<dep>      tx queue depth (default 128 bw, 1 lat)
  -r, --rx-depth=<dep>      receives to keep posted (default 512, send tests)
  -Q, --cq-mod=<n>          one completion every n sends (default 100; 1 above
                            8 KiB; the post list size with -l)
  -I, --inline_size=<size>  max inline message size (default as perftest: 220
                            write lat, 236 RC send lat, 188 UD send lat, else 0;
                            0 on rxe and siw, which perftest does not know)
  -o, --outs=<n>            outstanding reads/atomics (default device max)
  -A, --atomic_type=<type>  CMP_AND_SWAP or FETCH_AND_ADD (default)
  -N, --noPeak              skip the peak bandwidth
  -R, --rdma_cm             connect the QPs with rdma_cm and run the exchange
                            over an rdma_cm connection (perftest's -R; both
                            sides must give it; rdma_cm picks the device)
  -F, --CPU-freq            accepted and ignored (perftest compatibility)
      --dont_xchg_versions  skip the exchange of versions, page sizes and MTU
                            (perftest 4.5-0.17 itself then refuses the peer)
      --json                print the results as one JSON object
      --cpuprofile=<file>   CPU profile of the measured loops (debugging)
`

func perfKindByName(name string) (perfKind, bool) {
	for _, k := range perfKinds {
		if k.name == name {
			return k, true
		}
	}
	return perfKind{}, false
}

func perfTestNames() string {
	var s []string
	for _, k := range perfKinds {
		s = append(s, k.name)
	}
	return strings.Join(s, ", ")
}

// resolve checks the command line and applies perftest's defaults and
// dependencies (force_dependecies) that need no device.
func (o *perfOptions) resolve() error {
	k := o.kind
	lat := !k.bw
	if !o.given("size") {
		switch {
		case k.verb == verbAtomic:
			o.size = 8
		case lat:
			o.size = 2
		default:
			o.size = 65536
		}
	}
	if !o.given("iters") {
		o.iters = 1000
		if k.bw {
			o.iters = 5000
		}
	}
	o.conn = strings.ToUpper(o.conn)
	switch {
	case o.given("ib-dev") && o.dev == "":
		return usageError("-d \"\": empty device name (leave -d out for the first device)")
	case o.size < 1 || o.size > perfMaxSize:
		return usageError("-s %d: message size must be 1..%d", o.size, perfMaxSize)
	case k.verb == verbAtomic && o.size != 8:
		return usageError("-s %d: atomic operations are 8 bytes; message size cannot be changed for atomic tests", o.size)
	case k.verb == verbAtomic && o.all:
		return usageError("-a: atomic tests have one message size (8)")
	case o.iters < perfMinIters || o.iters > perfMaxIters:
		return usageError("-n %d: iterations must be %d..%d", o.iters, perfMinIters, perfMaxIters)
	case o.port < 0 || o.port > 65535:
		return usageError("-p %d: TCP port must be 0..65535", o.port)
	case o.ibPort < 1 || o.ibPort > 255:
		return usageError("-i %d: IB port must be 1..255", o.ibPort)
	case o.gidx < -1 || o.gidx > 255:
		return usageError("-x %d: GID index must be 0..255", o.gidx)
	case o.conn != "RC" && o.conn != "UD":
		return usageError("-c %s: connection type must be RC or UD", o.conn)
	case o.conn == "UD" && k.verb != verbSend:
		return usageError("-c UD: only send_lat and send_bw run on UD (RDMA and atomics need RC)")
	case o.qps < 1 || o.qps > perfMaxQPs:
		return usageError("-q %d: number of QPs must be 1..%d", o.qps, perfMaxQPs)
	case o.iters > perfMaxStamps/o.qps:
		return usageError("-n %d with -q %d: at most %d messages in all (iterations times QPs: a timestamp is kept for each)", o.iters, o.qps, perfMaxStamps)
	case lat && o.qps != 1:
		return usageError("-q %d: latency tests use one QP", o.qps)
	case o.postList < 1 || o.postList > perfMaxTx:
		return usageError("-l %d: post list must be 1..%d", o.postList, perfMaxTx)
	case lat && o.postList != 1:
		return usageError("-l %d: the post list is for bw tests", o.postList)
	case k.bw && o.iters%o.postList != 0:
		return usageError("-n %d: the number of iterations must be a multiple of the post list (-l %d)", o.iters, o.postList)
	case o.given("tx-depth") && (o.txDepth < 1 || o.txDepth > perfMaxTx):
		return usageError("-t %d: tx depth must be 1..%d", o.txDepth, perfMaxTx)
	case o.rxDepth < 1 || o.rxDepth > perfMaxRx:
		return usageError("-r %d: rx depth must be 1..%d", o.rxDepth, perfMaxRx)
	case o.cqMod < 1 || o.cqMod > perfMaxCQMod:
		return usageError("-Q %d: CQ moderation must be 1..%d", o.cqMod, perfMaxCQMod)
	case o.inline < -1 || o.inline > perfMaxInline || o.given("inline_size") && o.inline < 0:
		return usageError("-I %d: inline size must be 0..%d", o.inline, perfMaxInline)
	case o.outReads < 0 || o.outReads > 255 || o.given("outs") && o.outReads == 0:
		return usageError("-o %d: outstanding reads must be 1..255", o.outReads)
	case (o.mtu != 0 || o.given("mtu")) && o.mtu != 256 && o.mtu != 512 && o.mtu != 1024 && o.mtu != 2048 && o.mtu != 4096:
		return usageError("-m %d: path MTU must be 256, 512, 1024, 2048 or 4096", o.mtu)
	}
	o.atomic = strings.ToUpper(o.atomic)
	if o.atomic != "FETCH_AND_ADD" && o.atomic != "CMP_AND_SWAP" {
		return usageError("-A %s: atomic type must be CMP_AND_SWAP or FETCH_AND_ADD", o.atomic)
	}
	if o.given("atomic_type") && k.verb != verbAtomic {
		return usageError("-A is for atomic tests")
	}

	// tx depth: 1 for latency tests (DEF_TX_LAT), 128 for bw, at most iters.
	if lat {
		o.txDepth = 1
	} else if !o.given("tx-depth") {
		o.txDepth = 128
	}
	if o.txDepth > o.iters {
		o.txDepth = o.iters
	}
	if k.bw && o.txDepth < o.postList {
		return usageError("-t %d: tx depth must hold a whole post list (-l %d)", o.txDepth, o.postList)
	}
	// rx depth: receives are posted for send tests only.
	if k.verb != verbSend {
		o.rxDepth = 1
	} else {
		if o.rxDepth > o.iters {
			o.rxDepth = o.iters
		}
		if o.conn == "UD" && !o.given("rx-depth") {
			o.rxDepth = min(o.iters, perfUDMaxRx)
		}
	}
	// CQ moderation.
	if lat {
		o.cqMod = 1
	} else {
		if o.size > perfCQModLimit && o.conn != "UD" && !o.all && !o.events && !o.given("cq-mod") {
			o.cqMod = 1
		}
		if o.postList > 1 {
			if !o.given("cq-mod") {
				o.cqMod = o.postList
			} else if o.postList%o.cqMod != 0 {
				return usageError("-l %d: the post list must be a multiple of the CQ moderation (-Q %d)", o.postList, o.cqMod)
			}
		}
		if o.cqMod > o.txDepth {
			o.cqMod = o.txDepth
		}
	}
	if k.verb == verbRead || k.verb == verbAtomic {
		if o.given("inline_size") && o.inline > 0 {
			return usageError("-I %d: reads and atomics carry no data to inline", o.inline)
		}
		o.inline = 0
	}
	if k.bw && o.iters > perfNoPeakOver {
		o.noPeak = true
	}
	o.sizes = []int{o.size}
	if o.all {
		o.sizes = o.sizes[:0]
		for i := 1; i <= 23; i++ {
			o.sizes = append(o.sizes, 1<<i)
		}
	}
	return nil
}

func runPerf(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && perfBXTests[args[0]] {
		// Go's own scheduling, not perftest's one thread: bx runs a
		// progress goroutine next to the caller.
		return runPerfBX(args[0], args[1:], stdout, stderr)
	}
	// One busy-polling goroutine, like perftest's one thread (docs/perf.md).
	if os.Getenv("GOMAXPROCS") == "" {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	}
	fs, o := perfFlags(stderr)
	if len(args) == 0 {
		fs.Usage()
		return &exitError{code: 1}
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, perfUsage)
		return nil
	}
	k, ok := perfKindByName(args[0])
	if !ok {
		return usageError("unknown test %q: want one of %s", args[0], perfTestNames())
	}
	o.kind = k
	rest, err := parseGetopt(fs, args[1:])
	if err != nil {
		return err
	}
	o.set = map[string]bool{}
	long := map[string]string{"d": "ib-dev", "i": "ib-port", "x": "gid-index", "s": "size", "n": "iters",
		"a": "all", "l": "post_list", "q": "qp", "e": "events", "p": "port", "c": "connection", "m": "mtu",
		"t": "tx-depth", "r": "rx-depth", "Q": "cq-mod", "I": "inline_size", "o": "outs", "A": "atomic_type",
		"N": "noPeak", "F": "CPU-freq", "R": "rdma_cm"}
	fs.Visit(func(f *flag.Flag) {
		if l, ok := long[f.Name]; ok {
			o.set[l] = true
		} else {
			o.set[f.Name] = true
		}
	})
	if o.server, err = hostArg(rest); err != nil {
		return err
	}
	if err := o.resolve(); err != nil {
		return err
	}
	if o.rdmaCM && o.server != "" {
		// As the rdma_cm tools' flags (hostFlag): a bad HOST is a usage
		// error naming it, before rdma_cm is opened.
		if o.serverAddr, err = hostFlag("HOST", "server address", o.server); err != nil {
			return err
		}
	}
	return perfMain(o, stdout, stderr)
}
