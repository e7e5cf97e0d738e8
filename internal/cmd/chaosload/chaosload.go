// Command chaosload is the load that scripts/chaos drives while it injects
// faults (docs/reliability.md). It is a test tool, not part of the goverbs
// binary: scripts/chaos builds it (CGO_ENABLED=0, on the host) and runs it
// in the rxe guest.
//
//	chaosload serve  --device rxe1 --listen 10.99.0.2:18900
//	chaosload drive  --device rxe0 --peer 10.99.0.2:18900 --duration 20s
//	chaosload verify --device rxe0 --peer 10.99.0.2:18900 --journal F
//	chaosload stats  --device rxe0 --peer 10.99.0.2:18900
//	chaosload break  --pid PID [--state err|sqd]
//
// serve is a bx endpoint with three handlers: "apply" (stream 1) records a
// request id in a ledger and applies it the first time only, so a retried
// id is de-duplicated; "stats" (stream 2) answers the ledger summary and
// the process's own resources as JSON; "check" (stream 3) answers, for a
// list of ids, whether each was applied and how often it was delivered.
// SIGUSR1 makes every apply handler hold its request (and so its receive
// buffer: the receiver stops returning credits) for --stall. SIGUSR2
// writes MODIFY_QP to ERR for handles 0..255 on every uverbs descriptor of
// the process: its QPs forced to ERROR from outside. SIGHUP does the
// same with SQD: its QPs stop sending and report no error (a stall).
// break does either to another process (a goverbs ps server, say), from
// outside: pidfd_getfd(2) duplicates its uverbs descriptors.
//
// drive issues calls with unique ids (a random 32-bit run prefix and a
// sequence number) and retries an id, with the same id, after any error
// until --give-up: re-dialing when the peer is gone. Each id ends exactly
// once, acknowledged or failed. Acknowledged ids are journaled with the
// server incarnation that acknowledged them, and checked against the
// ledger at the end (and every --report-every): an id acknowledged by the
// current incarnation must be applied there, exactly once; ids
// acknowledged by an incarnation that has since been killed are counted as
// lost with the server's state, not as violations. drive then closes its
// peer and checks its own leaks: allocator buffers back to the idle
// baseline, no QP left, goroutines and fds back to the baseline.
//
// Exit status: 0; 1 for a bad command line or any other error; 3 when
// invariants are violated (drive, verify, stats --check).
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/bits"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/flow"
	"github.com/goverbs/goverbs/internal/cli"
	"github.com/goverbs/goverbs/internal/procstat"
	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
)

const (
	chaosStreamApply = 1
	chaosStreamStats = 2
	chaosStreamCheck = 3
	chaosTokenEnv    = "GOVERBS_CHAOS_TOKEN"
	chaosReqHeader   = 12 // id (8) and attempt (4)
)

func chaosToken() []byte {
	if t := os.Getenv(chaosTokenEnv); len(t) >= 16 {
		return []byte(t)
	}
	return []byte("goverbs-chaos-load-dev-token")
}

const chaosUsage = `Usage: chaosload serve|drive|verify|stats|break [flags]

A developer load for scripts/chaos (docs/reliability.md): a bx RPC server
with an exactly-once ledger, and a driver that retries every id until it is
acknowledged. 'break --pid PID' forces every QP of another process (a
goverbs ps server, say) to ERR, or to SQD, from outside.
Run 'chaosload COMMAND -h' for flags.
`

func main() {
	os.Exit(cli.Exit("chaosload", runChaosLoad(os.Args[1:], os.Stdout, os.Stderr), os.Stderr))
}

// chaosCommands are chaosload's commands by name.
var chaosCommands = map[string]func(args []string, stdout, stderr io.Writer) error{
	"serve":  chaosServe,
	"drive":  chaosDrive,
	"verify": chaosVerifyCmd,
	"stats":  chaosStatsCmd,
	"break":  chaosBreakCmd,
}

func runChaosLoad(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, chaosUsage)
		return &cli.ExitError{Code: 1}
	}
	if run, ok := chaosCommands[args[0]]; ok {
		return run(args[1:], stdout, stderr)
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, chaosUsage)
		return nil
	}
	return &cli.ExitError{Code: 1, Msg: fmt.Sprintf("unknown chaosload command %q", args[0])}
}

// The bounds of the flags, checked before anything is opened, so that a
// bad value is refused at once with a message naming the flag and the
// value.
const (
	// chaosMaxDuration bounds every duration flag: a year, past any run,
	// and short enough that sums of them (drive's hard end is --duration
	// + --give-up + 30 s) cannot overflow.
	chaosMaxDuration = 8760 * time.Hour
	chaosMaxConc     = 1 << 16 // drive's calls in flight, a goroutine each
	// drive --rate: the ticker's period (1 s / rate) is 1 ns to
	// chaosMaxDuration.
	chaosMaxRate = 1e9
	chaosMinRate = float64(time.Second) / float64(chaosMaxDuration)
	chaosMaxPID  = 1 << 22 // PID_MAX_LIMIT of 64-bit Linux
	// bx's and mr's bounds, which bx.New checks too, but in its own
	// words (naming no flag) or, for the memory, only once the device is
	// open.
	chaosMaxCredits    = 1 << 20 // bx's maxGrant: what a peer accepts
	chaosMaxPeers      = 1 << 16 // bx's maxPeers
	chaosMaxLanes      = 4
	chaosMinMemLimit   = 64 << 10             // mr's granule, its least Limit
	chaosEagerSize     = 8192 - bx.HeaderSize // bx's default EagerSize: the least MaxMessage
	chaosMaxMessage    = 1 << 31              // mr's buffers are a power of 2 below 4 GiB
	chaosDefMaxMessage = 4 << 20              // bx's default MaxMessage
	chaosDefMemLimit   = 1 << 30              // bx's default MemoryLimit
	chaosDefCredits    = 64                   // bx's default Credits
	chaosDefLanes      = 2                    // bx's default Lanes
	chaosLaneMsgs      = 64                   // bx's default LaneMsgs
	chaosMaxBacklog    = 1 << 22              // bx's maxBacklog: handler calls queued
	chaosEagerBuf      = 8192                 // a receive buffer: the default EagerSize and the header
)

// chaosBad is a bad command line of command cmd: exit status 1 and a
// message naming the flag and its value.
func chaosBad(cmd, format string, a ...any) error {
	return &cli.ExitError{Code: 1, Msg: cmd + ": " + fmt.Sprintf(format, a...)}
}

// chaosParse parses the command line of cmd, which takes no operands, into
// fs.
func chaosParse(cmd string, fs *flag.FlagSet, args []string) error {
	rest, err := cli.ParseGetopt(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return chaosBad(cmd, "unexpected arguments %q", rest)
	}
	return nil
}

// chaosDuration checks d, the value of duration flag name of cmd: more
// than 0 (or 0 as well, if zero says what 0 is) and at most
// chaosMaxDuration.
func chaosDuration(cmd, name string, d time.Duration, zero string) error {
	switch {
	case d > 0 && d <= chaosMaxDuration || d == 0 && zero != "":
		return nil
	case zero != "":
		return chaosBad(cmd, "%s %v: want 0 (%s) up to %v", name, d, zero, chaosMaxDuration)
	}
	return chaosBad(cmd, "%s %v: want more than 0, at most %v", name, d, chaosMaxDuration)
}

// chaosAddr checks addr, the value of address flag name of cmd: HOST:PORT
// (an empty HOST is this host), as bx dials and listens on it.
func chaosAddr(cmd, name, addr string) error {
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return chaosBad(cmd, "%s %q: want HOST:PORT", name, addr)
	}
	return nil
}

// chaosEndpointFlags are the bx.Config knobs both roles share.
type chaosEndpointFlags struct {
	cmd         string // the command, for the messages
	device      *string
	credits     *int
	maxPeers    *int
	lanes       *int
	memLimit    *int64
	maxMessage  *int
	peerTimeout *time.Duration
}

// chaosFlags is the flag set of command cmd, with the endpoint flags
// (device dev by default) defined.
func chaosFlags(cmd, dev string, stderr io.Writer) (*flag.FlagSet, chaosEndpointFlags) {
	fs := flag.NewFlagSet("chaosload "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs, chaosEndpointFlags{
		cmd:         cmd,
		device:      fs.String("device", dev, "RDMA device"),
		credits:     fs.Int("credits", 0, "bx Config.Credits (0: default 64)"),
		maxPeers:    fs.Int("max-peers", 4, "bx Config.MaxPeers"),
		lanes:       fs.Int("lanes", 0, "bx Config.Lanes (0: default 2)"),
		memLimit:    fs.Int64("memory-limit", 0, "bx Config.MemoryLimit per buffer pool in bytes (0: default 1 GiB)"),
		maxMessage:  fs.Int("max-message", 0, "bx Config.MaxMessage (0: default 4 MiB)"),
		peerTimeout: fs.Duration("peer-timeout", 0, "bx Config.PeerTimeout (0: default 10s)"),
	}
}

// check checks the endpoint flags against bx's bounds (and mr's, for the
// memory), naming the flag and its value.
func (f chaosEndpointFlags) check() error {
	cmd := f.cmd
	switch {
	case *f.device == "":
		return chaosBad(cmd, `--device "": want an RDMA device name`)
	case *f.credits != 0 && (*f.credits < flow.MinGrant || *f.credits > chaosMaxCredits):
		return chaosBad(cmd, "--credits %d: want %d..%d (0: bx's default, 64)", *f.credits, flow.MinGrant, chaosMaxCredits)
	case *f.maxPeers < 1 || *f.maxPeers > chaosMaxPeers:
		return chaosBad(cmd, "--max-peers %d: want 1..%d", *f.maxPeers, chaosMaxPeers)
	case *f.lanes < 0 || *f.lanes > chaosMaxLanes:
		return chaosBad(cmd, "--lanes %d: want 1..%d (0: bx's default, 2)", *f.lanes, chaosMaxLanes)
	case *f.memLimit != 0 && (*f.memLimit < chaosMinMemLimit || *f.memLimit > mr.MaxAllocatorLimit):
		return chaosBad(cmd, "--memory-limit %d: want %d..%d bytes (0: bx's default, 1 GiB)", *f.memLimit, chaosMinMemLimit, int64(mr.MaxAllocatorLimit))
	case *f.maxMessage != 0 && (*f.maxMessage < chaosEagerSize || *f.maxMessage > chaosMaxMessage):
		return chaosBad(cmd, "--max-message %d: want %d (bx's eager size)..%d bytes (0: bx's default, 4 MiB)", *f.maxMessage, chaosEagerSize, chaosMaxMessage)
	case f.maxMessageBuf() > f.memoryLimit():
		return chaosBad(cmd, "--max-message %d: a buffer for it (%d bytes) does not fit the memory limit (%d bytes per pool; --memory-limit)",
			f.maxMessageSize(), f.maxMessageBuf(), f.memoryLimit())
	case f.backlog() > chaosMaxBacklog:
		return chaosBad(cmd, "--max-peers %d with %d credits and %d lanes: %d handler calls queued at most, above bx's %d",
			*f.maxPeers, f.creditCount(), f.laneCount(), f.backlog(), chaosMaxBacklog)
	case f.receiveBytes() > f.memoryLimit():
		return chaosBad(cmd, "--max-peers %d with %d credits: the receive buffers bx posts (%d bytes, %d each) do not fit the memory limit (%d bytes per pool; --memory-limit)",
			*f.maxPeers, f.creditCount(), f.receiveBytes(), chaosEagerBuf, f.memoryLimit())
	}
	return chaosDuration(cmd, "--peer-timeout", *f.peerTimeout, "bx's default, 10s")
}

// creditCount is the endpoint's receive buffers per peer.
func (f chaosEndpointFlags) creditCount() int {
	if *f.credits != 0 {
		return *f.credits
	}
	return chaosDefCredits
}

// laneCount is the endpoint's QPs per peer.
func (f chaosEndpointFlags) laneCount() int {
	if *f.lanes != 0 {
		return *f.lanes
	}
	return chaosDefLanes
}

// backlog is the most handler calls bx queues (bx's Config.backlog, with
// the default LaneMsgs).
func (f chaosEndpointFlags) backlog() int64 {
	return int64(*f.maxPeers) * (int64(f.creditCount()) + int64(f.laneCount())*chaosLaneMsgs)
}

// receiveBytes is the memory of the receive buffers bx.New posts: for
// each peer, a buffer of the eager size and the header for each credit.
func (f chaosEndpointFlags) receiveBytes() int64 {
	return int64(*f.maxPeers) * int64(f.creditCount()) * chaosEagerBuf
}

// maxMessageSize is the endpoint's largest payload.
func (f chaosEndpointFlags) maxMessageSize() int {
	if *f.maxMessage != 0 {
		return *f.maxMessage
	}
	return chaosDefMaxMessage
}

// memoryLimit is the endpoint's limit of each buffer pool.
func (f chaosEndpointFlags) memoryLimit() int64 {
	if *f.memLimit != 0 {
		return *f.memLimit
	}
	return chaosDefMemLimit
}

// maxMessageBuf is the buffer of the largest message: the power of 2 that
// holds it, at least mr's granule (what mr fits in the limit).
func (f chaosEndpointFlags) maxMessageBuf() int64 {
	return max(int64(1)<<bits.Len(uint(f.maxMessageSize()-1)), chaosMinMemLimit)
}

func (f chaosEndpointFlags) config() bx.Config {
	return bx.Config{Device: *f.device, Token: chaosToken(), Credits: *f.credits, MaxPeers: *f.maxPeers,
		Lanes: *f.lanes, MemoryLimit: *f.memLimit, MaxMessage: *f.maxMessage, PeerTimeout: *f.peerTimeout}
}

// chaosProc is what a process reports about its own resources.
type chaosProc struct {
	PID        int            `json:"pid"`
	Goroutines int            `json:"goroutines"`
	FDs        int            `json:"fds"`
	RSSKiB     int64          `json:"rss_kib"`
	HeapKiB    uint64         `json:"heap_kib"`
	Eager      int64          `json:"eager_in_use"`
	Large      int64          `json:"large_in_use"`
	Rndv       int64          `json:"rndv_in_use"`
	Registered int64          `json:"registered_bytes"`
	AllocFails uint64         `json:"alloc_failures"`
	RDMA       map[string]int `json:"rdma,omitempty"` // uverbs objects of this pid: qp, cq, mr, pd
	Recoveries uint64         `json:"recoveries"`
	BXDups     uint64         `json:"bx_duplicates"`
	// Workers are the endpoint's handler goroutines: a bounded pool
	// (bx.Config.Workers) that stays once started, as gRPC's stream
	// workers do; the goroutine checks leave them out.
	Workers int `json:"bx_workers"`
}

// ownGoroutines is the goroutine count the leak checks compare: all but
// bx's handler pool (Workers).
func (p chaosProc) ownGoroutines() int { return p.Goroutines - p.Workers }

func chaosProcStats(e *bx.Endpoint, rdma bool) chaosProc {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	p := chaosProc{PID: os.Getpid(), Goroutines: runtime.NumGoroutine(), FDs: chaosFDs(), RSSKiB: chaosRSS(),
		HeapKiB: ms.HeapInuse >> 10}
	if e != nil {
		eg, lg, rv := e.AllocatorStats()
		p.Eager, p.Large, p.Rndv = eg.InUse, lg.InUse, rv.InUse
		p.Registered = eg.Registered + lg.Registered + rv.Registered
		p.AllocFails = eg.Failures + lg.Failures + rv.Failures
		p.Recoveries = e.Stats().Recoveries.Load()
		p.BXDups = e.Stats().Duplicates.Load()
		p.Workers = e.Snapshot().Workers
	}
	if rdma {
		p.RDMA = chaosRDMAObjects(os.Getpid())
	}
	return p
}

func chaosFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents) - 1 // the directory being read
}

func chaosRSS() int64 {
	v, err := procstat.Field("VmRSS")
	if err != nil {
		return -1
	}
	return v
}

// chaosRDMAObjects counts the uverbs objects the kernel lists for this
// process (rdma -j resource show TYPE), or returns nil without the rdma
// tool.
func chaosRDMAObjects(pid int) map[string]int {
	if _, err := exec.LookPath("rdma"); err != nil {
		return nil
	}
	m := map[string]int{}
	for _, typ := range []string{"qp", "cq", "mr", "pd"} {
		out, err := exec.Command("rdma", "-j", "resource", "show", typ).Output()
		if err != nil {
			m[typ] = -1
			continue
		}
		var ents []map[string]any
		if err := json.Unmarshal(out, &ents); err != nil {
			m[typ] = -1
			continue
		}
		for _, e := range ents {
			// The kernel records the thread that created the object:
			// with Go, any thread of the process.
			if v, ok := e["pid"].(float64); ok && (int(v) == pid || chaosOurThread(int(v))) {
				m[typ]++
			}
		}
	}
	return m
}

func chaosOurThread(tid int) bool {
	_, err := os.Stat("/proc/self/task/" + strconv.Itoa(tid))
	return err == nil
}

// --- serve -----------------------------------------------------------------

type chaosEntry struct {
	deliveries uint32
	attempts   uint64 // bit a: attempt a (< 64) was delivered
}

type chaosLedger struct {
	mu            sync.Mutex
	ids           map[uint64]*chaosEntry
	applied       uint64
	deliveries    uint64
	retryDups     uint64 // a retried attempt of an applied id: de-duplicated
	transportDups uint64 // the same attempt delivered twice: a transport bug
	badRequests   uint64
}

func (l *chaosLedger) apply(id uint64, attempt uint32) (first bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deliveries++
	en := l.ids[id]
	if en == nil {
		en = &chaosEntry{}
		l.ids[id] = en
		l.applied++
		first = true
	}
	en.deliveries++
	if attempt < 64 {
		if en.attempts&(1<<attempt) != 0 {
			l.transportDups++
		}
		en.attempts |= 1 << attempt
	}
	if !first {
		l.retryDups++
	}
	return first
}

type chaosServerStats struct {
	Incarnation   string    `json:"incarnation"`
	Applied       uint64    `json:"applied"`
	Deliveries    uint64    `json:"deliveries"`
	RetryDups     uint64    `json:"retry_dups"`
	TransportDups uint64    `json:"transport_dups"`
	BadRequests   uint64    `json:"bad_requests"`
	Peers         int       `json:"peers"`
	Stalls        uint64    `json:"stalls"`
	Proc          chaosProc `json:"proc"`
	Idle          chaosProc `json:"idle"` // the process right after it started listening
}

// chaosServer is `chaosload serve`: the ledger of applied requests, the
// connected peers and the stall SIGUSR1 sets.
type chaosServer struct {
	e          *bx.Endpoint
	l          *chaosLedger
	stall      time.Duration
	stallUntil atomic.Int64
	stalls     atomic.Uint64
	pmu        sync.Mutex
	peers      map[*bx.Peer]struct{}
	idle       chaosProc // the process right after it started listening
}

// chaosServeOpts are serve's own command-line options.
type chaosServeOpts struct {
	listen string
	stall  time.Duration
}

// chaosServeFlags parses and checks serve's command line into its options
// and the endpoint's.
func chaosServeFlags(args []string, stderr io.Writer) (chaosServeOpts, chaosEndpointFlags, error) {
	fs, ef := chaosFlags("serve", "rxe1", stderr)
	var o chaosServeOpts
	fs.StringVar(&o.listen, "listen", "10.99.0.2:18900", "control-plane address")
	fs.DurationVar(&o.stall, "stall", 3*time.Second, "how long apply handlers hold their requests after SIGUSR1")
	if err := chaosParse("serve", fs, args); err != nil {
		return o, ef, err
	}
	if err := ef.check(); err != nil {
		return o, ef, err
	}
	if err := chaosAddr("serve", "--listen", o.listen); err != nil {
		return o, ef, err
	}
	return o, ef, chaosDuration("serve", "--stall", o.stall, "")
}

func chaosServe(args []string, stdout, stderr io.Writer) error {
	o, ef, err := chaosServeFlags(args, stderr)
	if err != nil {
		return err
	}
	e, err := bx.New(ef.config())
	if err != nil {
		return err
	}
	s := &chaosServer{e: e, l: &chaosLedger{ids: map[uint64]*chaosEntry{}}, stall: o.stall, peers: map[*bx.Peer]struct{}{}}
	e.Handle(chaosStreamApply, s.apply)
	e.Handle(chaosStreamStats, s.stats)
	e.Handle(chaosStreamCheck, s.check)
	// The idle baseline, before any peer can connect.
	s.idle = chaosProcStats(e, true)
	addr, err := e.Listen(o.listen)
	if err != nil {
		e.Close()
		return err
	}
	s.idle.FDs = chaosFDs() // the listening socket and the netpoller's descriptors
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.accept(ctx)
	fmt.Fprintf(stdout, "ready %s pid %d incarnation %016x\n", addr, os.Getpid(), e.ID())
	s.signals(stdout)
	cancel()
	l := s.l
	l.mu.Lock()
	fmt.Fprintf(stdout, "exit: applied %d deliveries %d retry_dups %d transport_dups %d\n", l.applied, l.deliveries, l.retryDups, l.transportDups)
	l.mu.Unlock()
	return e.Close()
}

// apply is the apply stream's handler: it records the request's id in
// the ledger and answers the id and whether it was a repeat.
func (s *chaosServer) apply(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
	d := req.Data()
	if len(d) < chaosReqHeader {
		s.l.mu.Lock()
		s.l.badRequests++
		s.l.mu.Unlock()
		return nil, fmt.Errorf("apply request of %d bytes", len(d))
	}
	// A stalled receiver: the request (its receive buffer, and the
	// credit it stands for) is held, not released.
	if until := s.stallUntil.Load(); until > 0 {
		if w := time.Until(time.Unix(0, until)); w > 0 {
			select {
			case <-time.After(w):
			case <-ctx.Done():
			}
		}
	}
	id := binary.LittleEndian.Uint64(d)
	first := s.l.apply(id, binary.LittleEndian.Uint32(d[8:]))
	resp := make([]byte, 9)
	binary.LittleEndian.PutUint64(resp, id)
	if !first {
		resp[8] = 1
	}
	return resp, nil
}

// stats is the stats stream's handler: the ledger's counts, the peers,
// the stalls and the process's resources, as JSON.
func (s *chaosServer) stats(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
	s.pmu.Lock()
	np := len(s.peers)
	s.pmu.Unlock()
	l := s.l
	l.mu.Lock()
	st := chaosServerStats{Incarnation: fmt.Sprintf("%016x", s.e.ID()), Applied: l.applied, Deliveries: l.deliveries,
		RetryDups: l.retryDups, TransportDups: l.transportDups, BadRequests: l.badRequests, Peers: np,
		Stalls: s.stalls.Load(), Idle: s.idle}
	l.mu.Unlock()
	st.Proc = chaosProcStats(s.e, true)
	return json.Marshal(st)
}

// check is the check stream's handler: for each 8-byte id of the
// request, whether the ledger has it and how often it was delivered.
func (s *chaosServer) check(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
	d := req.Data()
	if len(d)%8 != 0 {
		return nil, fmt.Errorf("check request of %d bytes", len(d))
	}
	resp := make([]byte, len(d)/8*2)
	s.l.mu.Lock()
	for i := 0; i < len(d)/8; i++ {
		if en := s.l.ids[binary.LittleEndian.Uint64(d[8*i:])]; en != nil {
			resp[2*i] = 1
			resp[2*i+1] = byte(min(en.deliveries, 255))
		}
	}
	s.l.mu.Unlock()
	return resp, nil
}

// accept accepts peers until ctx ends, keeping the set of those
// connected.
func (s *chaosServer) accept(ctx context.Context) {
	for {
		p, err := s.e.Accept(ctx)
		if err != nil {
			return
		}
		s.pmu.Lock()
		s.peers[p] = struct{}{}
		s.pmu.Unlock()
		go func() {
			<-p.Done()
			s.pmu.Lock()
			delete(s.peers, p)
			s.pmu.Unlock()
		}()
	}
}

// signals runs the faults the signals ask for (SIGUSR2: every QP to ERR;
// SIGHUP: to SQD; SIGUSR1: stall the apply handlers) until SIGTERM or an
// interrupt.
func (s *chaosServer) signals(stdout io.Writer) {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGHUP)
	for sg := range sig {
		switch sg {
		case syscall.SIGUSR2:
			n, err := chaosModifyQPs(qp.Err)
			fmt.Fprintf(stdout, "forced %d QPs to ERR (%v)\n", n, err)
		case syscall.SIGHUP:
			n, err := chaosModifyQPs(qp.SQD)
			fmt.Fprintf(stdout, "moved %d QPs to SQD (%v)\n", n, err)
		case syscall.SIGUSR1:
			s.stalls.Add(1)
			s.stallUntil.Store(time.Now().Add(s.stall).UnixNano())
			fmt.Fprintf(stdout, "stalling apply handlers for %v\n", s.stall)
		default:
			return
		}
	}
}

// chaosModifyQPs moves every QP of this process to state st the way an
// outside ibv_modify_qp would: a MODIFY_QP command written straight to each
// uverbs descriptor the process holds, for every object handle, behind
// bx's back (handles of other object types, and QPs that cannot make the
// transition, fail with EINVAL). ERR is the fault injection for "QPs
// forced to ERROR from outside"; SQD (send queue drain) stops a QP's
// sending with no error, a stall (bx/stall.go).
func chaosModifyQPs(st qp.State) (int, error) {
	return modifyQPsOf(os.Getpid(), st)
}

// modifyQPsOf is chaosModifyQPs for process pid, this one or another.
// Another process's descriptors are duplicated with pidfd_getfd(2) (Linux
// 5.6, and the right to ptrace it); the command then goes through the
// INVOKE_WRITE ioctl, since the kernel refuses write() on a uverbs
// descriptor from anyone but its opener's credentials
// (ib_safe_file_access). Our own descriptors take write(), as before.
func modifyQPsOf(pid int, st qp.State) (int, error) {
	self := pid == os.Getpid()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	pidfd := -1
	if !self {
		if pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
			return 0, fmt.Errorf("pidfd_open %d: %w", pid, err)
		}
		defer unix.Close(pidfd)
	}
	n := 0
	for _, en := range ents {
		target, err := os.Readlink(dir + "/" + en.Name())
		if err != nil || !strings.HasPrefix(target, "/dev/infiniband/uverbs") {
			continue
		}
		fd, err := strconv.Atoi(en.Name())
		if err != nil {
			continue
		}
		if !self {
			if fd, err = unix.PidfdGetfd(pidfd, fd, 0); err != nil {
				return n, fmt.Errorf("pidfd_getfd %d of process %d: %w", fd, pid, err)
			}
		}
		for h := uint32(0); h < 256; h++ {
			c := ioctl.ModifyQP{Qp_handle: h, Attr_mask: uint32(qp.MaskState), Qp_state: uint8(st)}
			if self {
				buf, err := ioctl.EncodeWrite(&ioctl.Cmd{Command: ioctl.IB_USER_VERBS_CMD_MODIFY_QP,
					In: unsafe.Pointer(&c), InLen: ioctl.SizeofModifyQP}, nil)
				if err != nil {
					return n, err
				}
				if w, err := unix.Write(fd, buf); err == nil && w == len(buf) {
					n++
				}
				continue
			}
			call := ioctl.NewCall(ioctl.UVERBS_OBJECT_DEVICE, ioctl.UVERBS_METHOD_INVOKE_WRITE, ioctl.RDMA_DRIVER_RXE)
			call.InPtr(ioctl.UVERBS_ATTR_CORE_IN, unsafe.Pointer(&c), ioctl.SizeofModifyQP, ioctl.AttrMandatory)
			call.InConst(ioctl.UVERBS_ATTR_WRITE_CMD, uint64(ioctl.IB_USER_VERBS_CMD_MODIFY_QP))
			b := call.Encoded()
			_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), ioctl.RDMA_VERBS_IOCTL, uintptr(unsafe.Pointer(&b[0])))
			runtime.KeepAlive(&c)
			if e == 0 {
				n++
			}
		}
		if !self {
			unix.Close(fd)
		}
	}
	return n, nil
}

// chaosBreakOpts are break's command-line options: the process and the
// state its QPs go to.
type chaosBreakOpts struct {
	pid   int
	state string
	st    qp.State
}

// chaosBreakFlags parses and checks break's command line.
func chaosBreakFlags(args []string, stderr io.Writer) (chaosBreakOpts, error) {
	fs := flag.NewFlagSet("chaosload break", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o chaosBreakOpts
	fs.IntVar(&o.pid, "pid", 0, "the process whose QPs to move (required)")
	fs.StringVar(&o.state, "state", "err", "the state to move them to: err (a failed QP) or sqd (a stall, no error)")
	if err := fs.Parse(args); err != nil {
		return o, &cli.ExitError{Code: 1}
	}
	if fs.NArg() > 0 {
		return o, chaosBad("break", "unexpected arguments %q", fs.Args())
	}
	if o.pid <= 0 || o.pid > chaosMaxPID {
		return o, chaosBad("break", "--pid %d: want a process id (1..%d)", o.pid, chaosMaxPID)
	}
	switch o.state {
	case "err":
		o.st = qp.Err
	case "sqd":
		o.st = qp.SQD
	default:
		return o, chaosBad("break", "--state %q: want err or sqd", o.state)
	}
	return o, nil
}

// chaosBreakCmd: chaosload break --pid PID [--state err|sqd].
func chaosBreakCmd(args []string, stdout, stderr io.Writer) error {
	o, err := chaosBreakFlags(args, stderr)
	if err != nil {
		return err
	}
	n, err := modifyQPsOf(o.pid, o.st)
	fmt.Fprintf(stdout, "moved %d QPs of process %d to %s\n", n, o.pid, strings.ToUpper(o.state))
	return err
}

// --- drive -----------------------------------------------------------------

// chaosConn keeps one peer to the server, re-dialing when it is gone.
type chaosConn struct {
	e    *bx.Endpoint
	addr string

	mu      sync.Mutex
	p       *bx.Peer
	dials   atomic.Uint64
	dialErr atomic.Uint64
	last    string // last dial error
}

func (c *chaosConn) get(ctx context.Context) (*bx.Peer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.p != nil {
		select {
		case <-c.p.Done():
			c.p = nil
		default:
			return c.p, nil
		}
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	p, err := c.e.Dial(dctx, c.addr)
	if err != nil {
		c.dialErr.Add(1)
		c.last = err.Error()
		return nil, err
	}
	c.dials.Add(1)
	c.p = p
	return p, nil
}

// drop forgets p if it is gone (bx closed it: recovery failed, peer died).
func (c *chaosConn) drop(p *bx.Peer) {
	select {
	case <-p.Done():
	default:
		return
	}
	c.mu.Lock()
	if c.p == p {
		c.p = nil
	}
	c.mu.Unlock()
}

func (c *chaosConn) close() {
	c.mu.Lock()
	if c.p != nil {
		c.p.Close()
		c.p = nil
	}
	c.mu.Unlock()
}

type chaosAck struct {
	id  uint64
	inc uint64
}

// chaosDriveSummary is drive's JSON result.
type chaosDriveSummary struct {
	Run               string            `json:"run"`
	Seconds           float64           `json:"seconds"`
	IDsStarted        uint64            `json:"ids_started"`
	IDsReturned       uint64            `json:"ids_returned"`
	IDsAcked          uint64            `json:"ids_acked"`
	IDsFailed         uint64            `json:"ids_failed"`
	AttemptsStarted   uint64            `json:"attempts_started"`
	AttemptsReturned  uint64            `json:"attempts_returned"`
	Retries           uint64            `json:"retries"`
	Dials             uint64            `json:"dials"`
	DialErrors        uint64            `json:"dial_errors"`
	Errors            map[string]uint64 `json:"errors"`
	WrongReplies      uint64            `json:"wrong_replies"`
	CallsPerSec       float64           `json:"calls_per_sec"`
	P99ms             float64           `json:"p99_ms"`
	MaxMs             float64           `json:"max_ms"`
	Verify            *chaosVerifyRes   `json:"verify,omitempty"`
	Server            *chaosServerStats `json:"server,omitempty"`
	Idle              chaosProc         `json:"idle"`  // before the first call
	Final             chaosProc         `json:"final"` // after closing the peer
	MaxRSSKiB         int64             `json:"max_rss_kib"`
	Violations        []string          `json:"violations"`
	OK                bool              `json:"ok"`
	LastError         string            `json:"last_error,omitempty"`
	Incarnations      int               `json:"server_incarnations"`
	HungAttemptsAtEnd int64             `json:"hung_attempts"`
}

type chaosVerifyRes struct {
	Checked     int      `json:"checked"`      // acked by the current server incarnation
	Applied     int      `json:"applied_once"` // of those, applied exactly once
	NotApplied  int      `json:"not_applied"`  // violations
	RestartLost int      `json:"lost_with_restart"`
	MaxDeliv    int      `json:"max_deliveries"`
	Examples    []string `json:"examples,omitempty"`
	Incarnation string   `json:"incarnation"`
}

// chaosDrive is the drive command: it loads the server with retried unique
// ids for --duration, then checks the invariants and reports them.
func chaosDrive(args []string, stdout, stderr io.Writer) error {
	o, ef, err := chaosDriveFlags(args, stderr)
	if err != nil {
		return err
	}
	e, err := bx.New(ef.config())
	if err != nil {
		return err
	}
	defer e.Close()
	d := newChaosDriver(o, e, stdout, stderr)
	closeJournal, err := d.openJournal()
	if err != nil {
		return err
	}
	defer closeJournal()

	elapsed := d.runLoad()
	d.collectCounts(elapsed)
	d.checkCounts()
	d.verifyServer()
	d.dumpStateOnViolation()
	d.checkOwnLeaks()
	return d.report()
}

// chaosDriveOpts are drive's own command-line options.
type chaosDriveOpts struct {
	peer        string
	duration    time.Duration
	conc        int
	rate        float64
	payload     int
	bigEvery    int
	bigSize     int
	callTimeout time.Duration
	giveUp      time.Duration
	journal     string
	every       time.Duration
	maxRSS      int64
}

// chaosDriveFlags parses drive's command line into its options and the endpoint's.
func chaosDriveFlags(args []string, stderr io.Writer) (chaosDriveOpts, chaosEndpointFlags, error) {
	fs, ef := chaosFlags("drive", "rxe0", stderr)
	var o chaosDriveOpts
	fs.StringVar(&o.peer, "peer", "10.99.0.2:18900", "the server's control-plane address")
	fs.DurationVar(&o.duration, "duration", 20*time.Second, "how long new ids are started")
	fs.IntVar(&o.conc, "concurrency", 8, "calls in flight")
	fs.Float64Var(&o.rate, "rate", 0, "calls per second over all workers (0: as fast as they return)")
	fs.IntVar(&o.payload, "payload", 64, "request payload bytes (at least 12)")
	fs.IntVar(&o.bigEvery, "big-every", 0, "every Nth id carries --big-size bytes (rendezvous); 0: never")
	fs.IntVar(&o.bigSize, "big-size", 256<<10, "size of the big requests")
	fs.DurationVar(&o.callTimeout, "call-timeout", 10*time.Second, "bound of one attempt")
	fs.DurationVar(&o.giveUp, "give-up", 60*time.Second, "an id is retried until this long after its first attempt")
	fs.StringVar(&o.journal, "journal", "", "append acknowledged ids (id, server incarnation: 2 little-endian uint64) to this file")
	fs.DurationVar(&o.every, "report-every", 0, "print a progress line and verify the ids acknowledged since the last one this often (soak)")
	fs.Int64Var(&o.maxRSS, "max-rss", 512<<10, "largest acceptable RSS in KiB (memory bounded; 0: no limit)")
	if err := chaosParse("drive", fs, args); err != nil {
		return o, ef, err
	}
	if err := ef.check(); err != nil {
		return o, ef, err
	}
	return o, ef, o.check(ef.maxMessageSize())
}

// check checks drive's options, naming the flag and its value; maxMsg is
// the endpoint's largest payload.
func (o chaosDriveOpts) check(maxMsg int) error {
	const cmd = "drive"
	if err := chaosAddr(cmd, "--peer", o.peer); err != nil {
		return err
	}
	switch {
	case o.conc < 1 || o.conc > chaosMaxConc:
		return chaosBad(cmd, "--concurrency %d: want 1..%d calls in flight", o.conc, chaosMaxConc)
	case o.rate != 0 && !(o.rate >= chaosMinRate && o.rate <= chaosMaxRate): // NaN too
		return chaosBad(cmd, "--rate %v: want 0 (as fast as the calls return) or %.3g..%g calls per second", o.rate, chaosMinRate, chaosMaxRate)
	case o.payload < chaosReqHeader || o.payload > maxMsg:
		return chaosBad(cmd, "--payload %d: want %d (the id and attempt header)..%d bytes (the max message)", o.payload, chaosReqHeader, maxMsg)
	case o.bigEvery < 0:
		return chaosBad(cmd, "--big-every %d: want 0 (never) or more", o.bigEvery)
	case o.bigSize < chaosReqHeader || o.bigEvery > 0 && o.bigSize > maxMsg:
		return chaosBad(cmd, "--big-size %d: want %d (the id and attempt header)..%d bytes (the max message)", o.bigSize, chaosReqHeader, maxMsg)
	case o.maxRSS < 0:
		return chaosBad(cmd, "--max-rss %d: want 0 (no limit) or more KiB", o.maxRSS)
	}
	for _, d := range []struct {
		name string
		d    time.Duration
		zero string
	}{
		{"--duration", o.duration, ""},
		{"--call-timeout", o.callTimeout, ""},
		{"--give-up", o.giveUp, "no retry"},
		{"--report-every", o.every, "no reports"},
	} {
		if err := chaosDuration(cmd, d.name, d.d, d.zero); err != nil {
			return err
		}
	}
	return nil
}

// chaosDriver is one drive run: its options, endpoint and connection, the
// counters its workers keep and the summary it builds.
type chaosDriver struct {
	o      chaosDriveOpts
	e      *bx.Endpoint
	conn   *chaosConn
	stdout io.Writer
	stderr io.Writer
	runID  uint64 // the random prefix of every id, in the high 32 bits
	sum    chaosDriveSummary

	jw  *bufio.Writer // the --journal, nil without one
	jmu sync.Mutex    // guards jw

	start   time.Time
	stopAt  time.Time       // no new id is started after it
	hardCtx context.Context // the hard end: every id has had its give-up time

	seq, idsStarted, idsReturned, idsAcked, idsFailed atomic.Uint64
	attStarted, attReturned, retries, wrong           atomic.Uint64
	inflight                                          atomic.Int64

	emu                sync.Mutex // guards sum.Errors and the fields below
	lastErr            string
	acks               []chaosAck
	lat                []time.Duration
	incs               map[uint64]bool // server incarnations that acknowledged
	progressViolations []string
	verified           int // acks[:verified] were checked already
}

// newChaosDriver makes a run with a fresh id prefix and records e's idle resources.
func newChaosDriver(o chaosDriveOpts, e *bx.Endpoint, stdout, stderr io.Writer) *chaosDriver {
	d := &chaosDriver{o: o, e: e, stdout: stdout, stderr: stderr, incs: map[uint64]bool{}}
	d.runID = rand.Uint64() & 0xffffffff00000000
	d.sum = chaosDriveSummary{Run: fmt.Sprintf("%08x", d.runID>>32), Errors: map[string]uint64{}}
	d.sum.Idle = chaosProcStats(e, true)
	d.conn = &chaosConn{e: e, addr: o.peer}
	return d
}

// openJournal opens --journal, if any, for appending; the func it returns flushes and closes it.
func (d *chaosDriver) openJournal() (func(), error) {
	if d.o.journal == "" {
		return func() {}, nil
	}
	f, err := os.OpenFile(d.o.journal, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	d.jw = bufio.NewWriter(f)
	return func() {
		d.flushJournal()
		f.Close()
	}, nil
}

// flushJournal writes the buffered journal records out (nothing without --journal).
func (d *chaosDriver) flushJournal() {
	if d.jw == nil {
		return
	}
	d.jmu.Lock()
	d.jw.Flush()
	d.jmu.Unlock()
}

// runLoad runs the workers and the background loop until every id has
// returned or the hard end has come, and returns how long that took.
func (d *chaosDriver) runLoad() time.Duration {
	var tick <-chan time.Time
	if d.o.rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / d.o.rate))
		defer t.Stop()
		tick = t.C
	}
	d.start = time.Now()
	d.stopAt = d.start.Add(d.o.duration)
	// The hard end: every id has had its give-up time; anything still
	// running then is a call that did not return.
	hardCtx, hardCancel := context.WithDeadline(context.Background(), d.stopAt.Add(d.o.giveUp+30*time.Second))
	defer hardCancel()
	d.hardCtx = hardCtx

	var wg sync.WaitGroup
	for range d.o.conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.worker(tick)
		}()
	}
	// Journal flushes and, for soaks, periodic progress and verification.
	done := make(chan struct{})
	var bgwg sync.WaitGroup
	bgwg.Add(1)
	go func() {
		defer bgwg.Done()
		d.background(done)
	}()
	wgDone := make(chan struct{})
	go func() { wg.Wait(); close(wgDone) }()
	select {
	case <-wgDone:
	case <-hardCtx.Done():
		d.sum.HungAttemptsAtEnd = d.inflight.Load()
		d.sum.Violations = append(d.sum.Violations, fmt.Sprintf("%d calls did not return within give-up + 30 s", d.inflight.Load()))
	}
	close(done)
	bgwg.Wait()
	return time.Since(d.start)
}

// worker starts one id after the other (each tick with --rate) until stopAt.
func (d *chaosDriver) worker(tick <-chan time.Time) {
	for time.Now().Before(d.stopAt) {
		if tick != nil {
			select {
			case <-tick:
			case <-time.After(time.Until(d.stopAt)):
				return
			}
		}
		d.oneID(d.seq.Add(1))
	}
}

// oneID calls with id number n, retrying with the same id, until it is acknowledged or given up.
func (d *chaosDriver) oneID(n uint64) {
	id := d.runID | n
	size := d.o.payload
	if d.o.bigEvery > 0 && n%uint64(d.o.bigEvery) == 0 {
		size = d.o.bigSize
	}
	req := make([]byte, size)
	binary.LittleEndian.PutUint64(req, id)
	d.idsStarted.Add(1)
	first := time.Now()
	for attempt := uint32(0); ; attempt++ {
		if attempt > 0 {
			d.retries.Add(1)
		}
		binary.LittleEndian.PutUint32(req[8:], attempt)
		err := d.callOnce(id, req)
		if err == nil {
			return
		}
		d.countErr(err)
		if time.Since(first) > d.o.giveUp || d.hardCtx.Err() != nil {
			d.idsFailed.Add(1)
			d.idsReturned.Add(1)
			return
		}
		select {
		case <-time.After(time.Duration(50+rand.IntN(150)) * time.Millisecond):
		case <-d.hardCtx.Done():
		}
	}
}

// callOnce makes one call for id; nil means the server acknowledged it and the ack is recorded.
func (d *chaosDriver) callOnce(id uint64, req []byte) error {
	p, err := d.conn.get(d.hardCtx)
	if err != nil {
		return err
	}
	d.attStarted.Add(1)
	d.inflight.Add(1)
	t0 := time.Now()
	cctx, cancel := context.WithTimeout(d.hardCtx, d.o.callTimeout)
	m, err := p.Call(cctx, chaosStreamApply, req)
	cancel()
	d.inflight.Add(-1)
	d.attReturned.Add(1)
	if err == nil {
		data := m.Data()
		okReply := len(data) == 9 && binary.LittleEndian.Uint64(data) == id
		m.Release()
		if okReply {
			d.recordAck(id, p.ID(), t0)
			return nil
		}
		d.wrong.Add(1)
		err = fmt.Errorf("call for id %x answered %x", id, data)
	}
	d.conn.drop(p)
	return err
}

// recordAck counts id as acknowledged by server incarnation inc (its call started at t0) and journals it.
func (d *chaosDriver) recordAck(id, inc uint64, t0 time.Time) {
	d.idsAcked.Add(1)
	d.idsReturned.Add(1)
	d.emu.Lock()
	d.acks = append(d.acks, chaosAck{id, inc})
	d.lat = append(d.lat, time.Since(t0))
	d.incs[inc] = true
	d.emu.Unlock()
	if d.jw != nil {
		var rec [16]byte
		binary.LittleEndian.PutUint64(rec[:], id)
		binary.LittleEndian.PutUint64(rec[8:], inc)
		d.jmu.Lock()
		d.jw.Write(rec[:])
		d.jmu.Unlock()
	}
}

// countErr counts a failed attempt's error by kind and keeps it as the last error.
func (d *chaosDriver) countErr(err error) {
	k := chaosErrKind(err)
	d.emu.Lock()
	d.sum.Errors[k]++
	d.lastErr = err.Error()
	d.emu.Unlock()
}

// chaosErrKind is the summary's "errors" key for err.
func chaosErrKind(err error) string {
	switch {
	case errors.Is(err, bx.ErrPeerGone):
		return "peer_gone"
	case errors.Is(err, bx.ErrRecovering):
		return "recovering"
	case errors.Is(err, bx.ErrClosed):
		return "closed"
	case errors.Is(err, mr.ErrAllocatorFull):
		return "allocator_full"
	case bx.IsRemote(err):
		return "remote"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case strings.Contains(err.Error(), "dial"):
		return "dial"
	}
	return "other"
}

// background flushes the journal every 200 ms and, with --report-every,
// reports progress, until done is closed.
func (d *chaosDriver) background(done <-chan struct{}) {
	flush := time.NewTicker(200 * time.Millisecond)
	defer flush.Stop()
	var rep <-chan time.Time
	if d.o.every > 0 {
		t := time.NewTicker(d.o.every)
		defer t.Stop()
		rep = t.C
	}
	lastN, lastT := uint64(0), time.Now()
	for {
		select {
		case <-done:
			return
		case <-flush.C:
			d.flushJournal()
		case now := <-rep:
			lastN, lastT = d.progress(now, lastN, lastT)
		}
	}
}

// progress prints a soak's "progress" and "soakrow" lines at now, verifying
// the acks since the last report, and returns the count and time the next
// report's rate starts from (lastN acks at lastT: this one's).
func (d *chaosDriver) progress(now time.Time, lastN uint64, lastT time.Time) (uint64, time.Time) {
	d.emu.Lock()
	batch := append([]chaosAck(nil), d.acks[d.verified:]...)
	d.emu.Unlock()
	line := map[string]any{"t_s": int(now.Sub(d.start).Seconds()), "acked": d.idsAcked.Load(), "failed": d.idsFailed.Load(),
		"retries": d.retries.Load(), "calls_per_sec": float64(d.idsAcked.Load()-lastN) / now.Sub(lastT).Seconds(),
		"proc": chaosProcStats(d.e, true)}
	nextN := d.idsAcked.Load()
	d.verifyBatch(line, batch)
	pv := chaosProgressViolations(line, d.o.maxRSS)
	line["violations"] = pv
	if len(pv) > 0 {
		d.emu.Lock()
		d.progressViolations = append(d.progressViolations, pv...)
		d.emu.Unlock()
	}
	b, _ := json.Marshal(line)
	fmt.Fprintf(d.stdout, "progress %s\n", b)
	d.printSoakRow(line, len(pv))
	return nextN, now
}

// verifyBatch checks batch at the server and adds the result ("verify" or
// "verify_error") and the server's stats ("server") to the progress line.
func (d *chaosDriver) verifyBatch(line map[string]any, batch []chaosAck) {
	vctx, cancel := context.WithTimeout(d.hardCtx, 30*time.Second)
	defer cancel()
	p, err := d.conn.get(vctx)
	if err != nil {
		return
	}
	vr, err := chaosVerify(vctx, p, batch)
	if err == nil {
		line["verify"] = vr
		d.emu.Lock()
		d.verified += len(batch)
		d.emu.Unlock()
	} else {
		line["verify_error"] = err.Error()
	}
	if st, err := chaosServerStatsOf(vctx, p); err == nil {
		line["server"] = st
	}
}

// chaosProgressViolations are the invariants a progress line shows broken (nil: none).
func chaosProgressViolations(line map[string]any, maxRSS int64) []string {
	var pv []string
	if vr, ok := line["verify"].(*chaosVerifyRes); ok && vr.NotApplied > 0 {
		pv = append(pv, fmt.Sprintf("%d acknowledged ids not applied (e.g. %v)", vr.NotApplied, vr.Examples))
	}
	if st, ok := line["server"].(*chaosServerStats); ok && st.TransportDups > 0 {
		pv = append(pv, fmt.Sprintf("server saw %d requests delivered twice", st.TransportDups))
	}
	if pr := line["proc"].(chaosProc); maxRSS > 0 && pr.RSSKiB > maxRSS {
		pv = append(pv, fmt.Sprintf("driver: RSS %d KiB above %d KiB", pr.RSSKiB, maxRSS))
	}
	if st, ok := line["server"].(*chaosServerStats); ok && maxRSS > 0 && st.Proc.RSSKiB > maxRSS {
		pv = append(pv, fmt.Sprintf("server: RSS %d KiB above %d KiB", st.Proc.RSSKiB, maxRSS))
	}
	return pv
}

// printSoakRow prints a progress line as a "soakrow" markdown table row for docs/reliability.md.
func (d *chaosDriver) printSoakRow(line map[string]any, violations int) {
	pr := line["proc"].(chaosProc)
	vr, _ := line["verify"].(*chaosVerifyRes)
	if vr == nil {
		vr = &chaosVerifyRes{}
	}
	st, _ := line["server"].(*chaosServerStats)
	if st == nil {
		st = &chaosServerStats{}
	}
	fmt.Fprintf(d.stdout, "soakrow | %d | %.0f | %d | %d (%d once) | %d | %d / %d | %d / %d | %d / %d | %d |\n",
		line["t_s"].(int)/60, line["calls_per_sec"].(float64), d.idsAcked.Load(), vr.Checked, vr.Applied,
		d.retries.Load(), pr.RSSKiB, st.Proc.RSSKiB, pr.Goroutines, st.Proc.Goroutines,
		pr.RDMA["qp"], st.Proc.RDMA["qp"], violations)
}

// collectCounts copies the counters, the last error and the latency percentiles into the summary.
func (d *chaosDriver) collectCounts(elapsed time.Duration) {
	sum := &d.sum
	sum.Seconds = elapsed.Seconds()
	sum.IDsStarted, sum.IDsReturned, sum.IDsAcked, sum.IDsFailed = d.idsStarted.Load(), d.idsReturned.Load(), d.idsAcked.Load(), d.idsFailed.Load()
	sum.AttemptsStarted, sum.AttemptsReturned, sum.Retries = d.attStarted.Load(), d.attReturned.Load(), d.retries.Load()
	sum.Dials, sum.DialErrors, sum.WrongReplies = d.conn.dials.Load(), d.conn.dialErr.Load(), d.wrong.Load()
	sum.CallsPerSec = float64(sum.IDsAcked) / elapsed.Seconds()
	sum.LastError = d.lastErr
	sum.Incarnations = len(d.incs)
	if lat := d.lat; len(lat) > 0 {
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		sum.P99ms = float64(lat[len(lat)*99/100]) / 1e6
		sum.MaxMs = float64(lat[len(lat)-1]) / 1e6
	}
}

// checkCounts adds the progress reports' violations and those of the counts
// (every id and call returned, no wrong reply, something acknowledged).
func (d *chaosDriver) checkCounts() {
	sum := &d.sum
	sum.Violations = append(sum.Violations, d.progressViolations...)
	if sum.IDsStarted != sum.IDsReturned {
		sum.Violations = append(sum.Violations, fmt.Sprintf("%d ids started, %d returned", sum.IDsStarted, sum.IDsReturned))
	}
	if sum.AttemptsStarted != sum.AttemptsReturned {
		sum.Violations = append(sum.Violations, fmt.Sprintf("%d calls started, %d returned", sum.AttemptsStarted, sum.AttemptsReturned))
	}
	if sum.WrongReplies != 0 {
		sum.Violations = append(sum.Violations, fmt.Sprintf("%d replies for the wrong id", sum.WrongReplies))
	}
	if sum.IDsAcked == 0 {
		sum.Violations = append(sum.Violations, "no call was acknowledged")
	}
}

// verifyServer verifies the acknowledged ids not verified yet, then the server's view (no duplicates).
func (d *chaosDriver) verifyServer() {
	sum := &d.sum
	vctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, err := d.reachServer(vctx)
	if err != nil {
		sum.Violations = append(sum.Violations, "cannot reach the server to verify: "+err.Error())
		return
	}
	vr, err := chaosVerify(vctx, p, d.acks[d.verified:])
	if err != nil {
		sum.Violations = append(sum.Violations, "verify: "+err.Error())
	} else {
		sum.Verify = vr
		if vr.NotApplied > 0 {
			sum.Violations = append(sum.Violations, fmt.Sprintf("%d acknowledged ids not applied by the server (e.g. %v)", vr.NotApplied, vr.Examples))
		}
	}
	if st, err := chaosServerStatsOf(vctx, p); err != nil {
		sum.Violations = append(sum.Violations, "server stats: "+err.Error())
	} else {
		sum.Server = st
		if st.TransportDups > 0 {
			sum.Violations = append(sum.Violations, fmt.Sprintf("server saw %d requests delivered twice", st.TransportDups))
		}
	}
}

// reachServer gets a peer to the server, trying up to 20 times half a second apart.
func (d *chaosDriver) reachServer(ctx context.Context) (*bx.Peer, error) {
	var p *bx.Peer
	var err error
	for i := 0; i < 20; i++ {
		if p, err = d.conn.get(ctx); err == nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	return p, err
}

// dumpStateOnViolation writes, if an invariant is broken so far, bx's view
// of the peer (lanes, credits, windows, sequence numbers) to stderr while
// the peer still exists, for the log.
func (d *chaosDriver) dumpStateOnViolation() {
	if len(d.sum.Violations) > 0 {
		fmt.Fprintf(d.stderr, "bx state at the violation (%s):\n", strings.Join(d.sum.Violations, "; "))
		bx.DumpState(d.stderr)
	}
}

// checkOwnLeaks closes the peer and checks the driver's own leaks: QPs
// gone, buffers back to what the idle endpoint holds (its posted
// receives), goroutines and fds back.
func (d *chaosDriver) checkOwnLeaks() {
	sum := &d.sum
	d.conn.close()
	time.Sleep(300 * time.Millisecond)
	sum.Final = chaosProcStats(d.e, false)
	for i := 0; i < 20 && (sum.Final.ownGoroutines() > sum.Idle.ownGoroutines()+1 || sum.Final.Eager != sum.Idle.Eager); i++ {
		time.Sleep(250 * time.Millisecond)
		sum.Final = chaosProcStats(d.e, false)
	}
	sum.Final.RDMA = chaosRDMAObjects(os.Getpid())
	sum.MaxRSSKiB = sum.Final.RSSKiB
	sum.Violations = append(sum.Violations, chaosLeaks("driver", sum.Idle, sum.Final, d.o.maxRSS)...)
}

// report prints the "summary" (JSON), "row" and "violations" lines and
// returns exit status 3 if any invariant is violated.
func (d *chaosDriver) report() error {
	sum := &d.sum
	sum.OK = len(sum.Violations) == 0
	if sum.Violations == nil {
		sum.Violations = []string{}
	}
	b, _ := json.Marshal(d.sum)
	fmt.Fprintf(d.stdout, "summary %s\n", b)
	// The same, flat, for shell scripts (the guest has no fast JSON tool).
	row := sum.row()
	fmt.Fprintf(d.stdout, "row acked=%d failed=%d retries=%d dedup=%d dials=%d recoveries=%d lost=%d p99=%.1f max=%.1f alloc_fail=%d srv_alloc_fail=%d ok=%v\n",
		row.Acked, row.Failed, row.Retries, row.Dedup, row.Dials, row.Recoveries, row.Lost, row.P99, row.Max,
		row.AllocFails, row.SrvAllocFails, row.OK)
	if len(sum.Violations) > 0 {
		fmt.Fprintf(d.stdout, "violations %s\n", strings.Join(sum.Violations, "; "))
	}
	if !sum.OK {
		return &cli.ExitError{Code: 3, Msg: "invariants violated: " + strings.Join(sum.Violations, "; ")}
	}
	return nil
}

// row is the summary's flat "row" line, driver and server counts added up.
func (sum *chaosDriveSummary) row() chaosDriveRow {
	row := chaosDriveRow{Acked: sum.IDsAcked, Failed: sum.IDsFailed, Retries: sum.Retries, Dials: sum.Dials,
		Recoveries: sum.Final.Recoveries, P99: sum.P99ms, Max: sum.MaxMs, OK: sum.OK,
		AllocFails: sum.Final.AllocFails}
	if sum.Server != nil {
		row.Recoveries += sum.Server.Proc.Recoveries
		row.Dedup = sum.Server.RetryDups
		row.SrvAllocFails = sum.Server.Proc.AllocFails
	}
	if sum.Verify != nil {
		row.Lost = sum.Verify.RestartLost
	}
	return row
}

type chaosDriveRow struct {
	Acked, Failed, Retries, Dedup, Dials, Recoveries uint64
	Lost                                             int
	P99, Max                                         float64
	AllocFails, SrvAllocFails                        uint64
	OK                                               bool
}

// chaosLeaks compares a process's resources with its idle baseline.
func chaosLeaks(who string, idle, now chaosProc, maxRSS int64) []string {
	var v []string
	if now.ownGoroutines() > idle.ownGoroutines()+1 {
		v = append(v, fmt.Sprintf("%s: %d goroutines (%d of them bx handler workers), %d when idle (%d)", who, now.Goroutines, now.Workers, idle.Goroutines, idle.Workers))
	}
	if now.FDs > idle.FDs {
		v = append(v, fmt.Sprintf("%s: %d fds, %d when idle", who, now.FDs, idle.FDs))
	}
	if now.Eager != idle.Eager || now.Large != idle.Large || now.Rndv != idle.Rndv {
		v = append(v, fmt.Sprintf("%s: buffers in use eager/large/rndv %d/%d/%d, %d/%d/%d when idle", who,
			now.Eager, now.Large, now.Rndv, idle.Eager, idle.Large, idle.Rndv))
	}
	if now.RDMA != nil && idle.RDMA != nil {
		for _, k := range []string{"qp", "cq", "pd"} {
			if now.RDMA[k] != idle.RDMA[k] {
				v = append(v, fmt.Sprintf("%s: %d %s objects, %d when idle", who, now.RDMA[k], k, idle.RDMA[k]))
			}
		}
	}
	if maxRSS > 0 && now.RSSKiB > maxRSS {
		v = append(v, fmt.Sprintf("%s: RSS %d KiB above %d KiB", who, now.RSSKiB, maxRSS))
	}
	return v
}

// chaosVerify asks the server about acks, 4096 ids per call.
func chaosVerify(ctx context.Context, p *bx.Peer, acks []chaosAck) (*chaosVerifyRes, error) {
	inc := p.ID()
	r := &chaosVerifyRes{Incarnation: fmt.Sprintf("%016x", inc)}
	var ids []uint64
	for _, a := range acks {
		if a.inc == inc {
			ids = append(ids, a.id)
		} else {
			r.RestartLost++
		}
	}
	for len(ids) > 0 {
		n := min(len(ids), 4096)
		req := make([]byte, 8*n)
		for i, id := range ids[:n] {
			binary.LittleEndian.PutUint64(req[8*i:], id)
		}
		m, err := p.Call(ctx, chaosStreamCheck, req)
		if err != nil {
			return nil, err
		}
		d := m.Data()
		if len(d) != 2*n {
			m.Release()
			return nil, fmt.Errorf("check answered %d bytes for %d ids", len(d), n)
		}
		for i := range n {
			r.Checked++
			if d[2*i] == 1 {
				r.Applied++
			} else {
				r.NotApplied++
				if len(r.Examples) < 5 {
					r.Examples = append(r.Examples, fmt.Sprintf("%016x", ids[i]))
				}
			}
			r.MaxDeliv = max(r.MaxDeliv, int(d[2*i+1]))
		}
		m.Release()
		ids = ids[n:]
	}
	return r, nil
}

func chaosServerStatsOf(ctx context.Context, p *bx.Peer) (*chaosServerStats, error) {
	m, err := p.Call(ctx, chaosStreamStats, nil)
	if err != nil {
		return nil, err
	}
	defer m.Release()
	var st chaosServerStats
	if err := json.Unmarshal(m.Data(), &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// --- verify and stats ------------------------------------------------------

// chaosDialServer opens an endpoint and dials the server at addr with it,
// for verify and stats: ctx bounds both to 60 s; done closes the peer and
// the endpoint.
func chaosDialServer(ef chaosEndpointFlags, addr string) (ctx context.Context, p *bx.Peer, done func(), err error) {
	e, err := bx.New(ef.config())
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	if p, err = e.Dial(ctx, addr); err != nil {
		cancel()
		e.Close()
		return nil, nil, nil, err
	}
	return ctx, p, func() { p.Close(); e.Close(); cancel() }, nil
}

// chaosVerifyOpts are verify's own command-line options.
type chaosVerifyOpts struct {
	peer, journal string
}

// chaosVerifyFlags parses and checks verify's command line into its
// options and the endpoint's.
func chaosVerifyFlags(args []string, stderr io.Writer) (chaosVerifyOpts, chaosEndpointFlags, error) {
	fs, ef := chaosFlags("verify", "rxe0", stderr)
	var o chaosVerifyOpts
	fs.StringVar(&o.peer, "peer", "10.99.0.2:18900", "the server's control-plane address")
	fs.StringVar(&o.journal, "journal", "", "journal written by drive --journal (required)")
	if err := chaosParse("verify", fs, args); err != nil {
		return o, ef, err
	}
	if err := ef.check(); err != nil {
		return o, ef, err
	}
	if o.journal == "" {
		return o, ef, chaosBad("verify", `--journal "": want the file drive --journal wrote`)
	}
	return o, ef, chaosAddr("verify", "--peer", o.peer)
}

// chaosVerifyCmd checks journals written by drive processes (killed ones
// too) against the server's ledger.
func chaosVerifyCmd(args []string, stdout, stderr io.Writer) error {
	o, ef, err := chaosVerifyFlags(args, stderr)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(o.journal)
	if err != nil {
		return err
	}
	acks := make([]chaosAck, 0, len(b)/16)
	for i := 0; i+16 <= len(b); i += 16 {
		acks = append(acks, chaosAck{binary.LittleEndian.Uint64(b[i:]), binary.LittleEndian.Uint64(b[i+8:])})
	}
	ctx, p, done, err := chaosDialServer(ef, o.peer)
	if err != nil {
		return err
	}
	defer done()
	vr, err := chaosVerify(ctx, p, acks)
	if err != nil {
		return err
	}
	out, _ := json.Marshal(map[string]any{"journal": o.journal, "records": len(acks), "torn_bytes": len(b) % 16, "verify": vr})
	fmt.Fprintf(stdout, "verify %s\n", out)
	if vr.NotApplied > 0 {
		return &cli.ExitError{Code: 3, Msg: fmt.Sprintf("%d acknowledged ids not applied", vr.NotApplied)}
	}
	return nil
}

// chaosStatsOpts are stats' own command-line options.
type chaosStatsOpts struct {
	peer     string
	check    bool
	srvLanes int
	maxRSS   int64
}

// chaosStatsFlags parses and checks stats' command line into its options
// and the endpoint's.
func chaosStatsFlags(args []string, stderr io.Writer) (chaosStatsOpts, chaosEndpointFlags, error) {
	fs, ef := chaosFlags("stats", "rxe0", stderr)
	var o chaosStatsOpts
	fs.StringVar(&o.peer, "peer", "10.99.0.2:18900", "the server's control-plane address")
	fs.BoolVar(&o.check, "check", false, "exit 3 unless the server is back to its idle resources (but for this one peer)")
	fs.IntVar(&o.srvLanes, "server-lanes", 2, "with --check: QPs the server holds per peer (its --lanes)")
	fs.Int64Var(&o.maxRSS, "max-rss", 512<<10, "with --check: largest acceptable server RSS in KiB (0: no limit)")
	if err := chaosParse("stats", fs, args); err != nil {
		return o, ef, err
	}
	if err := ef.check(); err != nil {
		return o, ef, err
	}
	switch {
	case o.srvLanes < 1 || o.srvLanes > chaosMaxLanes:
		return o, ef, chaosBad("stats", "--server-lanes %d: want 1..%d (the server's lanes per peer)", o.srvLanes, chaosMaxLanes)
	case o.maxRSS < 0:
		return o, ef, chaosBad("stats", "--max-rss %d: want 0 (no limit) or more KiB", o.maxRSS)
	}
	return o, ef, chaosAddr("stats", "--peer", o.peer)
}

func chaosStatsCmd(args []string, stdout, stderr io.Writer) error {
	o, ef, err := chaosStatsFlags(args, stderr)
	if err != nil {
		return err
	}
	ctx, p, done, err := chaosDialServer(ef, o.peer)
	if err != nil {
		return err
	}
	defer done()
	// Give the server a moment to notice peers that went away.
	var st *chaosServerStats
	var v []string
	for i := 0; i < 20; i++ {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := chaosServerStatsOf(cctx, p)
		ccancel()
		if err != nil {
			if st == nil {
				return fmt.Errorf("server stats: %w", err)
			}
			v = append(v, "server stats: "+err.Error())
			break
		}
		st = s
		if v = chaosServerViolations(st, o.srvLanes, o.maxRSS); !o.check || len(v) == 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	out, _ := json.Marshal(map[string]any{"stats": st, "violations": v})
	fmt.Fprintf(stdout, "stats %s\n", out)
	if o.check && len(v) > 0 {
		return &cli.ExitError{Code: 3, Msg: "server invariants violated: " + strings.Join(v, "; ")}
	}
	return nil
}

// chaosServerViolations checks a server with st.Peers peers connected
// (the one asking among them) against its idle self.
func chaosServerViolations(st *chaosServerStats, lanes int, maxRSS int64) []string {
	var v []string
	if st.TransportDups > 0 {
		v = append(v, fmt.Sprintf("server: %d requests delivered twice", st.TransportDups))
	}
	if st.BadRequests > 0 {
		v = append(v, fmt.Sprintf("server: %d malformed requests", st.BadRequests))
	}
	idle, now, n := st.Idle, st.Proc, st.Peers
	if now.RDMA != nil && now.RDMA["qp"] != idle.RDMA["qp"]+lanes*n {
		v = append(v, fmt.Sprintf("server: %d QPs for %d peers of %d lanes", now.RDMA["qp"], n, lanes))
	}
	if now.ownGoroutines() > idle.ownGoroutines()+2+4*n {
		v = append(v, fmt.Sprintf("server: %d goroutines (%d of them bx handler workers) with %d peers, %d when idle (%d)", now.Goroutines, now.Workers, n, idle.Goroutines, idle.Workers))
	}
	if now.FDs > idle.FDs+n {
		v = append(v, fmt.Sprintf("server: %d fds with %d peers, %d when idle", now.FDs, n, idle.FDs))
	}
	// The request being served and a few unacknowledged responses.
	if now.Eager > idle.Eager+4 || now.Large != 0 || now.Rndv != 0 {
		v = append(v, fmt.Sprintf("server: buffers in use eager/large/rndv %d/%d/%d, %d/0/0 when idle", now.Eager, now.Large, now.Rndv, idle.Eager))
	}
	if maxRSS > 0 && now.RSSKiB > maxRSS {
		v = append(v, fmt.Sprintf("server: RSS %d KiB above %d KiB", now.RSSKiB, maxRSS))
	}
	return v
}
