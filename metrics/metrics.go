// Package metrics exposes ByteExpress (package bx) and parameter-server
// (package ps) metrics to Prometheus, and serves them on an optional HTTP
// endpoint.
//
// It uses github.com/prometheus/client_golang, the Prometheus project's
// own Go client, for what every Prometheus user expects and nothing here
// should reinvent: the standard text exposition format (and content
// negotiation for the protobuf one), a registry that checks names, labels
// and duplicates, the promhttp handler, and the Go runtime and process
// collectors next to ours. goverbs' data path does not depend on it: only
// this package and the commands import it.
//
// Collector is a custom prometheus.Collector: at scrape time it takes a
// bx.Endpoint.Snapshot (and ps Server or Client Metrics) of every source
// added to it and turns the plain values into constant metrics. Nothing is
// counted twice and nothing is updated on the data path for Prometheus'
// sake.
//
// Names (all prefixed goverbs_) and labels:
//
//	bx endpoint, {device}:
//	  goverbs_bx_messages_sent_total, goverbs_bx_messages_received_total,
//	  goverbs_bx_duplicates_total, goverbs_bx_rendezvous_total,
//	  goverbs_bx_credit_updates_total, goverbs_bx_recoveries_total,
//	  goverbs_bx_stalls_total, goverbs_bx_unrouted_completions_total,
//	  goverbs_bx_handshakes_failed_total, goverbs_bx_peers,
//	  goverbs_bx_window_in_flight_messages, goverbs_bx_window_in_flight_bytes,
//	  goverbs_bx_window_limit_messages, goverbs_bx_window_limit_bytes
//	bx peer, {device, peer}:
//	  goverbs_bx_peer_info{addr, role} (1), goverbs_bx_peer_recovering,
//	  goverbs_bx_peer_credits_available, goverbs_bx_peer_credit_stalls_total,
//	  goverbs_bx_peer_credit_wait_seconds_total, goverbs_bx_peer_credit_waiting,
//	  goverbs_bx_peer_window_stalls_total, goverbs_bx_peer_window_wait_seconds_total,
//	  goverbs_bx_peer_window_waiting, goverbs_bx_peer_messages_sent_total,
//	  goverbs_bx_peer_in_flight_messages, goverbs_bx_peer_in_flight_bytes,
//	  goverbs_bx_peer_recoveries_total
//	bx RPC, {device, stream_class}:
//	  goverbs_bx_rpc_latency_seconds (histogram), goverbs_bx_rpc_remote_errors_total,
//	  goverbs_bx_rpc_failures_total
//	bx buffer pools, {device, pool} (pool: eager, large, rndv):
//	  goverbs_bx_allocator_in_use_bytes, goverbs_bx_allocator_in_use_buffers,
//	  goverbs_bx_allocator_registered_bytes, goverbs_bx_allocator_limit_bytes,
//	  goverbs_bx_allocator_regions, goverbs_bx_allocator_allocs_total,
//	  goverbs_bx_allocator_failures_total
//	ps server, {transport, op}:
//	  goverbs_ps_server_requests_total, goverbs_ps_server_errors_total,
//	  goverbs_ps_server_latency_seconds (histogram)
//	ps client, {transport, op}:
//	  goverbs_ps_client_calls_total, goverbs_ps_client_errors_total,
//	  goverbs_ps_client_latency_seconds (histogram)
//
// peer is the remote endpoint's incarnation in hex (bx.Peer.ID; a
// restarted peer is a new series); stream_class is bx's (the stream number
// unless bx.Endpoint.SetStreamClass says otherwise); op is a ps operation
// (pull, push, pull-dense, push-dense, define, stats, malformed). Series of
// several sources with the same labels (two endpoints on one device in one
// process) are summed; Collector.Remove leaves a removed source's counters
// in the sums it shared, so that no counter goes down. Histogram buckets
// are bx's log2 buckets, 1.024 µs to 34.4 s.
package metrics

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/ps"
)

// BXSource is what Collector reads a bx endpoint through: *bx.Endpoint.
type BXSource interface{ Snapshot() bx.Snapshot }

// PSServerSource is a parameter server: *ps.Server.
type PSServerSource interface{ Metrics() ps.ServerMetrics }

// PSClientSource is a parameter-server client: *ps.Client.
type PSClientSource interface{ Metrics() ps.ClientMetrics }

// Collector is a prometheus.Collector of bx endpoints and ps servers and
// clients. It is safe for concurrent use; sources may be added and removed
// while it is registered. The zero Collector is ready to use, without
// sources, as NewCollector's is; a nil one collects nothing and its Add
// methods return an error that is goverbs.ErrNil.
type Collector struct {
	// scrape is held shared by Collect and exclusively by Remove, so
	// that a source's last reading (retired) and its live ones are never
	// in one scrape.
	scrape sync.RWMutex
	mu     sync.Mutex
	bx     []BXSource
	srvs   []PSServerSource
	clis   []PSClientSource
	// retired holds the counters and histograms of removed sources, per
	// series, while a source left still has that series (see Remove).
	retired map[accKey]*accVal
}

// NewCollector returns a Collector without sources.
func NewCollector() *Collector { return &Collector{} }

func isNil(v any) bool {
	if v == nil {
		return true
	}
	r := reflect.ValueOf(v)
	switch r.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return r.IsNil()
	}
	return false
}

// AddBX adds a bx endpoint. A source added already (==) is refused.
func (c *Collector) AddBX(s BXSource) error {
	if c == nil {
		return errNilCollector
	}
	if isNil(s) {
		return errNilBX
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if slices.ContainsFunc(c.bx, sameAs(s)) {
		return fmt.Errorf("metrics: Collector.AddBX: the same %T is there already (its series would count twice)", s)
	}
	c.bx = append(c.bx, s)
	return nil
}

// AddPSServer adds a parameter server. A source added already (==) is
// refused.
func (c *Collector) AddPSServer(s PSServerSource) error {
	if c == nil {
		return errNilCollector
	}
	if isNil(s) {
		return errNilPSServer
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if slices.ContainsFunc(c.srvs, sameAs(s)) {
		return fmt.Errorf("metrics: Collector.AddPSServer: the same %T is there already (its series would count twice)", s)
	}
	c.srvs = append(c.srvs, s)
	return nil
}

// AddPSClient adds a parameter-server client. A source added already
// (==) is refused.
func (c *Collector) AddPSClient(s PSClientSource) error {
	if c == nil {
		return errNilCollector
	}
	if isNil(s) {
		return errNilPSClient
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if slices.ContainsFunc(c.clis, sameAs(s)) {
		return fmt.Errorf("metrics: Collector.AddPSClient: the same %T is there already (its series would count twice)", s)
	}
	c.clis = append(c.clis, s)
	return nil
}

// Remove removes a source added before (any kind); it reports whether it
// was there. Its series go, except that its counters and histograms, as
// Remove read them last, stay added to the series it shared with sources
// still there (two endpoints on one device): a counter that went down
// would read as a reset to Prometheus, which would count the other
// sources' totals again. So a source removed and added again counts
// what it had counted at its removal twice in those shared series (its
// own counters start where they were): add a new source instead. Sources
// are found with ==, so one whose value is not
// comparable (a func adapter, a struct holding a slice or map) can be
// added and collected but never removed: Remove reports false for it.
// Add a pointer to such a value to be able to remove it.
func (c *Collector) Remove(s any) bool {
	if c == nil || isNil(s) || !reflect.ValueOf(s).Comparable() {
		return false // == would panic on an uncomparable s
	}
	c.scrape.Lock() // no Collect in progress has read s
	defer c.scrape.Unlock()
	c.mu.Lock()
	var inBX, inSrv, inCli bool
	c.bx = removeEq(c.bx, s, &inBX)
	c.srvs = removeEq(c.srvs, s, &inSrv)
	c.clis = removeEq(c.clis, s, &inCli)
	c.mu.Unlock()
	if !inBX && !inSrv && !inCli {
		return false
	}
	// Its last reading, as what it was added as, outside c.mu (a source
	// may be slow).
	a := newAcc()
	if inBX {
		a.bx(s.(BXSource).Snapshot())
	}
	if inSrv {
		a.psServer(s.(PSServerSource).Metrics())
	}
	if inCli {
		a.psClient(s.(PSClientSource).Metrics())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range a.order {
		if !k.m.hist && k.m.typ != counter {
			continue // a gauge is what is there now
		}
		if c.retired == nil {
			c.retired = map[accKey]*accVal{}
		}
		v, r := a.vals[k], c.retired[k]
		if r == nil {
			c.retired[k] = v
			continue
		}
		r.v += v.v
		r.h.Add(v.h)
	}
	return true
}

// sameAs returns whether a source is s: == when s is comparable (a
// source that is not cannot be told from another, see Remove).
func sameAs[T any](s T) func(T) bool {
	if !reflect.ValueOf(s).Comparable() {
		return func(T) bool { return false }
	}
	return func(x T) bool { return any(x) == any(s) }
}

// removeEq removes s from l. s is comparable (reflect.Value.Comparable),
// so any(x) == s does not panic whatever x is.
func removeEq[T any](l []T, s any, found *bool) []T {
	out := l[:0]
	for _, x := range l {
		if any(x) == s {
			*found = true
			continue
		}
		out = append(out, x)
	}
	return out
}

// metric is one metric family's description.
type metric struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType // unused for histograms
	hist bool
}

func newMetric(name, help string, typ prometheus.ValueType, labels ...string) *metric {
	return &metric{desc: prometheus.NewDesc(name, help, labels, nil), typ: typ}
}

func newHist(name, help string, labels ...string) *metric {
	return &metric{desc: prometheus.NewDesc(name, help, labels, nil), hist: true}
}

const (
	counter = prometheus.CounterValue
	gauge   = prometheus.GaugeValue
)

var (
	dev     = []string{"device"}
	devPeer = []string{"device", "peer"}
	devCls  = []string{"device", "stream_class"}
	devPool = []string{"device", "pool"}
	trOp    = []string{"transport", "op"}

	bxSent      = newMetric("goverbs_bx_messages_sent_total", "Messages sent by the bx endpoint (stream messages, RPC requests and responses).", counter, dev...)
	bxRecv      = newMetric("goverbs_bx_messages_received_total", "Messages received by the bx endpoint, duplicates included.", counter, dev...)
	bxDups      = newMetric("goverbs_bx_duplicates_total", "Resent messages the receiver already had (dropped).", counter, dev...)
	bxRndv      = newMetric("goverbs_bx_rendezvous_total", "Messages received by rendezvous (the sender RDMA-WRITEs into a buffer the receiver names).", counter, dev...)
	bxCredUpd   = newMetric("goverbs_bx_credit_updates_total", "Explicit credit and acknowledgement updates sent.", counter, dev...)
	bxRecov     = newMetric("goverbs_bx_recoveries_total", "Connection recoveries started (a peer's QPs failed and were rebuilt).", counter, dev...)
	bxStalls    = newMetric("goverbs_bx_stalls_total", "Lane QPs found stalled with no error (a probe not complete within Config.StallTimeout); each starts a recovery.", counter, dev...)
	bxUnrouted  = newMetric("goverbs_bx_unrouted_completions_total", "Completions of QPs no peer owns (already destroyed).", counter, dev...)
	bxHSFail    = newMetric("goverbs_bx_handshakes_failed_total", "Control connections accepted that did not become a peer: a wrong token, another wire version or EagerSize, TLS, a timeout (Snapshot.LastHandshakeFailure says the last one's address and error).", counter, dev...)
	bxPeers     = newMetric("goverbs_bx_peers", "Connected peers.", gauge, dev...)
	bxWinMsgs   = newMetric("goverbs_bx_window_in_flight_messages", "Messages posted and not yet acknowledged, endpoint-wide.", gauge, dev...)
	bxWinBytes  = newMetric("goverbs_bx_window_in_flight_bytes", "Bytes posted and not yet acknowledged, endpoint-wide.", gauge, dev...)
	bxWinLimM   = newMetric("goverbs_bx_window_limit_messages", "The endpoint send window's message limit (Config.EndpointMsgs).", gauge, dev...)
	bxWinLimB   = newMetric("goverbs_bx_window_limit_bytes", "The endpoint send window's byte limit (Config.EndpointBytes).", gauge, dev...)
	peerInfo    = newMetric("goverbs_bx_peer_info", "A connected peer: its control-plane address and whether we dialled it (role dialer) or accepted it.", gauge, "device", "peer", "addr", "role")
	peerRecov   = newMetric("goverbs_bx_peer_recovering", "1 while the peer's connection is being recovered.", gauge, devPeer...)
	peerCredAv  = newMetric("goverbs_bx_peer_credits_available", "Receive credits the peer granted that data messages may use now.", gauge, devPeer...)
	peerCredSt  = newMetric("goverbs_bx_peer_credit_stalls_total", "Sends that had to wait for a receive credit.", counter, devPeer...)
	peerCredWt  = newMetric("goverbs_bx_peer_credit_wait_seconds_total", "Time sends spent waiting for receive credits (waits that ended).", counter, devPeer...)
	peerCredWg  = newMetric("goverbs_bx_peer_credit_waiting", "Sends waiting for a receive credit now.", gauge, devPeer...)
	peerWinSt   = newMetric("goverbs_bx_peer_window_stalls_total", "Sends that had to wait for room in the send window (a lane's or the endpoint's).", counter, devPeer...)
	peerWinWt   = newMetric("goverbs_bx_peer_window_wait_seconds_total", "Time sends spent waiting for send-window room (waits that ended).", counter, devPeer...)
	peerWinWg   = newMetric("goverbs_bx_peer_window_waiting", "Sends waiting for send-window room now.", gauge, devPeer...)
	peerSent    = newMetric("goverbs_bx_peer_messages_sent_total", "Messages admitted to the peer's send window.", counter, devPeer...)
	peerFlMsgs  = newMetric("goverbs_bx_peer_in_flight_messages", "Messages to the peer posted and not yet acknowledged.", gauge, devPeer...)
	peerFlBytes = newMetric("goverbs_bx_peer_in_flight_bytes", "Bytes to the peer posted and not yet acknowledged.", gauge, devPeer...)
	peerRecovs  = newMetric("goverbs_bx_peer_recoveries_total", "The peer's connection recoveries (credit epochs).", counter, devPeer...)
	rpcLat      = newHist("goverbs_bx_rpc_latency_seconds", "bx RPC latency (Peer.Call to the response), per stream class; calls that got a response.", devCls...)
	rpcRemote   = newMetric("goverbs_bx_rpc_remote_errors_total", "bx RPC responses that were a handler's error.", counter, devCls...)
	rpcFail     = newMetric("goverbs_bx_rpc_failures_total", "bx RPC calls without a response (context done, peer gone, closed).", counter, devCls...)
	poolInUseB  = newMetric("goverbs_bx_allocator_in_use_bytes", "Bytes of the pool's buffers in use (class sizes).", gauge, devPool...)
	poolInUse   = newMetric("goverbs_bx_allocator_in_use_buffers", "The pool's buffers in use.", gauge, devPool...)
	poolReg     = newMetric("goverbs_bx_allocator_registered_bytes", "Bytes of the pool's registered memory regions.", gauge, devPool...)
	poolLimit   = newMetric("goverbs_bx_allocator_limit_bytes", "The most memory the pool may register (Config.MemoryLimit).", gauge, devPool...)
	poolRegions = newMetric("goverbs_bx_allocator_regions", "The pool's registered memory regions (MRs).", gauge, devPool...)
	poolAllocs  = newMetric("goverbs_bx_allocator_allocs_total", "Buffers allocated from the pool.", counter, devPool...)
	poolFails   = newMetric("goverbs_bx_allocator_failures_total", "Allocations that failed (memory limit or registration).", counter, devPool...)
	srvReqs     = newMetric("goverbs_ps_server_requests_total", "Requests the parameter server handled.", counter, trOp...)
	srvErrs     = newMetric("goverbs_ps_server_errors_total", "Requests the parameter server answered with an error.", counter, trOp...)
	srvLat      = newHist("goverbs_ps_server_latency_seconds", "Time the parameter server took to handle a request.", trOp...)
	cliCalls    = newMetric("goverbs_ps_client_calls_total", "Parameter-server client calls (a Pull over several servers is one).", counter, trOp...)
	cliErrs     = newMetric("goverbs_ps_client_errors_total", "Parameter-server client calls that failed.", counter, trOp...)
	cliLat      = newHist("goverbs_ps_client_latency_seconds", "Parameter-server client call latency.", trOp...)

	all = []*metric{bxSent, bxRecv, bxDups, bxRndv, bxCredUpd, bxRecov, bxStalls, bxUnrouted, bxHSFail, bxPeers, bxWinMsgs, bxWinBytes, bxWinLimM, bxWinLimB,
		peerInfo, peerRecov, peerCredAv, peerCredSt, peerCredWt, peerCredWg, peerWinSt, peerWinWt, peerWinWg, peerSent, peerFlMsgs, peerFlBytes, peerRecovs,
		rpcLat, rpcRemote, rpcFail, poolInUseB, poolInUse, poolReg, poolLimit, poolRegions, poolAllocs, poolFails,
		srvReqs, srvErrs, srvLat, cliCalls, cliErrs, cliLat}
)

// Describe sends every metric's description; to a nil channel, nothing.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	if c == nil || ch == nil {
		return
	}
	for _, m := range all {
		ch <- m.desc
	}
}

// Collect takes a snapshot of every source and sends its metrics; to a
// nil channel, nothing.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if c == nil || ch == nil {
		return
	}
	c.scrape.RLock()
	defer c.scrape.RUnlock()
	c.mu.Lock()
	bxs := append([]BXSource(nil), c.bx...)
	srvs := append([]PSServerSource(nil), c.srvs...)
	clis := append([]PSClientSource(nil), c.clis...)
	c.mu.Unlock()
	a := newAcc()
	for _, s := range bxs {
		a.bx(s.Snapshot())
	}
	for _, s := range srvs {
		a.psServer(s.Metrics())
	}
	for _, s := range clis {
		a.psClient(s.Metrics())
	}
	c.mu.Lock()
	for k, r := range c.retired {
		v := a.vals[k]
		if v == nil {
			// No source left has the series: it goes, and a source
			// that has it later starts it anew.
			delete(c.retired, k)
			continue
		}
		v.v += r.v
		v.h.Add(r.h)
	}
	c.mu.Unlock()
	a.emit(ch)
}

func (a *acc) psServer(m ps.ServerMetrics) {
	for _, o := range m.Ops {
		l := []string{m.Transport, o.Op}
		a.add(srvReqs, float64(o.Requests), l...)
		a.add(srvErrs, float64(o.Errors), l...)
		a.addHist(srvLat, o.Latency, l...)
	}
}

func (a *acc) psClient(m ps.ClientMetrics) {
	for _, o := range m.Ops {
		l := []string{m.Transport, o.Op}
		a.add(cliCalls, float64(o.Requests), l...)
		a.add(cliErrs, float64(o.Errors), l...)
		a.addHist(cliLat, o.Latency, l...)
	}
}

func (a *acc) bx(s bx.Snapshot) {
	d := s.Device
	ct := s.Counters
	for _, x := range []struct {
		m *metric
		v float64
	}{{bxSent, float64(ct.Sent)}, {bxRecv, float64(ct.Received)}, {bxDups, float64(ct.Duplicates)},
		{bxRndv, float64(ct.Rendezvous)}, {bxCredUpd, float64(ct.CreditUpdates)}, {bxRecov, float64(ct.Recoveries)},
		{bxStalls, float64(ct.Stalls)},
		{bxUnrouted, float64(ct.Unrouted)}, {bxHSFail, float64(ct.HandshakesFailed)}, {bxPeers, float64(len(s.Peers))},
		{bxWinMsgs, float64(s.Window.InFlightMsgs)}, {bxWinBytes, float64(s.Window.InFlightBytes)},
		{bxWinLimM, float64(s.Window.Limits.Msgs)}, {bxWinLimB, float64(s.Window.Limits.Bytes)}} {
		a.add(x.m, x.v, d)
	}
	for _, p := range s.Peers {
		id := fmt.Sprintf("%016x", p.ID)
		role := "acceptor"
		if p.Dialer {
			role = "dialer"
		}
		a.add(peerInfo, 1, d, id, p.Addr, role)
		recovering := 0.0
		if p.State == "recovering" {
			recovering = 1
		}
		for _, x := range []struct {
			m *metric
			v float64
		}{{peerRecov, recovering}, {peerCredAv, float64(p.CreditsAvailable)},
			{peerCredSt, float64(p.Credits.Stalls)}, {peerCredWt, p.Credits.WaitTime.Seconds()}, {peerCredWg, float64(p.Credits.Waiting)},
			{peerWinSt, float64(p.Window.Stalls)}, {peerWinWt, p.Window.WaitTime.Seconds()}, {peerWinWg, float64(p.Window.Waiting)},
			{peerSent, float64(p.Window.Acquired)}, {peerFlMsgs, float64(p.Window.InFlightMsgs)}, {peerFlBytes, float64(p.Window.InFlightBytes)},
			{peerRecovs, float64(p.Recoveries)}} {
			a.add(x.m, x.v, d, id)
		}
	}
	for _, c := range s.Classes {
		a.addHist(rpcLat, c.Latency, d, c.Class)
		a.add(rpcRemote, float64(c.RemoteErrors), d, c.Class)
		a.add(rpcFail, float64(c.Failures), d, c.Class)
	}
	for _, p := range s.Pools {
		for _, x := range []struct {
			m *metric
			v float64
		}{{poolInUseB, float64(p.InUseBytes)}, {poolInUse, float64(p.InUse)}, {poolReg, float64(p.Registered)},
			{poolLimit, float64(p.Limit)}, {poolRegions, float64(p.Regions)}, {poolAllocs, float64(p.Allocs)},
			{poolFails, float64(p.Failures)}} {
			a.add(x.m, x.v, d, p.Pool)
		}
	}
}

// acc sums the series of one scrape by metric and label values.
type acc struct {
	order []accKey
	vals  map[accKey]*accVal
}

type accKey struct {
	m      *metric
	labels string
}

type accVal struct {
	labels []string
	v      float64
	h      bx.Histogram
}

func newAcc() *acc { return &acc{vals: map[accKey]*accVal{}} }

// get returns the series of m with the label values labels, made valid
// UTF-8 (an invalid byte is "?", as bx makes stream classes): a value that
// is not would make the series an invalid metric, left out of the scrape.
func (a *acc) get(m *metric, labels []string) *accVal {
	cloned := false
	for i, l := range labels {
		if !utf8.ValidString(l) {
			if !cloned { // the caller's slice is not written
				labels, cloned = slices.Clone(labels), true
			}
			labels[i] = strings.ToValidUTF8(l, "?")
		}
	}
	k := accKey{m, strings.Join(labels, "\xff")}
	v := a.vals[k]
	if v == nil {
		v = &accVal{labels: labels}
		a.vals[k] = v
		a.order = append(a.order, k)
	}
	return v
}

func (a *acc) add(m *metric, v float64, labels ...string) { a.get(m, labels).v += v }

func (a *acc) addHist(m *metric, h bx.Histogram, labels ...string) { a.get(m, labels).h.Add(h) }

func (a *acc) emit(ch chan<- prometheus.Metric) {
	for _, k := range a.order {
		v := a.vals[k]
		var pm prometheus.Metric
		var err error
		if k.m.hist {
			pm, err = constHistogram(k.m.desc, v.h, v.labels)
		} else {
			pm, err = prometheus.NewConstMetric(k.m.desc, k.m.typ, v.v, v.labels...)
		}
		if err != nil {
			pm = prometheus.NewInvalidMetric(k.m.desc, err)
		}
		ch <- pm
	}
}

// constHistogram converts a bx histogram (per-bucket counts, the last one
// unbounded) into a Prometheus one (cumulative counts per finite upper
// bound, in seconds; +Inf is the count).
//
// The count is at least the buckets' sum, so that +Inf is never below a
// finite bucket (bx.Histogram's Count is their sum; a source of its own
// may not keep it so).
func constHistogram(d *prometheus.Desc, h bx.Histogram, labels []string) (prometheus.Metric, error) {
	b := make(map[float64]uint64, bx.HistogramBuckets-1)
	var cum uint64
	for i := range bx.HistogramBuckets - 1 {
		cum += h.Buckets[i]
		b[bx.HistogramBound(i).Seconds()] = cum
	}
	return prometheus.NewConstHistogram(d, max(h.Count, cum+h.Buckets[bx.HistogramBuckets-1]), h.Sum.Seconds(), b, labels...)
}
