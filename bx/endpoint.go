package bx

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/flow"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/wr"
)

// Config configures an Endpoint. Zero values take the defaults shown.
type Config struct {
	Device string // RDMA device, e.g. "rxe0" (required)
	Port   uint8  // 1
	// Token authenticates peers on the control plane (required, at least
	// 16 bytes). Both ends must hold the same token.
	Token []byte
	// TLS, when set, runs the control connection (setup, credit resync,
	// recovery) over TLS with this configuration, both when dialing and
	// when accepting; the token challenge then runs inside it. Listen
	// needs a certificate (Certificates or GetCertificate); mutual
	// authentication is the usual ClientAuth and ClientCAs; a dialer
	// without ServerName verifies the host of the address it dials. Both
	// ends must use TLS, or neither. The data plane (RDMA) is not
	// encrypted.
	TLS *tls.Config
	// SharedTargets gives up the per-transfer isolation of rendezvous
	// targets, for speed. By default each target is opened to the one peer
	// that writes it, for that one transfer, through a type 2 memory window
	// (grant.go, docs/reliability.md): no memory is registered for remote
	// access, a peer cannot write another peer's target or its own after
	// the transfer, and a delivered message cannot change. Each bind goes
	// behind a fence (rxe re-runs a BIND_MW on an RC retransmission and
	// then stalls; grant.go), so a CTS waits until what its lane sent
	// before is acknowledged; under emulation that costs a third to a half
	// of a rendezvous call (docs/perf.md). The default needs a device with
	// memory windows; New refuses one without them unless SharedTargets is
	// set. With SharedTargets all targets of an endpoint are one region
	// under one rkey that every peer learns: use it only among peers that
	// trust each other. Only the receiving side's setting matters: it is
	// the one that grants.
	SharedTargets bool
	// Lanes is the number of RC QPs per peer (1..4, default 2). Streams are
	// spread over them; QP count grows with peers, not with streams.
	Lanes int
	// Credits is the number of receive buffers granted to each peer
	// (default 64, at least 3). MaxPeers*Credits buffers are posted to the
	// endpoint's shared receive queue.
	Credits int
	// MaxPeers bounds connected peers (default 16).
	MaxPeers int
	// EagerSize is the largest payload sent in the message itself (default
	// 8 KiB - header); larger ones go by rendezvous: the sender WRITEs them
	// into a buffer the receiver names. It sizes the receive buffers too
	// (MaxPeers*Credits of them, each EagerSize+HeaderSize rounded up to a
	// power of two), so both ends must use the same: the handshake refuses
	// a peer of another EagerSize (ErrProtocol). Under emulation (rxe) a
	// rendezvous costs about two more small messages each way; an
	// EagerSize that covers a workload's messages took a 64 KiB call from
	// 1.76x to 1.24x the raw verbs round trip (docs/perf.md,
	// "Thirty-fourth session"), for 64 KiB per receive buffer.
	EagerSize int
	// SplitSize is the largest payload sent as several eager messages
	// (parts, each the size of a receive buffer) instead of by
	// rendezvous; a message above EagerSize and at most SplitSize goes so
	// (wire.go, "Split messages"). It needs no larger receive buffers and
	// no agreement: the receiver copies the parts into a buffer of the
	// message's size. Default DefaultSplitParts receive buffers' worth
	// (fewer with fewer Credits or LaneMsgs); negative: never (every
	// message above EagerSize by rendezvous). Its parts may take at most
	// half of Credits and of LaneMsgs, and at most MaxParts.
	SplitSize int
	// MaxMessage is the largest payload (default 4 MiB).
	MaxMessage int
	// LaneMsgs and LaneBytes bound a lane's unacknowledged messages
	// (default 64 and 4 MiB); EndpointMsgs and EndpointBytes bound the
	// endpoint's (default 1024 and 64 MiB).
	LaneMsgs, EndpointMsgs   int64
	LaneBytes, EndpointBytes int64
	// MemoryLimit bounds the registered memory of each buffer pool
	// (default 1 GiB).
	MemoryLimit int64
	// HandshakeTimeout bounds each control-plane step (default 10 s).
	HandshakeTimeout time.Duration
	// PeerTimeout is how long a peer may stay unreachable before its calls
	// fail with ErrPeerGone (default 10 s).
	PeerTimeout time.Duration
	// StallTimeout is how long a lane's QP may leave a probe (posted after
	// anything the lane sent) uncompleted, with no other send of the lane
	// completing, before bx takes the QP for stalled and recovers the
	// peer's lanes as after a QP error (stall.go; default 4 s, negative:
	// never). A QP can stall with no error: rxe on Linux 6.1 can stop
	// sending on a QP whose packets the local network stack refused (a
	// link down) and never retry.
	StallTimeout time.Duration
	// Spin is how long the progress goroutine keeps polling the CQ after
	// its last completion before it arms it and sleeps in the netpoller;
	// while Calls wait for responses, 10 times as long (adaptive polling,
	// as perftest and eRPC poll). Default DefaultSpin; negative: never
	// poll (event-driven). An idle endpoint sleeps after Spin either way.
	// The window adapts: each time a sleep ends sooner than 4 Spins, the
	// next window doubles (up to 4 Spins), so that traffic whose gaps
	// exceed Spin a little keeps the endpoint polling; a longer sleep
	// halves it.
	// Measured in the rxe guest (two processes, 2 vCPUs, quiet host;
	// docs/perf.md) a 64 B call took 92 us polling and 1.38 ms
	// event-driven: with the peer's CQ armed, the kernel wakes the waiter
	// from inside the sender's doorbell, which then costs several times
	// as much. Only a process's only endpoint polls, only with
	// GOMAXPROCS > 1 (see liveEndpoints), and only while the machine's
	// processes with an endpoint that may poll are no more than its CPUs
	// (they register in a directory, $GOVERBS_POLLERS_DIR or /dev/shm:
	// pollers.go); more, and every endpoint sleeps on events, which
	// measured 2x faster than polling for 3 processes on 2 CPUs.
	Spin time.Duration
	// Workers bounds the goroutines that run blocking handlers (Handle)
	// (default 64); requests beyond them queue. HandleInline handlers run
	// on the progress goroutine instead.
	Workers int
	// LaneSetup is how the lanes' RC QPs are connected; both ends must
	// choose the same. LaneSetupExchange (the default): QP numbers cross
	// the control connection and each side moves its QPs to RTS.
	// LaneSetupCM: each lane is an rdma_cm connection (package cm) from
	// the dialer to a listener the accepting endpoint opens, on its
	// device's IP address, with Listen; the connect request carries a key
	// the acceptor sent over the authenticated control connection, and a
	// request without it is rejected. The control plane (authentication,
	// TLS, credits, recovery) is the same either way; recovery connects
	// new lanes through rdma_cm. It needs the rdma_ucm module and an
	// IP-based GID (RoCE v2); docs/cm.md.
	LaneSetup LaneSetup
}

// DefaultSplitParts is the default Config.SplitSize in receive buffers
// (parts); MaxParts bounds the parts of one message.
const (
	DefaultSplitParts = 9
	MaxParts          = 32
)

// backlog is the size of the endpoint's backlog queue of handler calls
// and responses waiting for a worker (allocated by New at about 150 bytes
// an entry): what every peer may have in flight to us and we to it.
// Responses queued without a request's buffer can outgrow it; they wait in
// the overflow list behind it (Endpoint.overflow).
func (c *Config) backlog() int64 {
	return int64(c.MaxPeers) * (int64(c.Credits) + int64(c.Lanes)*c.LaneMsgs)
}

// maxPeers bounds Config.MaxPeers, maxBacklog the backlog queue (600
// MiB; above the 2^20 receive buffers rxe's SRQ takes, so that New names
// the SRQ's limit for a few peers of that many credits).
const (
	maxPeers   = 1 << 16
	maxBacklog = 1 << 22
)

// parts is how many eager messages an n-byte payload takes split: the
// first carries its size (rndvSize) ahead of its payload.
func (c *Config) parts(n int) int { return (n + rndvSize + c.EagerSize - 1) / c.EagerSize }

// partsMax is the most parts a split message may take: half of the
// credits and of the windows' messages, and at most MaxParts.
func (c *Config) partsMax() int64 {
	return min(min(int64(c.Credits), c.LaneMsgs, c.EndpointMsgs)/2, MaxParts)
}

// splitFor is the largest payload sent split to a peer that grants grant
// credits (-1: none): SplitSize, or less where its parts would take more
// than half of them (a message whose parts outnumber the peer's credits
// would wait for them for good).
func (c *Config) splitFor(grant uint64) int {
	if c.SplitSize <= c.EagerSize {
		return -1
	}
	k := c.parts(c.SplitSize)
	if uint64(k) <= grant/2 {
		return c.SplitSize
	}
	if k = int(grant / 2); k < 2 {
		return -1
	}
	return k*c.EagerSize - rndvSize
}

// eagerSizeOK reports whether n is an EagerSize bx takes: 64 bytes up to
// a 1 MiB message with its header (Config, and a peer's setup).
func eagerSizeOK(n int) bool { return n >= 64 && n+HeaderSize <= 1<<20 }

func (c *Config) defaults() error {
	if c.Device == "" {
		return errors.New("bx: Config.Device is required")
	}
	if len(c.Token) < 16 {
		return errors.New("bx: Config.Token must be at least 16 bytes")
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def64 := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	if c.Port == 0 {
		c.Port = 1
	}
	def(&c.Lanes, 2)
	def(&c.Credits, 64)
	def(&c.MaxPeers, 16)
	def(&c.EagerSize, 8192-HeaderSize)
	def(&c.MaxMessage, 4<<20)
	def64(&c.LaneMsgs, 64)
	def64(&c.LaneBytes, 4<<20)
	def64(&c.EndpointMsgs, 1024)
	def64(&c.EndpointBytes, 64<<20)
	if c.SplitSize == 0 {
		// DefaultSplitParts, or fewer where credits or windows are small.
		c.SplitSize = -1
		if k := min(DefaultSplitParts, c.partsMax()); k >= 2 {
			c.SplitSize = int(k)*c.EagerSize - rndvSize
		}
	}
	def64(&c.MemoryLimit, 1<<30)
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.PeerTimeout == 0 {
		c.PeerTimeout = 10 * time.Second
	}
	switch {
	case c.StallTimeout == 0:
		c.StallTimeout = defaultStallTimeout
	case c.StallTimeout < 0:
		c.StallTimeout = 0
	}
	def(&c.Workers, 64)
	switch {
	case c.Spin == 0:
		c.Spin = DefaultSpin
	case c.Spin < 0:
		c.Spin = 0
	}
	switch {
	case c.Lanes < 1 || c.Lanes > 4:
		return fmt.Errorf("bx: Lanes %d outside 1..4", c.Lanes)
	case c.Credits < flow.MinGrant:
		return fmt.Errorf("bx: Credits %d below %d", c.Credits, flow.MinGrant)
	case c.MaxPeers < 1:
		return fmt.Errorf("bx: MaxPeers %d", c.MaxPeers)
	case !eagerSizeOK(c.EagerSize):
		return fmt.Errorf("bx: EagerSize %d outside 64..1 MiB-header", c.EagerSize)
	case c.Workers < 1:
		return fmt.Errorf("bx: Workers %d", c.Workers)
	case c.LaneSetup > LaneSetupCM:
		return fmt.Errorf("bx: unknown %v", c.LaneSetup)
	case c.MaxMessage < c.EagerSize:
		return fmt.Errorf("bx: MaxMessage %d below EagerSize %d", c.MaxMessage, c.EagerSize)
	case c.Credits > maxGrant:
		return fmt.Errorf("bx: Credits %d above %d (what a peer accepts)", c.Credits, maxGrant)
	case c.LaneMsgs < 0 || c.EndpointMsgs < 0:
		return fmt.Errorf("bx: LaneMsgs %d, EndpointMsgs %d: want messages > 0 (0: the defaults)", c.LaneMsgs, c.EndpointMsgs)
	case c.LaneMsgs > maxGrant:
		return fmt.Errorf("bx: LaneMsgs %d above %d (more than a peer grants)", c.LaneMsgs, maxGrant)
	case c.MaxPeers > maxPeers:
		return fmt.Errorf("bx: MaxPeers %d above %d", c.MaxPeers, maxPeers)
	case c.backlog() > maxBacklog:
		return fmt.Errorf("bx: MaxPeers %d x (Credits %d + Lanes %d x LaneMsgs %d) = %d handler calls queued at most: above %d",
			c.MaxPeers, c.Credits, c.Lanes, c.LaneMsgs, c.backlog(), maxBacklog)
	case c.LaneBytes < 0 || c.EndpointBytes < 0:
		return fmt.Errorf("bx: LaneBytes %d, EndpointBytes %d: want bytes > 0 (0: the defaults)", c.LaneBytes, c.EndpointBytes)
	case c.MemoryLimit < 0:
		return fmt.Errorf("bx: MemoryLimit %d: want bytes > 0 (0: the default)", c.MemoryLimit)
	case c.HandshakeTimeout < 0:
		return fmt.Errorf("bx: HandshakeTimeout %v: want > 0 (0: the default)", c.HandshakeTimeout)
	case c.PeerTimeout < 0:
		return fmt.Errorf("bx: PeerTimeout %v: want > 0 (0: the default)", c.PeerTimeout)
	}
	if c.SplitSize > 0 {
		k := int64(c.parts(c.SplitSize))
		if k > c.partsMax() {
			return fmt.Errorf("bx: SplitSize %d takes %d parts of EagerSize %d: more than half of Credits (%d) or LaneMsgs (%d), or MaxParts (%d)",
				c.SplitSize, k, c.EagerSize, c.Credits, c.LaneMsgs, MaxParts)
		}
	}
	return nil
}

// Endpoint is one process's ByteExpress presence on one RDMA device: a
// shared receive queue whose buffers all peers' messages land in, one
// event-driven CQ, buffer pools, and the peers it talks to.
type Endpoint struct {
	cfg    Config
	id     uint64
	ctx    *uverbs.Context
	pd     *uverbs.PD
	gid    uverbs.GID
	eager  *mr.Allocator // LocalWrite: receive buffers, eager sends
	large  *mr.Allocator // LocalWrite: rendezvous targets, reachable only through a window per transfer
	grants grantPool     // the targets' own regions and the windows (grant.go)
	rndv   *mr.Allocator // LocalWrite: rendezvous sources

	lcm     *endpointCM                // Config.LaneSetup CM (cmlane.go)
	ctsHook atomic.Pointer[func(*cts)] // tests: forge the CTS we send, as it is posted
	finHook atomic.Pointer[func(cts)]  // tests: run before each FIN we send, on a goroutine of its own
	srq     *qp.SRQ
	cq      *cq.CQ
	win     *flow.Window

	srqMu   sync.Mutex             // the SRQ's receive side has one owner at a time
	srqGone bool                   // under srqMu: Close is destroying the SRQ
	rwr     [retireBatch]qp.RecvWR // under srqMu: repost's work requests, off the heap; rwr[i] has SGE rsge[i]
	rsge    [retireBatch]qp.SGE
	msgs    []Msg   // the pollMu holder's slab (newMsg)
	acks    []*lane // the pollMu holder's: lanes with a deferred acknowledgement (deferAck)

	// Released receive buffers not re-posted yet (retire): while someone
	// polls, a Release only queues its buffer here, and the poller posts
	// them, several to a call, between its polls (drainRetired).
	retMu    sync.Mutex
	retired  []retiredBuf // under retMu
	retN     atomic.Int32 // len(retired)
	retireAt int32        // the poller drains between polls from this many on (retireThreshold)
	spinning atomic.Bool  // the progress goroutine is polling

	mu       sync.RWMutex
	peers    map[*Peer]struct{}
	byQPN    map[uint32]*lane
	handlers map[uint32]handler
	// Copies of byQPN and handlers, published under mu at each change
	// (publishQPNs, publishHandlers) and read without a lock by whoever
	// polls: a completion's lane and a request's handler cost no lock.
	qpns     atomic.Pointer[map[uint32]*lane]
	laneHit  laneHit // laneOf's cache (pollMu)
	hands    atomic.Pointer[map[uint32]handler]
	accepted chan *Peer
	lns      []net.Listener
	dialed   map[string]*Peer
	conns    chan *Conn

	listeners int // under mu: open Listeners; with none, DialConn is refused
	joining   int // under mu: handshakes under way, each holding a MaxPeers place

	// waiting counts Calls waiting for their response: the progress
	// goroutine polls while there are any.
	waiting atomic.Int64
	// busy counts requests handed to the worker pool and not yet done
	// (queue, worker): a poller gives its CPU away only while something
	// of its endpoint may need one (othersWait).
	busy atomic.Int32
	// work hands a request for a blocking handler to an idle worker
	// (unbuffered: a send succeeds only if one waits); backlog holds what
	// arrives while all Config.Workers are busy. Every queued request holds
	// a receive buffer or a rendezvous target the peer's window admitted,
	// and the backlog is sized to both. Not so the sends queued without a
	// request's buffer (an inline handler's response that found no
	// credit, whose request went back at once; a close answer, a Conn's
	// read count): a peer that holds our credits (its user does not
	// Release our responses) and keeps calling an inline handler queues
	// one each call. What finds the backlog full waits in overflow
	// instead (unbounded, in order behind it), so that the goroutine
	// that queues, the progress goroutine holding pollMu, never blocks:
	// it did, and every peer of the endpoint stalled.
	work     chan work
	backlog  chan work
	workers  atomic.Int32
	overMu   sync.Mutex
	overflow []work        // under overMu
	overN    atomic.Int32  // len(overflow)
	overKick chan struct{} // cap 1: overflow has work for an idle worker

	// pollMu is held by whoever polls the CQ and completes what it found:
	// the progress goroutine, or a Call waiting for its response (one at a
	// time: callerPolls). What completion handling touches without a lock
	// of its own (msgs, a lane's ready list) is guarded by it.
	pollMu      sync.Mutex
	wc          []cq.WC       // under pollMu
	cqGone      bool          // under pollMu: Close is destroying the CQ
	callerPolls atomic.Bool   // a Call is polling: the progress goroutine waits
	resume      chan struct{} // the polling Call is done: the progress goroutine goes on
	// serves is set once a handler is registered: the endpoint answers
	// requests, which only the progress goroutine polls for between
	// Calls. Without one, a Call that got its response leaves the CQ
	// without waking the progress goroutine (lazyResume).
	serves atomic.Bool
	// leftAt is when the last polling waiter left the CQ (nanotime
	// since start), for the progress goroutine's timed wait.
	leftAt atomic.Int64
	// selfWaiting: the waiter holding callerPolls waits for the CQ's
	// events itself (selfWait), so the progress goroutine need not look
	// before it leaves.
	selfWaiting atomic.Bool
	// parks counts the progress goroutine's timed looks while a waiter
	// held the CQ (tests).
	parks atomic.Uint64
	// progressWaits is set while the progress goroutine holds waitMu to
	// wait for an event: only then must a waiter taking the wait over
	// interrupt it (an interrupt with no wait to end is kept and ends the
	// waiter's own first wait, an arm and a deadline for nothing).
	progressWaits atomic.Bool
	// waitMu is held by whoever waits for the CQ's next event (cq.Wait):
	// the progress goroutine, or the polling Call once it waits for
	// events itself (selfWait).
	waitMu   sync.Mutex
	waitGone bool // under waitMu: Close is destroying the CQ
	// selfBound interrupts a Call's event wait after selfWaitStep, so
	// that it looks at its context and its channel (a shutdown closes
	// it without an event); one timer, reset per wait.
	selfBound *time.Timer
	// liveMsgs counts received Msgs not yet released (queued, with a
	// handler or with a user); userBufs, Alloc'ed Buffers a user holds.
	// Close unmaps the pools only when both are zero.
	liveMsgs, userBufs atomic.Int64

	kick  chan struct{} // poke: wake the ticker
	ticks atomic.Uint64 // the ticker's rounds (tests)
	// tickerSleeps counts the ticker's wake-ups from its sleep (tests).
	tickerSleeps atomic.Uint64

	stop   context.CancelFunc
	stopCh context.Context
	wg     sync.WaitGroup
	// downs counts peers' shutdowns in progress: Close waits for them
	// (a peer leaves peers before its lanes, windows and QPs are gone).
	downs  sync.WaitGroup
	closed atomic.Bool
	stats  Stats
	// lastHSFail is the last failed accept's "address: error"
	// (Stats.HandshakesFailed).
	lastHSFail atomic.Pointer[string]
	met        metricsState // RPC latency per stream class (metrics.go)
	spills     sync.Pool    // *[]byte of EagerSize: spilled messages' payloads (Msg.spill)
}

// Stats counts what an endpoint did. Sent and Received count messages
// (eager ones and rendezvous requests, duplicates included in Received),
// not the rendezvous CTS and FIN or the credit updates.
type Stats struct {
	Sent, Received, Duplicates, Rendezvous, CreditUpdates, Recoveries atomic.Uint64
	// Unrouted counts completions of QPs no peer owns (a QP already
	// destroyed by recovery or shutdown); their buffers are reposted.
	Unrouted atomic.Uint64
	// ClosedDrops counts messages released on arrival because their
	// stream was closed (sent before the peer learned of the close), and
	// close answers that could not be sent (no buffer).
	ClosedDrops atomic.Uint64
	// SelfPolled counts Calls whose response their own goroutine found
	// polling the CQ (pollFor: no hand-off from the progress goroutine).
	SelfPolled atomic.Uint64
	// RecoveryRounds counts the recovery rounds this endpoint ran, as the
	// dialer or the acceptor of a peer: one per recovery unless the new
	// QPs failed too or the peer asked for another.
	RecoveryRounds atomic.Uint64
	// Resumes counts waiters (Calls, Recvs) that left the CQ and woke the
	// progress goroutine to poll it again; HandBacks, Calls that left it
	// to the next one without waking it (an endpoint without handlers).
	Resumes, HandBacks atomic.Uint64
	// CMRejected counts rdma_cm connect requests refused (Config.LaneSetup
	// CM): no key of a peer being set up, a stale epoch, a replay.
	CMRejected atomic.Uint64
	// Probes counts the probes posted on lanes whose oldest message waited
	// for its acknowledgement; Stalls, the lanes found stalled (a probe
	// not complete after Config.StallTimeout), each followed by a recovery.
	Probes, Stalls atomic.Uint64
	// Deferred counts receive buffers released while the endpoint
	// polled, and so re-posted (and their credits counted) by the poller
	// between its polls rather than by Release.
	Deferred atomic.Uint64
	// Copied counts messages that arrived behind a rendezvous still
	// waiting for its FIN and were copied out of their receive buffers,
	// which went back at once (a held one would keep a credit).
	Copied atomic.Uint64
	// Spilled counts a Conn's messages (or the rest of one a Read took
	// part of) copied to the heap because no Read waited for them, their
	// receive buffers going back at once (conn.go, "Windows").
	Spilled atomic.Uint64
	// Compact counts data messages sent without their header, which
	// the immediate stood for (wire.go).
	Compact atomic.Uint64
	// HandshakesFailed counts control connections to a Listen address
	// that did not become a peer: a wrong token, another wire version or
	// EagerSize, a TLS failure, a peer that went away or took longer than
	// Config.HandshakeTimeout. The last one's address and error are
	// Snapshot.LastHandshakeFailure.
	HandshakesFailed atomic.Uint64
	// Split counts messages received split in parts (Config.SplitSize):
	// each is also one of Received.
	Split atomic.Uint64
}

// New opens the device and sets up the endpoint's queues and pools.
func New(cfg Config) (*Endpoint, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	e := &Endpoint{cfg: cfg, peers: map[*Peer]struct{}{}, byQPN: map[uint32]*lane{},
		handlers: map[uint32]handler{}, accepted: make(chan *Peer, cfg.MaxPeers), kick: make(chan struct{}, 1),
		resume: make(chan struct{}, 1), wc: make([]cq.WC, 64),
		work: make(chan work), overKick: make(chan struct{}, 1)}
	var idb [8]byte
	rand.Read(idb[:])
	e.id = binary.LittleEndian.Uint64(idb[:]) | 1
	var err error
	fail := func(err error) (*Endpoint, error) {
		e.closeCM()
		if e.ctx != nil {
			e.ctx.Close()
		}
		// No queue is left to write into the pools and no buffer went
		// out to a user: unmap them (a failed New kept them mapped).
		e.discardPools()
		return nil, fmt.Errorf("bx: endpoint on %s: %w", cfg.Device, err)
	}
	if e.ctx, err = uverbs.Open(cfg.Device); err != nil {
		return fail(err)
	}
	if e.gid, err = e.ctx.DefaultGID(int(cfg.Port)); err != nil {
		return fail(err)
	}
	if cfg.LaneSetup == LaneSetupCM {
		if err := e.openCM(); err != nil {
			return fail(err)
		}
	}
	// Every peer's credits are receive buffers on one SRQ: refuse what
	// the device cannot post before sizing anything by it.
	if posted, max := int64(cfg.MaxPeers)*int64(cfg.Credits), int64(e.ctx.Attr().MaxSRQWR); posted > max {
		return fail(fmt.Errorf("Config.MaxPeers %d x Credits %d = %d receive buffers; the device's shared receive queue takes %d",
			cfg.MaxPeers, cfg.Credits, posted, max))
	}
	if !cfg.SharedTargets && e.ctx.Attr().MaxMW == 0 {
		return fail(fmt.Errorf("device %s has no memory windows, which bx binds to open each rendezvous target to one peer for one transfer; set Config.SharedTargets to share one region among trusted peers instead", e.ctx.Name()))
	}
	e.backlog = make(chan work, cfg.backlog())
	e.retireAt = retireThreshold(cfg.Credits)
	for i := range e.rwr {
		e.rwr[i].SGEs = e.rsge[i : i+1]
	}
	if e.pd, err = e.ctx.AllocPD(); err != nil {
		return fail(err)
	}
	eagerCls := 1 << bits.Len(uint(cfg.EagerSize+HeaderSize-1))
	// Regions are sized to what the endpoint posts (a small endpoint
	// registers little), between 2 MiB (a huge page) and 32 MiB.
	eagerRegion := 2 << 20
	for eagerRegion < cfg.MaxPeers*cfg.Credits*eagerCls*2 && eagerRegion < 32<<20 {
		eagerRegion *= 2
	}
	if e.eager, err = mr.NewAllocator(e.pd, mr.AllocatorConfig{Classes: classes(64, eagerCls), RegionSize: eagerRegion,
		Limit: cfg.MemoryLimit, Access: mr.LocalWrite}); err != nil {
		return fail(err)
	}
	maxCls := 1 << bits.Len(uint(cfg.MaxMessage-1))
	region := int64(2 << 20)
	for region < int64(maxCls)*4 && region < 32<<20 || region < int64(maxCls) {
		region *= 2
	}
	lc := mr.AllocatorConfig{Classes: classes(eagerCls, maxCls), RegionSize: int(region), Limit: cfg.MemoryLimit, Access: mr.LocalWrite}
	if e.rndv, err = mr.NewAllocator(e.pd, lc); err != nil {
		return fail(err)
	}
	// Without SharedTargets targets too are local memory: a peer reaches
	// one only through the window bound for its transfer (grant.go).
	if cfg.SharedTargets {
		lc.Access = mr.LocalWrite | mr.RemoteWrite
	}
	if e.large, err = mr.NewAllocator(e.pd, lc); err != nil {
		return fail(err)
	}
	posted := cfg.MaxPeers * cfg.Credits
	if e.srq, err = qp.CreateSRQ(e.pd, qp.SRQConfig{MaxWR: uint32(posted)}); err != nil {
		return fail(err)
	}
	sendWR := laneSendWR(&cfg)
	cqe := posted + cfg.MaxPeers*cfg.Lanes*sendWR
	if cqe > int(e.ctx.Attr().MaxCQE) {
		cqe = int(e.ctx.Attr().MaxCQE)
	}
	if e.cq, err = cq.CreateWith(e.ctx, cqe, cq.Options{Events: true}); err != nil {
		return fail(err)
	}
	e.selfBound = time.AfterFunc(time.Hour, func() { e.cq.Interrupt() })
	e.selfBound.Stop()
	e.win = flow.NewWindow(flow.Limits{Msgs: cfg.EndpointMsgs, Bytes: cfg.EndpointBytes})
	wrs := make([]qp.RecvWR, 0, 64)
	sges := make([]qp.SGE, 64)
	for posted > 0 {
		wrs = wrs[:0]
		for i := 0; i < 64 && posted > 0; i, posted = i+1, posted-1 {
			b, err := e.eager.Alloc(eagerCls)
			if err != nil {
				return fail(err)
			}
			sges[i] = b.SGE(eagerCls)
			wrs = append(wrs, qp.RecvWR{ID: b.Handle(), SGEs: sges[i : i+1]})
		}
		if err := e.srq.PostRecv(wrs); err != nil {
			return fail(err)
		}
	}
	e.stopCh, e.stop = context.WithCancel(context.Background())
	liveEndpoints.Add(1)
	if cfg.Spin > 0 {
		registerPoller()
	}
	endpoints.Store(e, struct{}{})
	e.wg.Add(2)
	go e.progress()
	go e.ticker()
	if cfg.StallTimeout > 0 {
		e.wg.Add(1)
		go e.watchStalls()
	}
	return e, nil
}

func classes(lo, hi int) []int {
	var c []int
	for s := lo; s <= hi; s *= 2 {
		c = append(c, s)
	}
	return c
}

// ID is the endpoint's incarnation, as its peers see it (Peer.ID).
func (e *Endpoint) ID() uint64 {
	if e.bad() {
		return 0
	}
	return e.id
}

// Device returns the device name.
func (e *Endpoint) Device() string {
	if e.bad() {
		return ""
	}
	return e.cfg.Device
}

// Stats returns the endpoint's counters.
func (e *Endpoint) Stats() *Stats {
	if e.bad() {
		return nil
	}
	return &e.stats
}

// AllocatorStats reports the three buffer pools.
func (e *Endpoint) AllocatorStats() (eager, large, rndv mr.AllocatorStats) {
	if e.bad() {
		return eager, large, rndv
	}
	return e.eager.Stats(), e.large.Stats(), e.rndv.Stats()
}

// Close disconnects every peer and releases the device. Calls in flight
// fail with ErrClosed.
func (e *Endpoint) Close() error {
	if e.bad() {
		return errNilEndpoint
	}
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	e.mu.Lock()
	lns := e.lns
	peers := e.appendPeersLocked(nil)
	e.mu.Unlock()
	for _, l := range lns {
		l.Close()
	}
	for _, p := range peers {
		p.shutdown(ErrClosed, true)
	}
	// A peer that began to shut down on its own (an error, the peer's
	// bye) before is no longer in peers, and its teardown may still be
	// under way: its windows, QPs and fence must be gone before the
	// regions and the CQ go.
	e.downs.Wait()
	e.stop()
	e.wg.Wait()
	// A Call polling the CQ (pollFor) finishes its poll; after this none
	// starts another (it looks at cqGone under pollMu), so the CQ can go.
	e.pollMu.Lock()
	e.cqGone = true
	e.pollMu.Unlock()
	// A waiter in its own event wait (selfWait, holding waitMu) is in
	// cq.Wait, which reads the CQ's ring: stopCh ends that wait, and its
	// next poll sees cqGone. Once waitMu is free nobody is inside the CQ
	// (the race detector saw Close destroy the CQ under a Stream.Recv's
	// wait, TestHTTP, run AA).
	e.waitMu.Lock()
	e.waitGone = true
	e.waitMu.Unlock()
	e.selfBound.Stop()
	liveEndpoints.Add(-1)
	if e.cfg.Spin > 0 {
		unregisterPoller()
	}
	endpoints.Delete(e)
	e.win.Close()
	// A peer shutting down on its own, or a Msg released late, may still
	// return a buffer: from now on it goes nowhere.
	e.srqMu.Lock()
	e.srqGone = true
	e.srqMu.Unlock()
	// The peers are shut down: no window serves a transfer any more.
	gerr := e.closeGrants()
	// The listener and any lane's ID a peer left (with its QP) go before
	// the device.
	if cerr := e.closeCM(); gerr == nil {
		gerr = cerr
	}
	// Context.Close destroys QPs, the SRQ, CQ and MRs in reverse order.
	err := e.ctx.Close()
	if err == nil {
		err = gerr
	}
	// Nothing can write into the pools now. Unmap them unless a user
	// still holds one of their buffers (a Msg not released, an Alloc'ed
	// Buffer not handed back): its Data or Payload must stay readable, so
	// then the memory stays mapped for good, as mr.Allocator.Close does.
	if e.liveMsgs.Load() == 0 && e.userBufs.Load() == 0 {
		if derr := e.discardPools(); err == nil {
			err = derr
		}
	}
	return err
}

// discardPools unmaps the buffer pools New made (mr.Allocator.Discard):
// only once nothing can write into them and no buffer is out with a user.
// It returns the first error.
func (e *Endpoint) discardPools() error {
	var err error
	for _, a := range []*mr.Allocator{e.eager, e.large, e.rndv} {
		if a != nil {
			if derr := a.Discard(); derr != nil && err == nil {
				err = derr
			}
		}
	}
	return err
}

// peerList returns the connected peers.
func (e *Endpoint) peerList() []*Peer { return e.appendPeers(nil) }

// appendPeers appends the connected peers to dst[:0] (a goroutine that
// looks at them periodically reuses its slice: nothing allocated per look).
func (e *Endpoint) appendPeers(dst []*Peer) []*Peer {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.appendPeersLocked(dst)
}

// appendPeersLocked is appendPeers for a holder of e.mu.
func (e *Endpoint) appendPeersLocked(dst []*Peer) []*Peer {
	dst = dst[:0]
	for p := range e.peers {
		dst = append(dst, p)
	}
	return dst
}

// repost returns a receive buffer to the shared receive queue.
func (e *Endpoint) repost(b mr.Buf) error {
	e.srqMu.Lock()
	defer e.srqMu.Unlock()
	if e.srqGone {
		return ErrClosed
	}
	e.rsge[0] = b.SGE(b.Cap())
	e.rwr[0].ID = b.Handle()
	return e.srq.PostRecv(e.rwr[:1])
}

// retireBatch is the most buffers drainRetired posts in one call.
const retireBatch = 16

// retireThreshold is how many released buffers the poller lets queue
// before it posts them between its polls: Credits/8, at most
// retireBatch/2, at least 1. A post of one buffer cost about 550
// instructions a message on each side of a 64 B ping-pong (the queue's
// and the SRQ's locks, the provider's post, the returner), most of it
// the same for one buffer as for eight (scripts/bench-instr, docs/perf.md
// "Forty-first session"). What waits is at most Credits/8 of a peer's
// credits, for at most until the poller sleeps (it drains all first) or
// the ticker's next tick (it drains all too). With few Credits it is 1:
// every buffer goes back at the next poll, as before.
func retireThreshold(credits int) int32 {
	return int32(max(1, min(retireBatch/2, credits/8)))
}

// retiredBuf is a released receive buffer and the peer whose credit it
// becomes once it is posted again.
type retiredBuf struct {
	b mr.Buf
	p *Peer
}

// releaseRecv returns a data message's receive buffer and, once it is
// posted, its credit to the peer. While the endpoint polls (its progress
// goroutine, a waiting Call, or a Call that just handed the CQ back and
// will poll again) the buffer only queues, and the poller posts it between
// its polls: the Release, most often on a caller's path between its
// response and its next request, costs a lock and an append, not a post
// and the returner's lock. A buffer queued while the poller went to sleep
// waits for the ticker's next tick (poke), the bound on a credit's delay.
func (e *Endpoint) releaseRecv(b mr.Buf, p *Peer) {
	if e.cfg.Spin > 0 && (e.spinning.Load() || e.callerPolls.Load() || e.leftAt.Load() != 0) {
		e.retMu.Lock()
		e.retired = append(e.retired, retiredBuf{b: b, p: p})
		e.retN.Store(int32(len(e.retired)))
		e.retMu.Unlock()
		e.stats.Deferred.Add(1)
		e.poke()
		return
	}
	e.repost(b)
	p.ret.Released(1)
	e.poke()
}

// drainRetired posts the queued receive buffers, retireBatch to a call,
// and counts their credits (the pollMu holder between polls, the ticker,
// the progress goroutine before it sleeps).
func (e *Endpoint) drainRetired() {
	if e.retN.Load() == 0 {
		return
	}
	e.retMu.Lock()
	defer e.retMu.Unlock()
	rs := e.retired
	for len(rs) > 0 {
		k := min(len(rs), retireBatch)
		e.srqMu.Lock()
		if !e.srqGone {
			for i := range rs[:k] {
				b := &rs[i].b
				e.rsge[i] = b.SGE(b.Cap())
				e.rwr[i].ID = b.Handle()
			}
			e.srq.PostRecv(e.rwr[:k])
		}
		e.srqMu.Unlock()
		// A run of one peer's buffers is one call of its returner.
		for i := 0; i < k; {
			j := i + 1
			for j < k && rs[j].p == rs[i].p {
				j++
			}
			rs[i].p.ret.Released(uint64(j - i))
			i = j
		}
		rs = rs[k:]
	}
	clear(e.retired)
	e.retired = e.retired[:0]
	e.retN.Store(0)
	e.poke()
}

// newMsg returns a zero Msg carved from a slab: one allocation per 64
// messages. A Msg is never reused (Release is idempotent, so a released
// Msg must stay what it was); the slab goes when all of its are
// unreferenced. Only the holder of pollMu calls it.
func (e *Endpoint) newMsg() *Msg {
	if len(e.msgs) == 0 {
		e.msgs = make([]Msg, 64)
	}
	m := &e.msgs[0]
	e.msgs = e.msgs[1:]
	return m
}

// defaultTick is how often the ticker looks for credit and
// acknowledgement updates that are due while it runs; tickNS, when set
// (tests: SetTickForTest; GOVERBS_BX_TICK_US, for a process slowed down
// as a whole, as under scripts/bench-instr's valgrind), replaces it.
const defaultTick = 2 * time.Millisecond

var tickNS atomic.Int64

func init() {
	if us := envInt("GOVERBS_BX_TICK_US", 0); us > 0 {
		tickNS.Store(int64(us) * int64(time.Microsecond))
	}
}

func tick() time.Duration {
	if d := tickNS.Load(); d > 0 {
		return time.Duration(d)
	}
	return defaultTick
}

// poke tells the ticker that a message arrived or a buffer was released:
// an update may become due. It never blocks. Call it after the change
// (the ticker takes a poke and then looks; a poke before the change could
// be taken by a look that misses it).
func (e *Endpoint) poke() {
	if len(e.kick) == cap(e.kick) {
		// One is pending: the ticker looks after taking it, so after
		// this change too. (The select below would find it full as
		// well; this spares the runtime call, three a message.)
		return
	}
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// ticker sends the explicit credit and acknowledgement updates that
// piggybacking did not. It runs every tick while some peer has something
// to tell that could become due (flow.Returner.Quiet, an acknowledgement
// not sent) or something poked it during the tick; then it sleeps until
// poke, so an idle endpoint costs no CPU one tick after its last message.
// Sleeping at the first look that found nothing owed (piggybacking had
// carried it, as in any ping-pong) made the next message's poke wake it
// again: two wake-ups per tick instead of one while calls flow, each a
// thread woken when the process was otherwise asleep (docs/perf.md,
// "Thirty-seventh session").
func (e *Endpoint) ticker() {
	defer e.wg.Done()
	t := time.NewTimer(defaultTick)
	t.Stop()
	var peers []*Peer
	for {
		select {
		case <-e.stopCh.Done():
			return
		case <-e.kick:
		}
		e.tickerSleeps.Add(1)
		for busy := true; busy; {
			t.Reset(tick())
			select {
			case <-e.stopCh.Done():
				t.Stop()
				return
			case <-t.C:
			}
			e.ticks.Add(1)
			e.drainRetired()
			// Take the kick before looking: an event after this look
			// pokes again. One during the tick keeps the ticker going.
			poked := false
			select {
			case <-e.kick:
				poked = true
			default:
			}
			now := time.Now()
			peers = e.appendPeers(peers)
			busy = poked
			for _, p := range peers {
				if p.maybeUpdate(now) {
					busy = true
				}
			}
			clear(peers)
		}
	}
}

// WR ids: receives carry the buffer handle; these tag the rest.
const (
	tagWrite = 1 << 63
	tagSend  = 1 << 62
	tagProbe = 1 << 61 // and the probe's number (stall.go)
)

// DefaultSpin is Config.Spin's default: long enough to keep polling
// between the request and response of a ping-pong under TCG emulation
// (60-90 us there), short enough that an endpoint whose traffic stopped
// sleeps at once.
const DefaultSpin = 250 * time.Microsecond

// progress polls the CQ and completes what it finds. It keeps polling
// while Calls wait and for Config.Spin after the last completion; then it
// arms the CQ and sleeps in the netpoller until an event. While it polls
// it reads the clock and yields the processor only every few empty polls
// (each costs more than a poll, many times more under emulation).
//
// While a Call polls for its own response (pollFor), the progress
// goroutine waits, neither polling nor armed: an armed CQ would make the
// peer's doorbell raise an event and wake it, which is the cost polling
// avoids.
func (e *Endpoint) progress() {
	defer e.wg.Done()
	var idle time.Time
	empty := 0
	// window is the current spin window: Config.Spin, doubled (up to
	// maxSpinGrowth times) each time a sleep ends sooner than the largest
	// window would have lasted, so that steady traffic whose gaps exceed
	// Spin (a peer that thinks between calls, a loaded machine) keeps the
	// endpoint polling instead of paying an event per message; halved
	// after a longer sleep.
	window := e.cfg.Spin
	var lastYield time.Time
	var y yielder
	var park *time.Timer
	spinning := false
	setSpinning := func(on bool) {
		if spinning != on {
			spinning = on
			e.spinning.Store(on)
		}
	}
	for {
		if e.callerPolls.Load() || e.handedBack() {
			setSpinning(false)
			// While Calls poll, wait for the last one to hand the CQ
			// back; a Call of an endpoint without handlers does not
			// (lazyResume): then look again after the hand-back delay.
			// A waiter that waits for events itself (selfWait)
			// wakes us or leaves the CQ to the next one (handedBack)
			// as it goes, and waits at most selfWaitMax: looking
			// sooner would only wake us to find it still there.
			d := e.handBack()
			if e.selfWaiting.Load() {
				d = selfWaitStep
			}
			if park == nil {
				park = time.NewTimer(d)
			} else {
				park.Reset(d)
			}
			select {
			case <-e.resume:
			case <-park.C:
				e.parks.Add(1)
			case <-e.stopCh.Done():
				park.Stop()
				return
			}
			park.Stop()
			idle, empty = time.Time{}, 0
			continue
		}
		e.pollMu.Lock()
		n, err := e.pollLocked()
		e.pollMu.Unlock()
		if err != nil {
			return
		}
		if n > 0 {
			idle, empty, y = time.Time{}, 0, yielder{}
			// No yield here: what this poll woke (a worker, a stream
			// reader, the ticker) runs on another P, which takes it
			// from ours within microseconds, or at the next yield
			// (yielder). A yield after every completion cost the server
			// about 1500 instructions a call, a quarter of what it
			// runs per call (scripts/bench-instr; docs/perf.md,
			// "Twenty-seventh session").
			// Already spinning, it stays so: mayPoll (a clock read
			// and the pollers registry, about 270 instructions under
			// callgrind) is asked only when it would change that.
			if e.cfg.Spin > 0 && !spinning && e.mayPoll() {
				setSpinning(true)
			}
			continue
		}
		empty++
		if e.cfg.Spin > 0 && (empty&15 != 1 || e.mayPoll()) {
			setSpinning(true)
			if empty&15 != 1 {
				y.empty()
				continue
			}
			now := time.Now()
			if idle.IsZero() {
				idle = now
			}
			e.osYield(now, idle, &lastYield, 0)
			// While Calls wait, longer: up to 10 Spins, so that a slow
			// handler or a recovering peer does not keep a core busy.
			spin := window
			if e.waiting.Load() > 0 {
				spin = max(spin, 10*e.cfg.Spin)
			}
			if now.Sub(idle) < spin {
				continue
			}
		}
		if e.stopCh.Err() != nil {
			return
		}
		// Not polling any more: what Releases queued goes back now, and
		// what acknowledgements deferred is freed.
		setSpinning(false)
		e.pollMu.Lock()
		e.applyAcks()
		e.pollMu.Unlock()
		e.drainRetired()
		slept := time.Now()
		e.waitMu.Lock()
		// Set before looking at callerPolls, which a waiter sets before
		// it looks at this (selfWait): one of the two sees the other.
		e.progressWaits.Store(true)
		if e.callerPolls.Load() {
			// A Call takes the wait over (selfWait).
			e.progressWaits.Store(false)
			e.waitMu.Unlock()
			continue
		}
		err = e.cq.Wait(e.stopCh)
		e.progressWaits.Store(false)
		e.waitMu.Unlock()
		if errors.Is(err, uverbs.ErrInterrupted) {
			continue
		}
		if err != nil {
			return
		}
		if e.cfg.Spin > 0 {
			window = nextWindow(window, e.cfg.Spin, time.Since(slept))
		}
		idle, empty = time.Time{}, 0
	}
}

// maxSpinGrowth bounds the adaptive spin window: Config.Spin times this,
// 1 ms by default. GOVERBS_BX_SPINGROWTH sets it (1: the window stays
// Config.Spin). It was 16 (4 ms) until the thirty-seventh session: then,
// in two boots, polling through gaps of up to 4 ms was the worst setting
// for a parameter server's open loop (pull mean 1.1-2.4x and CPU per op
// 1.16-1.27x a cap of 4 Spins or of 1 at 300 and 600 pulls/s), and bought
// nothing measurable in its closed loop or a 64 B or 4 KiB ping-pong
// (docs/evaluation.md, "Thirty-seventh session"), since an event costs bx
// less than it did.
var maxSpinGrowth = time.Duration(max(envInt("GOVERBS_BX_SPINGROWTH", 4), 1))

// nextWindow is the spin window after a sleep of d that followed a window
// of w: doubled when d was shorter than the largest window (polling
// through it would have cost less than the event), else halved, down to
// spin (one slow wake-up does not undo what steady traffic taught).
func nextWindow(w, spin, d time.Duration) time.Duration {
	if d < maxSpinGrowth*spin {
		return min(2*w, maxSpinGrowth*spin)
	}
	return max(w/2, spin)
}

// pollLocked polls the CQ once and completes what it found. pollMu is
// held.
func (e *Endpoint) pollLocked() (int, error) {
	e.applyAcks()
	n, err := e.cq.Poll(e.wc)
	if err != nil {
		return 0, err
	}
	for i := range e.wc[:n] {
		e.complete(&e.wc[i])
	}
	if e.retN.Load() >= e.retireAt {
		e.drainRetired()
	}
	return n, nil
}

// applyAcks applies the acknowledgements deferred since the last poll
// (deferAck). pollMu is held.
func (e *Endpoint) applyAcks() {
	for i, l := range e.acks {
		l.ackQueued = false
		l.peer.applyAck(l)
		e.acks[i] = nil
	}
	e.acks = e.acks[:0]
}

// mayPoll reports whether this endpoint may poll (liveEndpoints, and
// the machine's pollers registry: pollers.go).
func (e *Endpoint) mayPoll() bool { return e.mayPollAt(time.Time{}) }

// mayPollAt is mayPoll for a caller that read the clock a moment ago (a
// Call, as it starts): the registry's refresh is due by now, whose zero
// value reads the clock.
func (e *Endpoint) mayPollAt(now time.Time) bool {
	if forcePoll.Load() {
		return true
	}
	if liveEndpoints.Load() != 1 {
		return false
	}
	if now.IsZero() {
		now = time.Now()
	}
	return spareProcs(now)
}

// lazyResume: a Call that got its response leaves the CQ to the next Call
// instead of waking the progress goroutine (endpoints without handlers).
var lazyResume = os.Getenv("GOVERBS_BX_LAZY") != "0"

// yieldEvery is how many polls of an empty CQ a polling goroutine makes
// between yields of its P (runtime.Gosched); 0: it never yields (the
// runtime still preempts it every 10 ms). GOVERBS_BX_YIELD sets it.
var yieldEvery = envInt("GOVERBS_BX_YIELD", 4)

// osYieldEvery: a poller whose CQ has been empty this long gives its CPU
// to whatever else is runnable there (sched_yield), and again every as
// long while the CQ stays empty; 0 never. A polling process has a core to
// itself only as far as the kernel lets it: a spinning thread holds its
// CPU until the scheduler's tick takes it away, while the timers,
// softirqs (rxe's receive path) and other threads waiting for that CPU
// wait a time slice, which was the tail of a polling parameter server
// (docs/perf.md, "Twenty-second session": closed-loop pull p99 6.8-9.4 ms
// without, 2.4-3.6 ms with). A ping-pong whose answer comes within it
// never yields, nor does a poller that nothing else of its endpoint
// waits for (osYield). GOVERBS_BX_OSYIELD sets it in usec.
var osYieldEvery = time.Duration(envInt("GOVERBS_BX_OSYIELD", 100)) * time.Microsecond

// osYield yields the thread to the kernel's other runnable threads when
// yieldDue says so and othersWait(self): a poller alone in its process (one
// Call waiting, handlers inline) hands the CPU only to the thread that its
// own runtime.Gosched woke to look for work, which finds none and sleeps
// again, and that cost a 4 KiB ping-pong 40% under TCG (docs/perf.md,
// "Twenty-eighth session"); the kernel still takes the CPU from it at its
// tick when another thread waits. GOVERBS_BX_OSYIELD_ALWAYS=1 yields
// whether others wait or not (the behaviour before the thirty-first
// session).
func (e *Endpoint) osYield(now, idle time.Time, last *time.Time, self int64) {
	if !yieldDue(now, idle, *last, osYieldEvery) {
		return
	}
	*last = now
	if !osYieldAlways && !e.othersWait(self) {
		return
	}
	unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
}

// osYieldAlways: GOVERBS_BX_OSYIELD_ALWAYS=1, osYield does not ask
// othersWait.
var osYieldAlways = os.Getenv("GOVERBS_BX_OSYIELD_ALWAYS") == "1"

// othersWait reports whether a goroutine of the endpoint other than the
// poller waits for something a poll delivers (a Call or Recv: it then
// needs a CPU to run), or a blocking handler runs on the worker pool:
// what a parameter server's tail waits for while pollers hold every CPU
// (docs/perf.md, "Twenty-second session"). self is 1 when the poller is
// a waiting Call or Recv itself (counted in waiting), 0 for the progress
// goroutine.
func (e *Endpoint) othersWait(self int64) bool {
	return e.waiting.Load() > self || e.busy.Load() > 0
}

// yieldDue reports whether a poller of a CQ empty since idle, which last
// yielded at last, yields at now: once the CQ has been empty for every,
// then every so often.
func yieldDue(now, idle, last time.Time, every time.Duration) bool {
	return every > 0 && !idle.IsZero() && now.Sub(idle) >= every && now.Sub(last) >= every
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= 0 {
		return v
	}
	return def
}

// procStart is the origin of leftAt.
var procStart = time.Now()

// handBack is how long the progress goroutine waits, while Calls poll or
// after the last one left without waking it, before it looks again: 4
// Spins, and 4 DefaultSpins on an endpoint that does not poll (Spin
// negative: a wait of 4 Spins, negative, ended at once, and the progress
// goroutine spun through its timer beside every waiting Call, a core's
// worth, and with GOMAXPROCS=1 kept the netpoller from the Call's event
// for sysmon's 10 ms).
func (e *Endpoint) handBack() time.Duration {
	if e.cfg.Spin <= 0 {
		return 4 * DefaultSpin
	}
	return 4 * e.cfg.Spin
}

// handedBack reports whether the last polling Call left the CQ without
// waking the progress goroutine less than handBack ago: the next Call
// is likely to take it over. Once that has passed it clears leftAt, so
// that the progress loop, which asks on every turn, reads no clock
// until the next hand-back.
func (e *Endpoint) handedBack() bool {
	t := e.leftAt.Load()
	if t == 0 {
		return false
	}
	if time.Since(procStart)-time.Duration(t) < e.handBack() {
		return true
	}
	e.leftAt.CompareAndSwap(t, 0)
	return false
}

// forcePoll makes every endpoint poll whatever else runs (tests).
var forcePoll atomic.Bool

// pollFor is a Call waiting for its response on ch: when the endpoint
// polls (Config.Spin, mayPoll) and no other Call does, it polls the CQ
// itself and completes what it finds, its own response or other callers'
// and requests (run-to-completion, as eRPC's application threads run the
// event loop), so that its response reaches it with no goroutine hand-off.
// It polls for 10 Spins without a completion at most, then leaves the CQ to
// the progress goroutine; got reports whether it took a message (or a
// closed channel) from ch.
func (e *Endpoint) pollFor(ctx context.Context, ch chan *Msg) (m *Msg, ok, got bool) {
	got = e.pollUntil(ctx, func() bool {
		select {
		case m, ok = <-ch:
			return true
		default:
			return false
		}
	})
	return m, ok, got
}

// pollUntil is pollFor for any waiter: it polls the CQ while done reports
// false (done takes what the waiter waits for when it is there, and is
// called again after each poll that completed something), for 10 Spins
// without a completion at most, and reports whether done did report
// true. On an endpoint that does not poll (Config.Spin negative, or
// mayPoll false) it waits for the CQ's events itself instead (selfWait).
// A Stream.Recv polls so for its next message: a net.Conn's reader then
// gets its data with no hand-off from the progress goroutine, and the
// progress goroutine, waiting meanwhile, does not spin beside it.
func (e *Endpoint) pollUntil(ctx context.Context, done func() bool) bool {
	return e.pollUntilAt(ctx, time.Time{}, done)
}

// pollUntilAt is pollUntil for a waiter that read the clock at now, a
// moment ago (zero: it reads it): a Call's start spares it a clock read.
func (e *Endpoint) pollUntilAt(ctx context.Context, now time.Time, done func() bool) bool {
	if !e.callerPolls.CompareAndSwap(false, true) {
		return false
	}
	got := false
	// seen is the latest clock reading the wait made (the Call's start,
	// or a reading every 16 empty polls): the hand-back's time, which
	// needs no precision finer than a call (handBack is 4 Spins), so a
	// Call reads no clock for it.
	seen := now
	defer func() {
		if r := recover(); r != nil {
			pollerPanic(r)
		}
		e.selfWaiting.Store(false)
		e.callerPolls.Store(false)
		if got && lazyResume && !e.serves.Load() && e.waiting.Load() <= 1 {
			// The next Call most likely takes the CQ over before
			// the progress goroutine would: waking it costs a thread
			// wake-up (futex) and a third runnable thread on a
			// two-pollers machine, per call. It looks again on its
			// own after the hand-back delay. Not while another Call
			// or Recv waits (waiting counts us too): it waits on its
			// channel for whoever polls.
			if seen.IsZero() {
				seen = time.Now()
			}
			e.leftAt.Store(max(int64(seen.Sub(procStart)), 1))
			e.stats.HandBacks.Add(1)
			return
		}
		e.leftAt.Store(0)
		select {
		case e.resume <- struct{}{}:
			e.stats.Resumes.Add(1)
		default:
		}
	}()
	if e.cfg.Spin <= 0 || !e.mayPollAt(now) {
		// Waiting for events. A waiter that got what it waited for
		// leaves the CQ to the next one as a polling Call does (above):
		// waking the progress goroutine as it leaves and interrupting
		// its wait as the next Call comes were two goroutine and
		// thread wake-ups per call.
		e.selfWaiting.Store(true)
		got = e.selfWait(ctx, done)
		seen = time.Time{} // it may have waited long: the clock, then
		return got
	}
	var idle, lastYield time.Time
	var y yielder
	for i := 1; ; i++ {
		if done() {
			got = true
			return true
		}
		n, ok := e.pollStep(true)
		if !ok {
			return false
		}
		if n > 0 {
			if done() {
				// Our own poll delivered it (or the progress
				// goroutine's last one, just before we took over).
				e.stats.SelfPolled.Add(1)
				got = true
				return true
			}
			idle, i, y = time.Time{}, 0, yielder{}
			continue
		}
		if i&15 == 0 { // a power of two: no division (a helper call under TCG)
			if ctx.Err() != nil {
				return false
			}
			now := time.Now()
			seen = now
			if idle.IsZero() {
				idle = now
			} else if now.Sub(idle) >= 10*e.cfg.Spin {
				return false
			}
			e.osYield(now, idle, &lastYield, 1)
		}
		y.empty()
	}
}

// pollerPanic ends the process for a panic raised while a Call's or a
// Recv's goroutine polled the CQ: an inline handler it ran for a peer (or
// a completion it handled) panicked with pollMu held and completions
// half handled. Recovered up that goroutine's stack (net/http recovers
// its handlers' panics), it left every peer of the endpoint stalled for
// good and said nothing; so it crashes the process, as the same panic
// does on the progress goroutine or a worker, with the stack where it was
// raised.
func pollerPanic(r any) {
	stack := debug.Stack()
	msg := fmt.Sprintf("bx: panic while a Call or Recv polled the endpoint's CQ (an inline handler?): %v\n\n%s", r, stack)
	go func() { panic(msg) }()
	select {} // until the process dies
}

// yielder yields the P of a goroutine polling an empty CQ every
// yieldEvery polls (runtime.Gosched), counting down instead of dividing.
type yielder struct{ n int }

func (y *yielder) empty() {
	if yieldEvery <= 0 {
		return
	}
	if y.n++; y.n >= yieldEvery {
		y.n = 0
		runtime.Gosched()
	}
}

// pollStep polls the CQ once for a waiter (pollUntil, selfWait) and
// completes what it found: n completions, ok false when the CQ is going
// (Close) or the poll failed, and the waiter gives up. With try it does
// not wait for pollMu: while someone else polls, it reports 0, true.
func (e *Endpoint) pollStep(try bool) (n int, ok bool) {
	if !try {
		e.pollMu.Lock()
	} else if !e.pollMu.TryLock() {
		return 0, true
	}
	// Unlocked by hand, not deferred: the deferred call cost about 40
	// instructions a poll (scripts/bench-instr), and nothing under pollMu
	// recovers from a panic.
	if e.cqGone {
		e.pollMu.Unlock()
		return 0, false
	}
	n, err := e.pollLocked()
	e.pollMu.Unlock()
	return n, err == nil
}

// Bounds of selfWait: each event wait at most selfWaitStep (then it looks
// at its context and at done again), all of them at most selfWaitMax
// (then it leaves the CQ to the progress goroutine, so that a reader
// idle for long costs no timer wake-ups).
const (
	selfWaitStep = 10 * time.Millisecond
	selfWaitMax  = 200 * time.Millisecond
)

// selfWait is pollUntil on an endpoint that does not poll (event-driven,
// or one that may not poll): the waiter, holding
// callerPolls, waits for the CQ's events itself instead of the progress
// goroutine, and polls when one comes. So the goroutine the netpoller
// wakes is the one whose response arrived: no second goroutine to make
// runnable, and no second thread woken to run it (docs/perf.md, "where
// an event wake-up's time goes"). It takes the wait from the progress
// goroutine by interrupting it, completes whatever it polls (other
// callers' responses, requests) as the progress goroutine would, and
// reports whether done reported true within selfWaitMax.
func (e *Endpoint) selfWait(ctx context.Context, done func() bool) bool {
	if e.progressWaits.Load() {
		e.cq.Interrupt() // the progress goroutine leaves its wait (or skips the next)
	}
	e.waitMu.Lock()
	defer e.waitMu.Unlock()
	if e.waitGone {
		return false
	}
	start := time.Now()
	for {
		if done() {
			return true
		}
		n, ok := e.pollStep(false)
		if !ok {
			return false
		}
		if n > 0 {
			if done() {
				e.stats.SelfPolled.Add(1)
				return true
			}
			continue
		}
		if ctx.Err() != nil || e.stopCh.Err() != nil || time.Since(start) >= selfWaitMax {
			return false
		}
		step := selfWaitStep
		if d, ok := ctx.Deadline(); ok {
			step = max(min(step, time.Until(d)), 0)
		}
		e.selfBound.Reset(step)
		err := e.cq.Wait(e.stopCh)
		e.selfBound.Stop()
		if err != nil && !errors.Is(err, uverbs.ErrInterrupted) {
			return false
		}
	}
}

// liveEndpoints counts the process's open endpoints. Polling an empty CQ
// keeps a goroutine runnable, and while every P is busy the scheduler
// looks at the netpoller only every 10 ms (sysmon): goroutines sleeping
// there (another endpoint's progress, TCP connections) would wait that
// long. So an endpoint polls only when it is the process's only one and
// GOMAXPROCS leaves a P for the rest; otherwise it is event-driven.
var liveEndpoints atomic.Int32

// work is a request for a blocking handler.
type work struct {
	p   *Peer
	h   Handler
	req *Msg
	// resp, when set, is an inline handler's response that could not go
	// out without waiting: the worker sends it (stream, flags, call).
	resp   Buffer
	reply  bool
	stream uint32
	flags  uint16
	call   uint64
}

// queue hands w to the worker pool and never blocks: to a worker waiting
// for work if there is one, else to a new worker while the pool is below
// Config.Workers, else to the backlog, which the workers drain as they
// finish (see Endpoint.backlog).
func (e *Endpoint) queue(w work) {
	e.busy.Add(1)
	select {
	case e.work <- w:
		return
	default:
	}
	if e.workers.Add(1) <= int32(e.cfg.Workers) {
		go e.worker(w)
		return
	}
	e.workers.Add(-1)
	if e.overN.Load() == 0 {
		select {
		case e.backlog <- w:
			return
		default:
		}
	}
	e.overMu.Lock()
	e.overflow = append(e.overflow, w)
	e.overN.Store(int32(len(e.overflow)))
	e.overMu.Unlock()
	select {
	case e.overKick <- struct{}{}:
	default:
	}
}

// next takes queued work, if there is any: the backlog's first, then
// overflow's, which came after it.
func (e *Endpoint) next() (work, bool) {
	select {
	case w := <-e.backlog:
		return w, true
	default:
	}
	if e.overN.Load() == 0 {
		return work{}, false
	}
	e.overMu.Lock()
	defer e.overMu.Unlock()
	if len(e.overflow) == 0 {
		return work{}, false
	}
	w := e.overflow[0]
	e.overflow[0] = work{}
	e.overflow = e.overflow[1:]
	e.overN.Store(int32(len(e.overflow)))
	return w, true
}

// worker runs w, then whatever comes next, until the endpoint closes.
func (e *Endpoint) worker(w work) {
	defer e.workers.Add(-1)
	for {
		if w.reply {
			w.p.sendMsg(context.Background(), w.stream, w.flags, w.call, &w.resp)
		} else {
			w.p.serve(w.h, w.req)
		}
		e.busy.Add(-1)
		// The backlog (and overflow) first: what waits there queued
		// before anything that could come through e.work now.
		var ok bool
		for w, ok = e.next(); !ok; {
			select {
			case w = <-e.backlog:
				ok = true
			case w = <-e.work:
				ok = true
			case <-e.overKick:
				w, ok = e.next()
			case <-e.stopCh.Done():
				return
			}
		}
	}
}

// laneOf returns the lane of QP qpn (nil: none of ours), through a
// one-entry cache of the last answer: a published map never changes
// (publishQPNs makes a new one), so the answer stands while the map and
// the QP number are the same. Most completions in a row are one lane's.
// Only complete calls it: pollMu is held.
func (e *Endpoint) laneOf(qpn uint32) *lane {
	m := e.qpns.Load()
	if c := &e.laneHit; c.m == m && c.qpn == qpn && m != nil {
		return c.l
	}
	var l *lane
	if m != nil {
		l = (*m)[qpn]
	}
	e.laneHit = laneHit{m: m, qpn: qpn, l: l}
	return l
}

// laneHit is laneOf's cache.
type laneHit struct {
	m   *map[uint32]*lane
	qpn uint32
	l   *lane
}

// publishQPNs publishes a copy of byQPN for laneOf. e.mu is held.
func (e *Endpoint) publishQPNs() {
	m := make(map[uint32]*lane, len(e.byQPN))
	for k, v := range e.byQPN {
		m[k] = v
	}
	e.qpns.Store(&m)
}

// publishHandlers publishes a copy of handlers for handlerOf. e.mu is held.
func (e *Endpoint) publishHandlers() {
	m := make(map[uint32]handler, len(e.handlers))
	for k, v := range e.handlers {
		m[k] = v
	}
	e.hands.Store(&m)
}

// handlerOf returns the handler of a stream (zero if none).
func (e *Endpoint) handlerOf(stream uint32) handler {
	if m := e.hands.Load(); m != nil {
		return (*m)[stream]
	}
	return handler{}
}

func (e *Endpoint) complete(w *cq.WC) {
	l := e.laneOf(w.QPNum)
	switch {
	case w.ID&tagWrite != 0:
		// Only errors complete: a WRITE the peer's QP refused (its CTS
		// named memory it does not own) is the peer's protocol violation;
		// any other error is a lane failure like a SEND's.
		if l == nil || w.Status == wr.WCSuccess {
			break
		}
		switch w.Status {
		case wr.WCRemAccessErr, wr.WCRemInvReqErr, wr.WCRemOpErr:
			l.peer.shutdown(fmt.Errorf("%w: rendezvous write refused (bad target from the peer?): %v", ErrProtocol, w.Err()), true)
		default:
			// Flushed, or retries ran out (a lossy link): recovery resends
			// it.
			l.peer.laneFailed(l, w.Err())
		}
	case w.ID&tagSend != 0:
		if l == nil {
			break
		}
		if w.Status != wr.WCSuccess {
			l.peer.laneFailed(l, w.Err())
			break
		}
		l.sendsDone.Add(1) // the QP moves (stall.go)
	case w.ID&tagProbe != 0:
		if l == nil {
			break
		}
		if w.Status != wr.WCSuccess {
			l.peer.laneFailed(l, w.Err())
			break
		}
		l.probed.Store(w.ID &^ tagProbe)
	default:
		b, ok := e.eager.FromHandle(w.ID)
		if !ok {
			return // not ours: cannot happen
		}
		if w.Status != wr.WCSuccess {
			// A flushed receive of a dead QP: the buffer goes back.
			e.repost(b)
			if l != nil {
				l.peer.laneFailed(l, w.Err())
			}
			return
		}
		if l == nil {
			e.stats.Unrouted.Add(1)
			e.repost(b)
			return
		}
		var inv uint32
		if w.Flags&wr.WCWithInv != 0 {
			inv = w.InvRKey
		}
		l.peer.received(l, b, int(w.ByteLen), w.QPNum, inv, w.Imm, w.Flags&wr.WCWithImm != 0)
	}
}
