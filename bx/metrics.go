package bx

// Metrics: an in-process snapshot of an endpoint (Endpoint.Snapshot) that
// package metrics exposes to Prometheus, and the RPC latency histograms
// behind it.
//
// Everything in a Snapshot is read at the time of the call from counters
// the endpoint keeps anyway (Stats, the flow.Credits and flow.Window of
// every peer and lane, the allocators), except RPC latency: Peer.Call and
// Peer.CallBuffer record each call's latency into a fixed-bucket log2
// histogram of the call's stream class, with atomic counters (no lock and
// no allocation per call once the stream was seen).
//
// Stream class: by default a stream's class is its stream number in
// decimal ("7"). Endpoint.SetStreamClass replaces that with a function of
// the stream number, so an application with many streams can group them
// ("pull", "push", "control", ...). An endpoint keeps at most
// MaxStreamClasses classes; streams of further classes count as
// OtherStreamClass, which keeps a metrics endpoint's series bounded
// whatever stream numbers an application uses.

import (
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goverbs/goverbs/flow"
	"github.com/goverbs/goverbs/internal/hist"
	"github.com/goverbs/goverbs/mr"
)

// MaxStreamClasses bounds the stream classes an endpoint records.
const MaxStreamClasses = 64

// OtherStreamClass is the class of streams beyond MaxStreamClasses classes,
// and of streams a class function gives an empty class.
const OtherStreamClass = "other"

// maxClassLen bounds a class name (bytes).
const maxClassLen = 64

// maxCachedStreams bounds the stream-to-class cache; calls on streams
// beyond it are classified on each call (a lock and the class function).
const maxCachedStreams = 4096

// Histogram is a latency histogram: Count, Sum and per-bucket counts of
// fixed log2 buckets. Buckets[i] counts latencies in (HistogramBound(i-1),
// HistogramBound(i)]; the last bucket is unbounded.
type Histogram = hist.Histogram

// HistogramBuckets is the number of buckets of a Histogram.
const HistogramBuckets = hist.Buckets

// HistogramBound is bucket i's inclusive upper bound: 2^(10+i) ns, from
// 1.024 µs to 2^35 ns (34.4 s); the last bucket's is math.MaxInt64 (+Inf).
func HistogramBound(i int) time.Duration { return hist.Bound(i) }

// Snapshot is an endpoint's state at one moment, in plain values.
type Snapshot struct {
	Device string
	ID     uint64 // the endpoint's incarnation (Endpoint.ID)
	Time   time.Time
	Closed bool
	// Counters are the endpoint's Stats.
	Counters Counters
	// Window is the endpoint-wide send window (Config.EndpointMsgs and
	// EndpointBytes): messages and bytes posted and not yet acknowledged.
	Window WindowSnapshot
	// Peers are the connected peers, ordered by ID.
	Peers []PeerSnapshot
	// Classes are the stream classes with calls, ordered by name.
	Classes []ClassSnapshot
	// Pools are the buffer pools: "eager" (receive buffers, eager sends),
	// "large" (rendezvous targets), "rndv" (rendezvous sources).
	Pools []PoolSnapshot
	// Workers is how many goroutines the handler pool has (busy or idle;
	// at most Config.Workers). They stay until Close.
	Workers int
	// LastHandshakeFailure is the dialer's address and the error of the
	// last accepted control connection that did not become a peer
	// (Counters.HandshakesFailed counts them); "" if none did.
	LastHandshakeFailure string
}

// Counters are the values of an endpoint's Stats.
type Counters struct {
	Sent, Received, Duplicates, Rendezvous, CreditUpdates, Recoveries, Unrouted, ClosedDrops uint64
	// SelfPolled: Calls whose response their own goroutine polled.
	SelfPolled uint64
	// Resumes: waiters that woke the progress goroutine as they left the
	// CQ; HandBacks: Calls that left it to the next Call instead.
	Resumes, HandBacks uint64
	// Arms and Wakeups: the endpoint's CQ armed for an event, and woken
	// by one (the event-driven path; a polling endpoint has few).
	Arms, Wakeups uint64
	// Ticks: the credit ticker woke on its timer.
	Ticks uint64
	// Probes and Stalls: see Stats.
	Probes, Stalls uint64
	// Deferred: receive buffers re-posted by the poller (see Stats).
	Deferred uint64
	// Copied: messages copied out of their receive buffers behind a
	// rendezvous (see Stats).
	Copied uint64
	// Spilled: a Conn's messages copied to the heap, no Read waiting
	// (see Stats).
	Spilled uint64
	// Compact: data messages sent without their header (see Stats).
	Compact uint64
	// Split: messages received in parts (see Stats).
	Split uint64
	// HandshakesFailed: accepted control connections that did not
	// become a peer (see Stats).
	HandshakesFailed uint64
}

// WindowSnapshot is a send window's occupancy and counters.
type WindowSnapshot struct {
	Limits        flow.Limits
	InFlightMsgs  int64
	InFlightBytes int64
	flow.WindowStats
}

// PeerSnapshot is one peer.
type PeerSnapshot struct {
	ID     uint64 // the remote endpoint's incarnation (Peer.ID)
	Addr   string // the control connection's remote address
	Dialer bool   // we dialled it
	// State is "active", "recovering" or "dead".
	State string
	// CreditsAvailable are the receive credits data messages may use now;
	// Credits the cumulative credit counters: Stalls are sends that waited
	// for a credit, WaitTime their total wait, Waiting those waiting now.
	CreditsAvailable uint64
	Credits          flow.CreditStats
	// Window sums the peer's lane windows (Config.LaneMsgs, LaneBytes):
	// Stalls are sends that waited for room in a lane's or the endpoint's
	// window, InFlight* what is posted and not yet acknowledged.
	Window WindowSnapshot
	// Recoveries counts the peer's connection recoveries that got as far
	// as resynchronising credits (each starts a new credit epoch).
	Recoveries uint64
}

// ClassSnapshot is the RPC calls of one stream class (see the Metrics
// comment at the top of bx/metrics.go).
type ClassSnapshot struct {
	Class string
	// Latency has every call that got a response (a RemoteError
	// included), from Call to the response's arrival.
	Latency Histogram
	// RemoteErrors are responses that were a handler's error; Failures
	// calls that got no response (context done, peer gone, closed, send
	// error).
	RemoteErrors, Failures uint64
}

// PoolSnapshot is one buffer pool.
type PoolSnapshot struct {
	Pool string // eager, large or rndv
	mr.AllocatorStats
}

// SetStreamClass makes class(stream) the class of a stream's RPC calls
// from now on (streams already classified are classified again). A nil
// class restores the default, the stream number in decimal. The function
// is called once per stream (per stream beyond 4096 streams: once per
// call) and must be fast and safe for concurrent use. Class names are cut
// to 64 bytes and made valid UTF-8; an empty one is OtherStreamClass.
func (e *Endpoint) SetStreamClass(class func(stream uint32) string) error {
	if e.bad() {
		return errNilEndpoint
	}
	e.met.setClass(class)
	return nil
}

// setClass is SetStreamClass.
func (m *metricsState) setClass(class func(stream uint32) string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if class == nil {
		m.classFn = nil
	} else {
		m.classFn = class
	}
	m.streams.Store(nil)
}

// metricsState is what an Endpoint keeps for Snapshot beyond its Stats.
// The zero value is ready.
type metricsState struct {
	streams atomic.Pointer[streamCache] // copy on write

	mu      sync.Mutex
	classFn func(uint32) string
	classes map[string]*classStats
}

type classStats struct {
	name                 string
	lat                  hist.Recorder
	remoteErrs, failures atomic.Uint64
}

// streamCache maps streams to their class stats: the first few in an
// array searched in order, the rest (up to maxCachedStreams) in a map.
// A call looks its stream up once; with a handful of streams the array
// costs a few compares where a map lookup cost about 60 instructions and
// the map's code (scripts/bench-instr).
type streamCache struct {
	few  [8]streamClass
	nfew int
	more map[uint32]*classStats
}

type streamClass struct {
	stream uint32
	c      *classStats
}

func (sc *streamCache) lookup(stream uint32) *classStats {
	for i := range sc.few[:sc.nfew] {
		if sc.few[i].stream == stream {
			return sc.few[i].c
		}
	}
	return sc.more[stream]
}

func (sc *streamCache) len() int {
	if sc == nil {
		return 0
	}
	return sc.nfew + len(sc.more)
}

// class returns the stats of a stream's class.
func (m *metricsState) class(stream uint32) *classStats {
	if p := m.streams.Load(); p != nil {
		if c := p.lookup(stream); c != nil {
			return c
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.streams.Load() // stores happen under mu: this stays current
	if old != nil {
		if c := old.lookup(stream); c != nil {
			return c // another caller added it meanwhile: no second entry
		}
	}
	name := strconv.FormatUint(uint64(stream), 10)
	if m.classFn != nil {
		name = cleanClass(m.classFn(stream))
	}
	if m.classes == nil {
		m.classes = map[string]*classStats{}
	}
	c := m.classes[name]
	if c == nil {
		if len(m.classes) >= MaxStreamClasses {
			name = OtherStreamClass
			c = m.classes[name]
		}
		if c == nil {
			c = &classStats{name: name}
			m.classes[name] = c
		}
	}
	if old.len() < maxCachedStreams {
		n := &streamCache{}
		if old != nil {
			n.few, n.nfew = old.few, old.nfew
			if old.more != nil {
				n.more = make(map[uint32]*classStats, 1+len(old.more))
				for k, v := range old.more {
					n.more[k] = v
				}
			}
		}
		if n.nfew < len(n.few) {
			n.few[n.nfew] = streamClass{stream, c}
			n.nfew++
		} else {
			if n.more == nil {
				n.more = map[uint32]*classStats{}
			}
			n.more[stream] = c
		}
		m.streams.Store(n)
	}
	return c
}

func cleanClass(s string) string {
	if len(s) > maxClassLen {
		s = s[:maxClassLen]
	}
	s = strings.ToValidUTF8(s, "?")
	if s == "" {
		return OtherStreamClass
	}
	return s
}

// observeCall records a finished call of Call/CallBuffer.
func (m *metricsState) observeCall(stream uint32, start time.Time, err error) {
	c := m.class(stream)
	switch {
	case err == nil:
		c.lat.Observe(time.Since(start))
	case isRemote(err):
		c.lat.Observe(time.Since(start))
		c.remoteErrs.Add(1)
	default:
		c.failures.Add(1)
	}
}

// isRemote is IsRemote without errors.As's allocation.
func isRemote(err error) bool {
	for err != nil {
		switch u := err.(type) {
		case *RemoteError:
			return true
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if isRemote(e) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

func (m *metricsState) snapshot() []ClassSnapshot {
	m.mu.Lock()
	cs := make([]*classStats, 0, len(m.classes))
	for _, c := range m.classes {
		cs = append(cs, c)
	}
	m.mu.Unlock()
	out := make([]ClassSnapshot, len(cs))
	for i, c := range cs {
		out[i] = ClassSnapshot{Class: c.name, Latency: c.lat.Read(), RemoteErrors: c.remoteErrs.Load(), Failures: c.failures.Load()}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Class < out[j].Class })
	return out
}

// Snapshot returns the endpoint's counters, peers, RPC latency per stream
// class and buffer pools. It takes no lock a send or the progress
// goroutine holds for long and may be called at any time, also after
// Close (then without peers). A nil Endpoint, or a zero one (not from
// New), gives an empty Snapshot.
func (e *Endpoint) Snapshot() Snapshot {
	if e.bad() {
		return Snapshot{}
	}
	s := Snapshot{Device: e.cfg.Device, ID: e.id, Time: time.Now(), Closed: e.closed.Load()}
	st := &e.stats
	s.Counters = Counters{Sent: st.Sent.Load(), Received: st.Received.Load(), Duplicates: st.Duplicates.Load(),
		Rendezvous: st.Rendezvous.Load(), CreditUpdates: st.CreditUpdates.Load(), Recoveries: st.Recoveries.Load(),
		Unrouted: st.Unrouted.Load(), ClosedDrops: st.ClosedDrops.Load(), SelfPolled: st.SelfPolled.Load(), Resumes: st.Resumes.Load(), HandBacks: st.HandBacks.Load(), Ticks: e.ticks.Load(),
		Probes: st.Probes.Load(), Stalls: st.Stalls.Load(), Deferred: st.Deferred.Load(), Copied: st.Copied.Load(), Spilled: st.Spilled.Load(), Compact: st.Compact.Load(), Split: st.Split.Load(),
		HandshakesFailed: st.HandshakesFailed.Load()}
	if f := e.lastHSFail.Load(); f != nil {
		s.LastHandshakeFailure = *f
	}
	if e.cq != nil {
		cs := e.cq.Stats()
		s.Counters.Arms, s.Counters.Wakeups = cs.Arms, cs.Wakeups
	}
	s.Window = windowOf(e.win)
	s.Workers = int(e.workers.Load())
	for _, p := range e.peerList() {
		s.Peers = append(s.Peers, p.snapshot())
	}
	sort.Slice(s.Peers, func(i, j int) bool { return s.Peers[i].ID < s.Peers[j].ID })
	s.Classes = e.met.snapshot()
	for _, pl := range []struct {
		name string
		a    *mr.Allocator
	}{{"eager", e.eager}, {"large", e.large}, {"rndv", e.rndv}} {
		if pl.a != nil {
			s.Pools = append(s.Pools, PoolSnapshot{Pool: pl.name, AllocatorStats: pl.a.Stats()})
		}
	}
	return s
}

func windowOf(w *flow.Window) WindowSnapshot {
	if w == nil {
		return WindowSnapshot{}
	}
	m, b := w.Outstanding()
	return WindowSnapshot{Limits: w.Limits(), InFlightMsgs: m, InFlightBytes: b, WindowStats: w.Stats()}
}

// snapshot reads a peer registered with its endpoint (so its lanes,
// credits and returner are set).
func (p *Peer) snapshot() PeerSnapshot {
	ps := PeerSnapshot{ID: p.id, Dialer: p.dialer}
	if p.ctl != nil {
		ps.Addr = addrString(p.ctl.RemoteAddr())
	}
	switch p.state.Load() {
	case stateActive:
		ps.State = "active"
	case stateRecovering:
		ps.State = "recovering"
	default:
		ps.State = "dead"
	}
	if p.credits != nil {
		ps.CreditsAvailable = p.credits.Available()
		ps.Credits = p.credits.Stats()
	}
	if p.ret != nil {
		ps.Recoveries = uint64(p.ret.Epoch())
	}
	for _, l := range p.lanes {
		if l == nil || l.win == nil {
			continue
		}
		w := windowOf(l.win)
		ps.Window.Limits.Msgs += w.Limits.Msgs
		ps.Window.Limits.Bytes += w.Limits.Bytes
		ps.Window.InFlightMsgs += w.InFlightMsgs
		ps.Window.InFlightBytes += w.InFlightBytes
		ps.Window.Acquired += w.Acquired
		ps.Window.Stalls += w.Stalls
		ps.Window.Cancelled += w.Cancelled
		ps.Window.WaitTime += w.WaitTime
		ps.Window.Waiting += w.Waiting
		ps.Window.Oversize += w.Oversize
	}
	return ps
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}
