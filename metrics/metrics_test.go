package metrics

import (
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/flow"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/ps"
)

// fakeBX is a bx source with a fixed snapshot.
type fakeBX struct{ s bx.Snapshot }

func (f *fakeBX) Snapshot() bx.Snapshot { return f.s }

type fakeServer struct{ m ps.ServerMetrics }

func (f *fakeServer) Metrics() ps.ServerMetrics { return f.m }

type fakeClient struct{ m ps.ClientMetrics }

func (f *fakeClient) Metrics() ps.ClientMetrics { return f.m }

func hist(obs ...time.Duration) bx.Histogram {
	var h bx.Histogram
	for _, d := range obs {
		i := 0
		for i < bx.HistogramBuckets-1 && d > bx.HistogramBound(i) {
			i++
		}
		h.Buckets[i]++
		h.Count++
		h.Sum += d
	}
	return h
}

func snapshot(dev string, peer uint64, sent uint64) bx.Snapshot {
	return bx.Snapshot{
		Device:   dev,
		Counters: bx.Counters{Sent: sent, Received: sent + 1, Duplicates: 2, Rendezvous: 3, CreditUpdates: 4, Recoveries: 5, Unrouted: 6},
		Window:   bx.WindowSnapshot{Limits: flow.Limits{Msgs: 1024, Bytes: 64 << 20}, InFlightMsgs: 7, InFlightBytes: 7000},
		Peers: []bx.PeerSnapshot{{ID: peer, Addr: "10.99.0.2:4000", Dialer: true, State: "recovering",
			CreditsAvailable: 60, Credits: flow.CreditStats{Stalls: 8, WaitTime: 1500 * time.Millisecond, Waiting: 1},
			Window:     bx.WindowSnapshot{InFlightMsgs: 3, InFlightBytes: 300, WindowStats: flow.WindowStats{Acquired: 90, Stalls: 9, WaitTime: 250 * time.Millisecond, Waiting: 2}},
			Recoveries: 1}},
		Classes: []bx.ClassSnapshot{{Class: "pull", Latency: hist(500*time.Nanosecond, 3*time.Microsecond, 3*time.Microsecond, time.Minute), RemoteErrors: 1, Failures: 2}},
		Pools:   []bx.PoolSnapshot{{Pool: "eager", AllocatorStats: mr.AllocatorStats{Limit: 1 << 30, Registered: 4 << 20, Regions: 2, InUseBytes: 1 << 20, InUse: 128, Allocs: 1000, Failures: 1}}},
	}
}

// gather returns every sample as "name{l="v",...}" -> value; histograms as
// _count, _sum and _bucket{...,le="..."} samples, as the text format has
// them.
func gather(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.Metric {
			var ls []string
			for _, l := range m.Label {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			key := func(suffix string, extra ...string) string {
				return f.GetName() + suffix + "{" + strings.Join(append(append([]string(nil), ls...), extra...), ",") + "}"
			}
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				h := m.Histogram
				out[key("_count")] = float64(h.GetSampleCount())
				out[key("_sum")] = h.GetSampleSum()
				for _, b := range h.Bucket {
					out[key("_bucket", fmt.Sprintf("le=%q", fmt.Sprint(b.GetUpperBound())))] = float64(b.GetCumulativeCount())
				}
			case dto.MetricType_COUNTER:
				out[key("")] = m.Counter.GetValue()
			default:
				out[key("")] = m.Gauge.GetValue()
			}
		}
	}
	return out
}

func TestCollector(t *testing.T) {
	c := NewCollector()
	must(t, c.AddBX(&fakeBX{snapshot("rxe0", 0xabc, 10)}))
	must(t, c.AddPSServer(&fakeServer{ps.ServerMetrics{Transport: "rdma", Requests: 12, Errors: 1, Ops: []ps.OpMetrics{
		{Op: "pull", Requests: 12, Errors: 1, Latency: hist(2*time.Microsecond, 5*time.Microsecond)}}}}))
	must(t, c.AddPSClient(&fakeClient{ps.ClientMetrics{Transport: "tcp", Ops: []ps.OpMetrics{
		{Op: "push", Requests: 4, Errors: 0, Latency: hist(time.Millisecond)}}}}))
	// The pedantic registry checks every metric against its description.
	reg := prometheus.NewPedanticRegistry()
	must(t, reg.Register(c))
	got := gather(t, reg)
	const d, p = `device="rxe0"`, `device="rxe0",peer="0000000000000abc"`
	want := map[string]float64{
		"goverbs_bx_messages_sent_total{" + d + "}":                           10,
		"goverbs_bx_messages_received_total{" + d + "}":                       11,
		"goverbs_bx_duplicates_total{" + d + "}":                              2,
		"goverbs_bx_rendezvous_total{" + d + "}":                              3,
		"goverbs_bx_credit_updates_total{" + d + "}":                          4,
		"goverbs_bx_recoveries_total{" + d + "}":                              5,
		"goverbs_bx_unrouted_completions_total{" + d + "}":                    6,
		"goverbs_bx_peers{" + d + "}":                                         1,
		"goverbs_bx_window_in_flight_messages{" + d + "}":                     7,
		"goverbs_bx_window_in_flight_bytes{" + d + "}":                        7000,
		"goverbs_bx_window_limit_messages{" + d + "}":                         1024,
		"goverbs_bx_window_limit_bytes{" + d + "}":                            64 << 20,
		`goverbs_bx_peer_info{addr="10.99.0.2:4000",` + p + `,role="dialer"}`: 1,
		"goverbs_bx_peer_recovering{" + p + "}":                               1,
		"goverbs_bx_peer_credits_available{" + p + "}":                        60,
		"goverbs_bx_peer_credit_stalls_total{" + p + "}":                      8,
		"goverbs_bx_peer_credit_wait_seconds_total{" + p + "}":                1.5,
		"goverbs_bx_peer_credit_waiting{" + p + "}":                           1,
		"goverbs_bx_peer_window_stalls_total{" + p + "}":                      9,
		"goverbs_bx_peer_window_wait_seconds_total{" + p + "}":                0.25,
		"goverbs_bx_peer_window_waiting{" + p + "}":                           2,
		"goverbs_bx_peer_messages_sent_total{" + p + "}":                      90,
		"goverbs_bx_peer_in_flight_messages{" + p + "}":                       3,
		"goverbs_bx_peer_in_flight_bytes{" + p + "}":                          300,
		"goverbs_bx_peer_recoveries_total{" + p + "}":                         1,
		`goverbs_bx_rpc_latency_seconds_count{` + d + `,stream_class="pull"}`: 4,
		`goverbs_bx_rpc_latency_seconds_sum{` + d + `,stream_class="pull"}`:   60.0000065,
		// Cumulative: 500ns in the first bucket (<= 1.024us), 3us in the
		// third (<= 4.096us), a minute only in +Inf.
		`goverbs_bx_rpc_latency_seconds_bucket{` + d + `,stream_class="pull",le="1.024e-06"}`:    1,
		`goverbs_bx_rpc_latency_seconds_bucket{` + d + `,stream_class="pull",le="2.048e-06"}`:    1,
		`goverbs_bx_rpc_latency_seconds_bucket{` + d + `,stream_class="pull",le="4.096e-06"}`:    3,
		`goverbs_bx_rpc_latency_seconds_bucket{` + d + `,stream_class="pull",le="34.359738368"}`: 3,
		`goverbs_bx_rpc_remote_errors_total{` + d + `,stream_class="pull"}`:                      1,
		`goverbs_bx_rpc_failures_total{` + d + `,stream_class="pull"}`:                           2,
		`goverbs_bx_allocator_in_use_bytes{` + d + `,pool="eager"}`:                              1 << 20,
		`goverbs_bx_allocator_in_use_buffers{` + d + `,pool="eager"}`:                            128,
		`goverbs_bx_allocator_registered_bytes{` + d + `,pool="eager"}`:                          4 << 20,
		`goverbs_bx_allocator_limit_bytes{` + d + `,pool="eager"}`:                               1 << 30,
		`goverbs_bx_allocator_regions{` + d + `,pool="eager"}`:                                   2,
		`goverbs_bx_allocator_allocs_total{` + d + `,pool="eager"}`:                              1000,
		`goverbs_bx_allocator_failures_total{` + d + `,pool="eager"}`:                            1,
		`goverbs_ps_server_requests_total{op="pull",transport="rdma"}`:                           12,
		`goverbs_ps_server_errors_total{op="pull",transport="rdma"}`:                             1,
		`goverbs_ps_server_latency_seconds_count{op="pull",transport="rdma"}`:                    2,
		`goverbs_ps_server_latency_seconds_bucket{op="pull",transport="rdma",le="4.096e-06"}`:    1,
		`goverbs_ps_server_latency_seconds_bucket{op="pull",transport="rdma",le="8.192e-06"}`:    2,
		`goverbs_ps_client_calls_total{op="push",transport="tcp"}`:                               4,
		`goverbs_ps_client_errors_total{op="push",transport="tcp"}`:                              0,
		`goverbs_ps_client_latency_seconds_count{op="push",transport="tcp"}`:                     1,
		`goverbs_ps_client_latency_seconds_sum{op="push",transport="tcp"}`:                       0.001,
	}
	for k, v := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("missing %s", k)
			continue
		}
		if math.Abs(g-v) > 1e-9*math.Max(1, math.Abs(v)) {
			t.Errorf("%s = %v, want %v", k, g, v)
		}
	}
	// Every histogram has bx's 26 finite buckets.
	n := 0
	for k := range got {
		if strings.HasPrefix(k, "goverbs_bx_rpc_latency_seconds_bucket{") {
			n++
		}
	}
	if n != bx.HistogramBuckets-1 {
		t.Errorf("%d buckets, want %d", n, bx.HistogramBuckets-1)
	}
	// Every family is described, named by the conventions (promlint).
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestCollectorSums: series of two sources with the same labels are summed;
// different devices and peers stay apart. Removing a source removes the
// series only it had; its counters stay in the sums it shared (see
// TestRemoveKeepsCounters).
func TestCollectorSums(t *testing.T) {
	c := NewCollector()
	a, b, o := &fakeBX{snapshot("rxe0", 1, 10)}, &fakeBX{snapshot("rxe0", 2, 20)}, &fakeBX{snapshot("rxe1", 1, 5)}
	for _, s := range []*fakeBX{a, b, o} {
		must(t, c.AddBX(s))
	}
	reg := prometheus.NewRegistry()
	must(t, reg.Register(c))
	got := gather(t, reg)
	for k, v := range map[string]float64{
		`goverbs_bx_messages_sent_total{device="rxe0"}`:                                           30,
		`goverbs_bx_messages_sent_total{device="rxe1"}`:                                           5,
		`goverbs_bx_peers{device="rxe0"}`:                                                         2,
		`goverbs_bx_peer_credit_stalls_total{device="rxe0",peer="0000000000000001"}`:              8,
		`goverbs_bx_peer_credit_stalls_total{device="rxe0",peer="0000000000000002"}`:              8,
		`goverbs_bx_rpc_latency_seconds_count{device="rxe0",stream_class="pull"}`:                 8,
		`goverbs_bx_rpc_latency_seconds_bucket{device="rxe0",stream_class="pull",le="4.096e-06"}`: 6,
		`goverbs_bx_allocator_in_use_bytes{device="rxe0",pool="eager"}`:                           2 << 20,
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if !c.Remove(b) || c.Remove(b) {
		t.Fatal("Remove: want true, then false")
	}
	got = gather(t, reg)
	for k, v := range map[string]float64{
		`goverbs_bx_messages_sent_total{device="rxe0"}`:                              30, // a's 10 and b's last 20
		`goverbs_bx_peers{device="rxe0"}`:                                            1,  // a gauge: a's peer
		`goverbs_bx_peer_credit_stalls_total{device="rxe0",peer="0000000000000002"}`: 0,  // b's peer only: gone
	} {
		if got[k] != v {
			t.Errorf("after Remove: %s = %v, want %v", k, got[k], v)
		}
	}
}

func TestBadInput(t *testing.T) {
	c := NewCollector()
	var nilEP *bx.Endpoint
	var nilSrv *ps.Server
	var nilCli *ps.Client
	for name, err := range map[string]error{
		"AddBX(nil)":              c.AddBX(nil),
		"AddBX(nil *Endpoint)":    c.AddBX(nilEP),
		"AddPSServer(nil Server)": c.AddPSServer(nilSrv),
		"AddPSClient(nil Client)": c.AddPSClient(nilCli),
		"nil Collector":           (*Collector)(nil).AddBX(&fakeBX{}),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := Serve("", prometheus.NewRegistry()); err == nil {
		t.Error("Serve(\"\"): no error")
	}
	if _, err := Serve("127.0.0.1:0", nil); err == nil {
		t.Error("Serve(nil gatherer): no error")
	}
	if _, err := Serve("not an address", prometheus.NewRegistry()); err == nil {
		t.Error("Serve(bad address): no error")
	}
	if _, err := NewRegistry(nil); err == nil {
		t.Error("NewRegistry(nil): no error")
	}
	if _, err := NewRegistry(c, c); err == nil {
		t.Error("NewRegistry registers a collector twice")
	}
	for _, u := range []string{"", "127.0.0.1:1/metrics", "ftp://x/"} {
		if _, err := Scraped(u, nil); err == nil {
			t.Errorf("Scraped(%q): no error", u)
		}
	}
	if _, err := Scraped("http://127.0.0.1:1/metrics", map[string]string{"bad-name": "x"}); err == nil {
		t.Error("Scraped with a bad label name: no error")
	}
}

func serveTest(t *testing.T, c *Collector) (url string, stop func()) {
	t.Helper()
	reg, err := NewRegistry(c)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop, err = ServeListener(ln, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return "http://" + ln.Addr().String() + "/metrics", stop
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s: %s", url, resp.Status, b)
	}
	return string(b)
}

// TestServe: the endpoint serves the text format with our samples and the
// Go runtime's; stop ends it and may be called twice.
func TestServe(t *testing.T) {
	c := NewCollector()
	must(t, c.AddBX(&fakeBX{snapshot("rxe0", 1, 42)}))
	url, stop := serveTest(t, c)
	body := get(t, url)
	for _, want := range []string{
		"\ngoverbs_bx_messages_sent_total{device=\"rxe0\"} 42\n",
		"# TYPE goverbs_bx_rpc_latency_seconds histogram\n",
		"\ngoverbs_bx_rpc_latency_seconds_bucket{device=\"rxe0\",stream_class=\"pull\",le=\"+Inf\"} 4\n",
		"\ngo_goroutines ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %q in\n%.2000s", want, body)
		}
	}
	stop()
	stop()
	if _, err := http.Get(url); err == nil {
		t.Error("endpoint still serving after stop")
	}
}

// TestScraped: a parent serves a child's goverbs_ metrics with a label
// of its own, next to its own metrics.
func TestScraped(t *testing.T) {
	child := NewCollector()
	must(t, child.AddBX(&fakeBX{snapshot("rxe0", 1, 42)}))
	url, _ := serveTest(t, child)
	g, err := Scraped(url, map[string]string{"process": "worker1"})
	if err != nil {
		t.Fatal(err)
	}
	parent := NewCollector()
	must(t, parent.AddBX(&fakeBX{snapshot("rxe1", 1, 7)}))
	reg, err := NewRegistry(parent)
	if err != nil {
		t.Fatal(err)
	}
	got := gather(t, prometheus.Gatherers{reg, g})
	if v := got[`goverbs_bx_messages_sent_total{device="rxe0",process="worker1"}`]; v != 42 {
		t.Errorf("child's sent %v, want 42", v)
	}
	if v := got[`goverbs_bx_messages_sent_total{device="rxe1"}`]; v != 7 {
		t.Errorf("parent's sent %v, want 7", v)
	}
	if v := got[`goverbs_bx_rpc_latency_seconds_count{device="rxe0",process="worker1",stream_class="pull"}`]; v != 4 {
		t.Errorf("child's histogram count %v, want 4", v)
	}
	var keys []string
	for k := range got {
		if strings.Contains(k, `process="worker1"`) && !strings.HasPrefix(k, "goverbs_") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	if len(keys) > 0 {
		t.Errorf("child's non-goverbs metrics served: %v", keys)
	}
	// A child that is gone is an error, not a hang.
	bad, _ := Scraped("http://127.0.0.1:1/metrics", nil)
	if _, err := bad.Gather(); err == nil {
		t.Error("scrape of a closed port: no error")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// bxFunc, bxValue and bxIface are sources whose values are not comparable:
// a func, a struct holding slices (bx.Snapshot's), and a comparable struct
// type holding a func in an interface field.
type bxFunc func() bx.Snapshot

func (f bxFunc) Snapshot() bx.Snapshot { return f() }

type bxValue struct{ s bx.Snapshot }

func (v bxValue) Snapshot() bx.Snapshot { return v.s }

type bxIface struct{ f any }

func (v bxIface) Snapshot() bx.Snapshot { return v.f.(bxFunc)() }

// TestRemoveUncomparable: Remove of a source that is not comparable
// reports false instead of panicking (== on it would), the source stays
// collected, and comparable sources next to it are still removed.
func TestRemoveUncomparable(t *testing.T) {
	c := NewCollector()
	f := bxFunc(func() bx.Snapshot { return snapshot("rxe0", 1, 10) })
	p := &fakeBX{snapshot("rxe0", 2, 10)}
	srcs := []BXSource{f, bxValue{snapshot("rxe0", 3, 10)}, bxIface{f}, p}
	for _, s := range srcs {
		must(t, c.AddBX(s))
	}
	for _, s := range srcs[:3] {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("Remove(%T) panicked: %v", s, r)
				}
			}()
			if c.Remove(s) {
				t.Errorf("Remove(%T): true for an uncomparable source", s)
			}
		}()
	}
	if !c.Remove(p) || c.Remove(p) {
		t.Error("Remove of the pointer source: want true, then false")
	}
	reg := prometheus.NewRegistry()
	must(t, reg.Register(c))
	if got := gather(t, reg)[`goverbs_bx_messages_sent_total{device="rxe0"}`]; got != 40 {
		t.Errorf("sent %v, want 40 (the three uncomparable sources, and the pointer's counters before Remove)", got)
	}
}

// countingBX is a bx source whose sent counter can be moved under a
// lock (a scrape may read it while the test moves it).
type countingBX struct {
	mu   sync.Mutex
	dev  string
	peer uint64
	sent uint64
}

func (c *countingBX) Snapshot() bx.Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return snapshot(c.dev, c.peer, c.sent)
}

func (c *countingBX) add(n uint64) {
	c.mu.Lock()
	c.sent += n
	c.mu.Unlock()
}

// TestRemoveKeepsCounters: removing one of two sources summed into a
// series used to take its count out of the sum, and a counter that goes
// down is a reset to Prometheus, whose increase() then counted the other
// source's whole total again (10+20, then 10: +10 where nothing
// happened). The removed source's last counts stay in the sums it
// shared; a series no source has any more goes, and starts anew with the
// next source that has it.
func TestRemoveKeepsCounters(t *testing.T) {
	c := NewCollector()
	a, b := &countingBX{dev: "rxe0", peer: 1, sent: 10}, &countingBX{dev: "rxe0", peer: 2, sent: 20}
	must(t, c.AddBX(a))
	must(t, c.AddBX(b))
	reg := prometheus.NewPedanticRegistry()
	must(t, reg.Register(c))
	const sent = `goverbs_bx_messages_sent_total{device="rxe0"}`
	const lat = `goverbs_bx_rpc_latency_seconds_count{device="rxe0",stream_class="pull"}`
	check := func(when string, wantSent, wantLat float64) {
		t.Helper()
		got := gather(t, reg)
		if got[sent] != wantSent || got[lat] != wantLat {
			t.Errorf("%s: sent %v, rpc count %v; want %v, %v", when, got[sent], got[lat], wantSent, wantLat)
		}
	}
	check("both", 30, 8)
	b.add(5) // after the last scrape, before Remove: counted
	if !c.Remove(b) {
		t.Fatal("Remove(b): false")
	}
	check("b removed", 35, 8)
	a.add(1)
	check("a moved on", 36, 8)
	if !c.Remove(a) {
		t.Fatal("Remove(a): false")
	}
	if got := gather(t, reg); got[sent] != 0 || len(got) != 0 {
		t.Errorf("no source left: %d series, sent %v", len(got), got[sent])
	}
	n := &countingBX{dev: "rxe0", peer: 3, sent: 3}
	must(t, c.AddBX(n))
	check("a new source", 3, 4)
}

// TestRemoveRacesCollect: scrapes while sources are removed never see a
// summed counter go down.
func TestRemoveRacesCollect(t *testing.T) {
	for range 20 {
		c := NewCollector()
		keep := &countingBX{dev: "rxe0", peer: 1, sent: 1}
		must(t, c.AddBX(keep))
		var srcs []*countingBX
		for i := range 20 {
			s := &countingBX{dev: "rxe0", peer: uint64(i + 2), sent: 100}
			srcs = append(srcs, s)
			must(t, c.AddBX(s))
		}
		reg := prometheus.NewRegistry()
		must(t, reg.Register(c))
		done := make(chan struct{})
		errc := make(chan error, 1)
		go func() {
			defer close(errc)
			last := 0.0
			for {
				select {
				case <-done:
					return
				default:
				}
				fams, err := reg.Gather()
				if err != nil {
					errc <- err
					return
				}
				for _, f := range fams {
					if f.GetName() != "goverbs_bx_messages_sent_total" {
						continue
					}
					v := f.Metric[0].Counter.GetValue()
					if v < last {
						errc <- fmt.Errorf("sent went from %v down to %v", last, v)
						return
					}
					last = v
				}
			}
		}()
		for _, s := range srcs {
			c.Remove(s)
			time.Sleep(50 * time.Microsecond)
		}
		close(done)
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if got := gather(t, reg)[`goverbs_bx_messages_sent_total{device="rxe0"}`]; got != 2001 {
			t.Fatalf("sent %v at the end, want 2001", got)
		}
	}
}

// TestAddTwice: a source added twice counted twice in every sum; the
// second Add is refused, with any kind of source.
func TestAddTwice(t *testing.T) {
	c := NewCollector()
	a := &fakeBX{snapshot("rxe0", 1, 10)}
	must(t, c.AddBX(a))
	if err := c.AddBX(a); err == nil || !strings.Contains(err.Error(), "there already") {
		t.Errorf("AddBX twice: %v", err)
	}
	srv := &fakeServer{ps.ServerMetrics{Transport: "tcp", Ops: []ps.OpMetrics{{Op: "pull", Requests: 3}}}}
	must(t, c.AddPSServer(srv))
	if err := c.AddPSServer(srv); err == nil {
		t.Error("AddPSServer twice: no error")
	}
	cli := &fakeClient{ps.ClientMetrics{Transport: "tcp", Ops: []ps.OpMetrics{{Op: "pull", Requests: 4}}}}
	must(t, c.AddPSClient(cli))
	if err := c.AddPSClient(cli); err == nil {
		t.Error("AddPSClient twice: no error")
	}
	// One value added twice is not one source added twice when it is
	// not comparable: it is kept (it cannot be told apart, see Remove).
	f := bxFunc(func() bx.Snapshot { return snapshot("rxe1", 1, 1) })
	must(t, c.AddBX(f))
	must(t, c.AddBX(f))
	reg := prometheus.NewRegistry()
	must(t, reg.Register(c))
	got := gather(t, reg)
	for k, v := range map[string]float64{
		`goverbs_bx_messages_sent_total{device="rxe0"}`:               10,
		`goverbs_ps_server_requests_total{op="pull",transport="tcp"}`: 3,
		`goverbs_ps_client_calls_total{op="pull",transport="tcp"}`:    4,
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

// TestInvalidUTF8Labels: a source's label value that is not valid UTF-8
// (a device, peer address, stream class or pool of a source of one's
// own) made its series an invalid metric: Gather failed and the HTTP
// handler left the series out without a word. It is served with "?" for
// the bad bytes.
func TestInvalidUTF8Labels(t *testing.T) {
	s := snapshot("rxe\xff0", 1, 10)
	s.Peers[0].Addr = "10.0.0.1:\xc3"
	s.Classes[0].Class = "pu\xffll"
	c := NewCollector()
	must(t, c.AddBX(&fakeBX{s}))
	reg := prometheus.NewPedanticRegistry()
	must(t, reg.Register(c))
	got := gather(t, reg)
	for k, v := range map[string]float64{
		`goverbs_bx_messages_sent_total{device="rxe?0"}`:                                               10,
		`goverbs_bx_peer_info{addr="10.0.0.1:?",device="rxe?0",peer="0000000000000001",role="dialer"}`: 1,
		`goverbs_bx_rpc_latency_seconds_count{device="rxe?0",stream_class="pu?ll"}`:                    4,
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

// TestHistogramCount: a source's histogram whose Count is below its
// buckets' sum gave a +Inf bucket below the finite ones (a histogram
// Prometheus cannot read: negative rates between buckets).
func TestHistogramCount(t *testing.T) {
	s := snapshot("rxe0", 1, 10)
	s.Classes[0].Latency.Count = 1 // the buckets hold 4
	c := NewCollector()
	must(t, c.AddBX(&fakeBX{s}))
	reg := prometheus.NewRegistry()
	must(t, reg.Register(c))
	got := gather(t, reg)
	const b = `goverbs_bx_rpc_latency_seconds_bucket{device="rxe0",stream_class="pull",le="34.359738368"}`
	const n = `goverbs_bx_rpc_latency_seconds_count{device="rxe0",stream_class="pull"}`
	if got[n] != 4 || got[b] != 3 {
		t.Errorf("count %v, last finite bucket %v; want 4, 3", got[n], got[b])
	}
}

// TestScrapedLabels: Scraped's labels are its own copy (a map the caller
// changed afterwards, or concurrently, changed or raced the series, and
// bypassed the name check), a value that is not UTF-8 or a name the
// histograms use (le) is refused, and a series that has one of the
// labels already keeps its own as exported_NAME: two labels of one name
// failed the Gather, or, when not adjacent, made a text exposition with a
// duplicate label that a Prometheus server refuses whole.
func TestScrapedLabels(t *testing.T) {
	child := NewCollector()
	must(t, child.AddBX(&fakeBX{snapshot("rxe0", 1, 42)}))
	url, _ := serveTest(t, child)
	labels := map[string]string{"process": "worker1", "device": "parent"}
	g, err := Scraped(url, labels)
	if err != nil {
		t.Fatal(err)
	}
	labels["process"] = "changed"
	labels["bad-name"] = "x"
	got := gather(t, prometheus.Gatherers{g})
	for k, v := range map[string]float64{
		`goverbs_bx_messages_sent_total{device="parent",exported_device="rxe0",process="worker1"}`:                           42,
		`goverbs_bx_rpc_latency_seconds_count{device="parent",exported_device="rxe0",process="worker1",stream_class="pull"}`: 4,
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	for k := range got {
		if strings.Contains(k, "changed") || strings.Contains(k, "bad-name") {
			t.Errorf("a label changed after Scraped: %s", k)
		}
	}
	// The text a parent serves parses, labels unique.
	reg := prometheus.NewRegistry()
	purl, _ := serveGatherer(t, prometheus.Gatherers{reg, g})
	body := get(t, purl)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	if _, err := parser.TextToMetricFamilies(strings.NewReader(body)); err != nil {
		t.Errorf("the parent's exposition does not parse: %v", err)
	}
	for _, l := range []map[string]string{{"process": "bad\xff"}, {"le": "1"}, {"quantile": "1"}} {
		if _, err := Scraped(url, l); err == nil {
			t.Errorf("Scraped with %q: no error", l)
		}
	}
}

func serveGatherer(t *testing.T, g prometheus.Gatherer) (url string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop, err = ServeListener(ln, g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return "http://" + ln.Addr().String() + "/metrics", stop
}
