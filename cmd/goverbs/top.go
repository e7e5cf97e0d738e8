package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"iter"
	"maps"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/internal/hist"
	"github.com/goverbs/goverbs/probe"
)

// goverbs top: a live view of the uverbs path and rxe, from the eBPF
// probes (package probe) and, with --metrics, a process's bx/ps metrics
// endpoint (package metrics).

const topUsage = `Usage: goverbs top [flags]

A live view of RDMA devices, QPs, uverbs commands, doorbells,
retransmissions, command latency and completion event latency, from eBPF
probes (needs root), and of a process's ByteExpress/ps metrics with
--metrics.

  --once             sample for --interval, print once and exit
  --interval D       refresh (or sampling) interval (default 1s)
  --json             with --once: print one JSON object
  --pid PID[,PID]    count only these processes' uverbs commands
  --metrics URL      also show a Prometheus endpoint's goverbs_ metrics
                     (e.g. http://127.0.0.1:9464/metrics)
  --sort KEY         sort commands and QPs by rate (default), count or name
  -n ROWS            rows per table (default 15)
  --skip P[,P]       probes not to attach (uverbs-commands, rxe-packets,
                     rxe-retransmits, rxe-timeouts, rxe-rnr, rxe-qp-errors,
                     rxe-completions, cq-events)
  --per-packet       also attach the per-packet probes (rxe-packets,
                     rxe-retransmits, rxe-completions: per-QP packets,
                     retries and completions); they slow the data path
                     (docs/perf.md). Without them packets and retransmits
                     per device come from rxe's hw_counters.

Keys in the live view: s cycles the sort key, q quits.
`

type topOptions struct {
	once      bool
	interval  time.Duration
	json      bool
	pids      []int
	metrics   string
	sort      string
	rows      int
	perPacket bool // --per-packet: the per-packet probes attached too
}

func runTop(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("goverbs top", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), topUsage) }
	var o topOptions
	var pids string
	fs.BoolVar(&o.once, "once", false, "sample once and exit")
	fs.DurationVar(&o.interval, "interval", time.Second, "interval")
	fs.BoolVar(&o.json, "json", false, "JSON output (with --once)")
	fs.StringVar(&pids, "pid", "", "process ids")
	fs.StringVar(&o.metrics, "metrics", "", "Prometheus endpoint URL")
	fs.StringVar(&o.sort, "sort", "rate", "rate, count or name")
	fs.IntVar(&o.rows, "n", 15, "rows per table")
	var skip string
	fs.StringVar(&skip, "skip", "", "probes not to attach")
	fs.BoolVar(&o.perPacket, "per-packet", false, "attach the per-packet probes too")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("unexpected argument %q", fs.Arg(0))
	}
	if o.interval <= 0 {
		return usageError("--interval %v: must be positive", o.interval)
	}
	if o.rows < 1 {
		return usageError("-n %d: rows per table must be at least 1", o.rows)
	}
	if o.json && !o.once {
		return usageError("--json needs --once")
	}
	if !slices.Contains(topSortKeys, o.sort) {
		return usageError("--sort %q: want one of %s", o.sort, strings.Join(topSortKeys, ", "))
	}
	for _, s := range strings.FieldsFunc(pids, func(r rune) bool { return r == ',' || r == ' ' }) {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 || n > topMaxPID {
			return usageError("--pid %q: not a process id (1..%d)", s, topMaxPID)
		}
		o.pids = append(o.pids, n)
	}
	skips, err := topSkips(skip)
	if err != nil {
		return err
	}
	if err := checkTopMetricsURL(o.metrics); err != nil {
		return err
	}
	p, err := probe.Attach(probe.Options{PIDs: o.pids, Skip: skips, PerPacket: o.perPacket})
	if err != nil {
		if os.Geteuid() != 0 {
			return fmt.Errorf("%v (loading eBPF programs needs root or CAP_BPF+CAP_PERFMON)", err)
		}
		return err
	}
	defer p.Close()
	for _, s := range p.Status() {
		if !s.Attached {
			fmt.Fprintf(stderr, "goverbs top: probe %s not attached: %s\n", s.Name, s.Reason)
		}
	}
	if o.once {
		fmt.Fprintf(stderr, "goverbs top: sampling for %v\n", o.interval)
		r, err := topSample(p, o, nil, o.interval)
		if err != nil {
			return err
		}
		if o.json {
			b, err := json.MarshalIndent(r, "", "  ")
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(stdout, "%s\n", b)
			return err
		}
		r.render(stdout, o, false)
		return nil
	}
	return topLive(p, o, stdout)
}

var topSortKeys = []string{"rate", "count", "name"}

// topMaxPID is Linux's PID_MAX_LIMIT (probe.Attach refuses pids above it).
const topMaxPID = 1 << 22

// topSkips parses --skip: probe names, comma separated, each one that
// probe.Names lists (a misspelt name used to be ignored and its probe
// attached).
func topSkips(s string) ([]string, error) {
	var out []string
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if !slices.Contains(probe.Names(), n) {
			return nil, usageError("--skip %q: no probe %q (probes: %s)", s, n, strings.Join(probe.Names(), ", "))
		}
		out = append(out, n)
	}
	return out, nil
}

// checkTopMetricsURL checks --metrics: an http or https URL with a host,
// or "" for none. A malformed one used to pass and show up only as a
// scrape error in the view.
func checkTopMetricsURL(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usageError("--metrics %q: want an http:// or https:// URL (e.g. http://127.0.0.1:9464/metrics)", s)
	}
	return nil
}

// withPrev yields each item of cur with the item of prev that has the
// same key (the zero V if none): the previous sample's, to subtract from
// the current one.
func withPrev[K comparable, V any](cur, prev []V, key func(V) K) iter.Seq2[V, V] {
	return func(yield func(V, V) bool) {
		old := make(map[K]V, len(prev))
		for _, v := range prev {
			old[key(v)] = v
		}
		for _, v := range cur {
			if !yield(v, old[key(v)]) {
				return
			}
		}
	}
}

// latencyUS is the mean (from totalNS over n) and the p50 and p99 (from
// the log2 histogram) of n latencies, in microseconds.
func latencyUS(h []uint64, totalNS, n uint64) (mean, p50, p99 float64) {
	return float64(totalNS) / float64(n) / 1e3, hist.Log2Quantile(h, 0.5) / 1e3, hist.Log2Quantile(h, 0.99) / 1e3
}

// histDelta is cur - old, bucket by bucket (old may be shorter: nothing
// was counted before).
func histDelta(cur, old []uint64) []uint64 {
	d := make([]uint64, len(cur))
	for i := range cur {
		d[i] = cur[i]
		if i < len(old) {
			d[i] -= old[i]
		}
	}
	return d
}

// topSample is one interval: the counters' growth over d.
type topState struct {
	snap    *probe.Snapshot
	hw      map[string]map[string]uint64
	metrics map[string]float64
}

func topRead(p *probe.Probes, o topOptions) (*topState, error) {
	s, err := p.Snapshot()
	if err != nil {
		return nil, err
	}
	st := &topState{snap: s, hw: map[string]map[string]uint64{}}
	for _, d := range probe.Devices() {
		st.hw[d] = probe.HWCounters(d, 1)
	}
	return st, nil
}

// topReport is what `goverbs top --once --json` prints.
type topReport struct {
	Time         time.Time      `json:"time"`
	IntervalS    float64        `json:"interval_s"`
	Probes       []probe.Status `json:"probes"`
	Devices      []topDevice    `json:"devices"`
	QPs          []topQP        `json:"qps"`
	Commands     []topCommand   `json:"commands"`
	CQEvents     []topCQEvents  `json:"cq_events"`
	Metrics      []topMetric    `json:"metrics,omitempty"`
	MetricsError string         `json:"metrics_error,omitempty"`
	// Dropped is probe.Snapshot.Dropped: per probe map, the inserts
	// since the probes attached that failed because the map was full
	// (the counts above are that much low); absent when none.
	Dropped map[string]uint64 `json:"dropped,omitempty"`
}

type topDevice struct {
	Name          string  `json:"name"`
	Doorbells     uint64  `json:"doorbells"`   // write(POST_SEND) on the device's uverbs fds
	Commands      uint64  `json:"commands"`    // every uverbs command (ioctl and write)
	Retransmits   uint64  `json:"retransmits"` // requester retry passes (probe), else hw completer_retry_err
	DoorbellsPerS float64 `json:"doorbells_per_s"`
	CommandsPerS  float64 `json:"commands_per_s"`
	// RetransmitsFrom is "probe" (rxe-retransmits attached) or "hw_counters".
	RetransmitsFrom string `json:"retransmits_from"`
	SentPkts        uint64 `json:"sent_pkts"`
	RecvPkts        uint64 `json:"recv_pkts"`
	// PacketsFrom is "probe" (rxe-packets attached, with --per-packet) or
	// "hw_counters" (sent_pkts, rcvd_pkts).
	PacketsFrom     string `json:"packets_from"`
	Timeouts        uint64 `json:"timeouts"`
	RNRTimers       uint64 `json:"rnr_timers"`
	QPErrors        uint64 `json:"qp_errors"`
	SendCompletions uint64 `json:"send_completions"`
	RecvCompletions uint64 `json:"recv_completions"`
	// Completion events (cq-events): raised by the kernel for the
	// device's armed CQs, and read from completion channels.
	CQEventsRaised uint64            `json:"cq_events_raised"`
	CQEventsRead   uint64            `json:"cq_events_read"`
	HW             map[string]uint64 `json:"hw_counters,omitempty"` // growth of hw_counters over the interval
}

type topQP struct {
	probe.QP
	SentPerS float64 `json:"sent_per_s"`
}

type topCommand struct {
	PID     int      `json:"pid"`
	Comm    string   `json:"comm"`
	FD      int      `json:"fd"`
	Device  string   `json:"device"`
	Name    string   `json:"name"`
	Count   uint64   `json:"count"`
	PerS    float64  `json:"per_s"`
	Errors  uint64   `json:"errors"`
	MeanUS  float64  `json:"mean_us"`
	P50US   float64  `json:"p50_us"`
	P99US   float64  `json:"p99_us"`
	Hist    []uint64 `json:"hist_log2_ns"`
	TotalNS uint64   `json:"-"`
}

// topCQEvents is one process's completion channel reads on one device
// over the interval: events read, and the latency from the kernel raising
// each (ib_uverbs_comp_handler) to the read() that returned it.
type topCQEvents struct {
	PID       int      `json:"pid"`
	Comm      string   `json:"comm"`
	Device    string   `json:"device"`
	Count     uint64   `json:"count"`     // events read and paired with their raise
	Unmatched uint64   `json:"unmatched"` // events read with no raise seen (before the probes attached)
	PerS      float64  `json:"per_s"`
	MeanUS    float64  `json:"mean_us"`
	P50US     float64  `json:"p50_us"`
	P99US     float64  `json:"p99_us"`
	Hist      []uint64 `json:"hist_log2_ns"`
}

type topMetric struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	PerS  float64 `json:"per_s,omitempty"`
}

// topSample waits d after prev (or takes a first reading now) and reports
// the growth.
func topSample(p *probe.Probes, o topOptions, prev *topState, d time.Duration) (*topReport, error) {
	var err error
	if prev == nil {
		if prev, err = topRead(p, o); err != nil {
			return nil, err
		}
		prev.metrics, _ = topScrape(o.metrics)
	}
	time.Sleep(d)
	cur, err := topRead(p, o)
	if err != nil {
		return nil, err
	}
	r := topDiff(p, prev, cur)
	if o.metrics != "" {
		m, err := topScrape(o.metrics)
		cur.metrics = m
		if err != nil {
			r.MetricsError = err.Error()
		}
		r.Metrics = topMetrics(prev.metrics, m, cur.snap.Time.Sub(prev.snap.Time).Seconds())
	}
	lastState = cur
	return r, nil
}

// lastState is the reading the live view diffs the next one against.
var lastState *topState

func topDiff(p *probe.Probes, prev, cur *topState) *topReport {
	secs := cur.snap.Time.Sub(prev.snap.Time).Seconds()
	if secs <= 0 {
		secs = 1e-9
	}
	r := &topReport{Time: cur.snap.Time, IntervalS: secs, Probes: p.Status(),
		Devices: []topDevice{}, QPs: []topQP{}, Commands: []topCommand{}, CQEvents: []topCQEvents{},
		Dropped: cur.snap.Dropped}
	devs := map[string]*topDevice{}
	dev := func(name string) *topDevice {
		if name == "" {
			name = "?"
		}
		d := devs[name]
		if d == nil {
			d = &topDevice{Name: name, RetransmitsFrom: "probe"}
			devs[name] = d
		}
		return d
	}
	for name := range cur.hw {
		dev(name)
	}
	type ck struct {
		pid, fd int
		name    string
	}
	cmdKey := func(c probe.Command) ck { return ck{c.PID, c.FD, c.Name} }
	comms := map[int]string{}
	comm := func(pid int) string {
		if _, ok := comms[pid]; !ok {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			comms[pid] = strings.TrimSpace(string(b))
		}
		return comms[pid]
	}
	for c, o := range withPrev(cur.snap.Commands, prev.snap.Commands, cmdKey) {
		n := c.Count - o.Count
		if n == 0 {
			continue
		}
		tc := topCommand{PID: c.PID, FD: c.FD, Device: c.Device, Name: c.Name, Count: n,
			PerS: float64(n) / secs, Errors: c.Errors - o.Errors, TotalNS: c.TotalNS - o.TotalNS}
		tc.Hist = histDelta(c.Hist, o.Hist)
		tc.MeanUS, tc.P50US, tc.P99US = latencyUS(tc.Hist, tc.TotalNS, n)
		tc.Comm = comm(c.PID)
		r.Commands = append(r.Commands, tc)
		d := dev(c.Device)
		d.Commands += n
		if c.Doorbell() {
			d.Doorbells += n
		}
	}
	type ek struct {
		pid int
		dev string
	}
	evKey := func(e probe.CQEvents) ek { return ek{e.PID, e.Device} }
	for e, o := range withPrev(cur.snap.CQEvents, prev.snap.CQEvents, evKey) {
		n, un := e.Count-o.Count, e.Unmatched-o.Unmatched
		if n == 0 && un == 0 {
			continue
		}
		te := topCQEvents{PID: e.PID, Comm: comm(e.PID), Device: e.Device, Count: n, Unmatched: un,
			PerS: float64(n+un) / secs, Hist: histDelta(e.Hist, o.Hist)}
		if n > 0 {
			te.MeanUS, te.P50US, te.P99US = latencyUS(te.Hist, e.TotalNS-o.TotalNS, n)
		}
		r.CQEvents = append(r.CQEvents, te)
		if e.Device != "" {
			dev(e.Device).CQEventsRead += n
		}
	}
	for name, v := range cur.snap.EventsRaised {
		if d := v - prev.snap.EventsRaised[name]; d > 0 {
			dev(name).CQEventsRaised += d
		}
	}
	type qk struct {
		dev string
		qpn uint32
	}
	qpKey := func(q probe.QP) qk { return qk{q.Device, q.QPN} }
	for q, o := range withPrev(cur.snap.QPs, prev.snap.QPs, qpKey) {
		dq := probe.QP{Device: q.Device, QPN: q.QPN,
			SentPkts: q.SentPkts - o.SentPkts, RecvPkts: q.RecvPkts - o.RecvPkts,
			Retransmits: q.Retransmits - o.Retransmits, Timeouts: q.Timeouts - o.Timeouts,
			RNRTimers: q.RNRTimers - o.RNRTimers, QPErrors: q.QPErrors - o.QPErrors,
			SendCompletions: q.SendCompletions - o.SendCompletions, RecvCompletions: q.RecvCompletions - o.RecvCompletions,
			ErrorCompletions: q.ErrorCompletions - o.ErrorCompletions,
			SeqNaks:          q.SeqNaks - o.SeqNaks, RNRNaks: q.RNRNaks - o.RNRNaks}
		if dq == (probe.QP{Device: q.Device, QPN: q.QPN}) {
			continue
		}
		r.QPs = append(r.QPs, topQP{QP: dq, SentPerS: float64(dq.SentPkts) / secs})
		d := dev(q.Device)
		d.SentPkts += dq.SentPkts
		d.RecvPkts += dq.RecvPkts
		d.Retransmits += dq.Retransmits
		d.Timeouts += dq.Timeouts
		d.RNRTimers += dq.RNRTimers
		d.QPErrors += dq.QPErrors
		d.SendCompletions += dq.SendCompletions
		d.RecvCompletions += dq.RecvCompletions
	}
	probeRetr, probePkts := p.Attached("rxe-retransmits"), p.Attached("rxe-packets")
	for name, d := range devs {
		d.PacketsFrom = "probe"
		if hw := cur.hw[name]; hw != nil {
			d.HW = map[string]uint64{}
			for k, v := range hw {
				d.HW[k] = v - prev.hw[name][k]
			}
			if !probeRetr {
				d.Retransmits, d.RetransmitsFrom = d.HW["completer_retry_err"], "hw_counters"
			}
			if !probePkts {
				d.SentPkts, d.RecvPkts, d.PacketsFrom = d.HW["sent_pkts"], d.HW["rcvd_pkts"], "hw_counters"
			}
		} else {
			if !probeRetr {
				d.RetransmitsFrom = "none"
			}
			if !probePkts {
				d.PacketsFrom = "none"
			}
		}
		d.DoorbellsPerS = float64(d.Doorbells) / secs
		d.CommandsPerS = float64(d.Commands) / secs
		r.Devices = append(r.Devices, *d)
	}
	sort.Slice(r.Devices, func(i, j int) bool { return r.Devices[i].Name < r.Devices[j].Name })
	return r
}

// topMetrics lists the scraped samples: counters (_total) and histogram
// counts (_count) with their rate over the interval; histograms' _bucket
// samples become NAME_p50 and NAME_p99 estimates (seconds) of the
// observations made during the interval, if there were any.
func topMetrics(prev, cur map[string]float64, secs float64) []topMetric {
	if secs <= 0 {
		secs = 1e-9
	}
	var out []topMetric
	for name, v := range cur {
		if strings.Contains(name, "_bucket{") {
			continue
		}
		tm := topMetric{Name: name, Value: v}
		if pv, ok := prev[name]; ok && (strings.HasSuffix(strings.SplitN(name, "{", 2)[0], "_total") || strings.Contains(name, "_count")) {
			tm.PerS = (v - pv) / secs
		}
		out = append(out, tm)
	}
	for name, q := range topHistQuantiles(prev, cur) {
		out = append(out, topMetric{Name: name, Value: q})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// topHistQuantiles estimates p50 and p99 of every histogram in cur from the
// growth of its cumulative buckets since prev (all of it if prev lacks
// them), interpolating inside a bucket as Prometheus' histogram_quantile
// does. Histograms without observations in the interval are left out.
func topHistQuantiles(prev, cur map[string]float64) map[string]float64 {
	type bucket struct{ le, n float64 }
	hs := map[string][]bucket{} // NAME{labels without le} -> buckets
	for name, v := range cur {
		i := strings.Index(name, "_bucket{")
		if i < 0 || !strings.HasSuffix(name, "}") {
			continue
		}
		var le string
		var rest []string
		for _, l := range splitLabels(name[i+len("_bucket{") : len(name)-1]) {
			if strings.HasPrefix(l, "le=") {
				le = strings.Trim(strings.TrimPrefix(l, "le="), `"`)
			} else {
				rest = append(rest, l)
			}
		}
		bound, err := strconv.ParseFloat(le, 64)
		if err != nil {
			continue
		}
		key := name[:i] + "{" + strings.Join(rest, ",") + "}"
		hs[key] = append(hs[key], bucket{bound, v - prev[name]})
	}
	out := map[string]float64{}
	for key, bs := range hs {
		sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
		total := bs[len(bs)-1].n
		if total <= 0 {
			continue
		}
		i := strings.IndexByte(key, '{')
		for _, q := range []struct {
			name string
			q    float64
		}{{"_p50", 0.5}, {"_p99", 0.99}} {
			rank := q.q * total
			lo, below := 0.0, 0.0
			v := 0.0
			for _, b := range bs {
				if b.n >= rank {
					if math.IsInf(b.le, 1) {
						v = lo // above the highest finite bound
					} else {
						v = lo + (b.le-lo)*(rank-below)/math.Max(b.n-below, 1e-300)
					}
					break
				}
				lo, below = b.le, b.n
			}
			out[key[:i]+q.name+key[i:]] = v
		}
	}
	return out
}

// splitLabels splits `a="x",b="y,z"` at the commas between labels.
func splitLabels(s string) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			quoted = !quoted
		case ',':
			if !quoted {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// topScrape reads the goverbs_ samples of a Prometheus text endpoint.
func topScrape(url string) (map[string]float64, error) {
	// A scrape that takes longer than this is reported, not waited for:
	// top redraws every --interval.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return topScrapeCtx(ctx, url)
}

// topScrapeCtx is topScrape bounded by ctx (tests pass a hang bound).
func topScrapeCtx(ctx context.Context, url string) (map[string]float64, error) {
	if url == "" {
		return nil, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return topSamples(resp.Body)
}

// topSamples reads a metrics page's goverbs_ samples, name with labels to
// value; lines it does not understand are passed over.
func topSamples(r io.Reader) (map[string]float64, error) {
	m := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "goverbs_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}

func (r *topReport) sortBy(key string) {
	switch key {
	case "name":
		sort.SliceStable(r.Commands, func(i, j int) bool {
			a, b := r.Commands[i], r.Commands[j]
			if a.Name != b.Name {
				return a.Name < b.Name
			}
			return a.PID < b.PID
		})
		sort.SliceStable(r.CQEvents, func(i, j int) bool {
			a, b := r.CQEvents[i], r.CQEvents[j]
			if a.Device != b.Device {
				return a.Device < b.Device
			}
			return a.PID < b.PID
		})
		sort.SliceStable(r.QPs, func(i, j int) bool {
			if r.QPs[i].Device != r.QPs[j].Device {
				return r.QPs[i].Device < r.QPs[j].Device
			}
			return r.QPs[i].QPN < r.QPs[j].QPN
		})
	default: // rate and count order the same within one interval
		sort.SliceStable(r.Commands, func(i, j int) bool { return r.Commands[i].Count > r.Commands[j].Count })
		sort.SliceStable(r.CQEvents, func(i, j int) bool {
			return r.CQEvents[i].Count+r.CQEvents[i].Unmatched > r.CQEvents[j].Count+r.CQEvents[j].Unmatched
		})
		sort.SliceStable(r.QPs, func(i, j int) bool {
			a, b := r.QPs[i], r.QPs[j]
			return a.SentPkts+a.RecvPkts > b.SentPkts+b.RecvPkts
		})
	}
}

// render writes the text view.
func (r *topReport) render(w io.Writer, o topOptions, live bool) {
	r.sortBy(o.sort)
	bw := bufio.NewWriter(w)
	defer bw.Flush()
	nl := "\n"
	if live {
		nl = "\x1b[K\r\n" // raw mode: clear to end of line, carriage return
		fmt.Fprint(bw, "\x1b[H")
	}
	pf := func(format string, a ...any) { fmt.Fprintf(bw, format, a...); fmt.Fprint(bw, nl) }
	pf("goverbs top - %s - interval %.2fs - sort %s%s", r.Time.Format("15:04:05"), r.IntervalS, o.sort, map[bool]string{true: " - keys: s sort, q quit"}[live])
	var missing []string
	attached := map[string]bool{}
	for _, s := range r.Probes {
		attached[s.Name] = s.Attached
		if !s.Attached && (!s.PerPacket || o.perPacket) {
			missing = append(missing, s.Name)
		}
	}
	if len(missing) > 0 {
		pf("probes not attached: %s (see --once --json for reasons)", strings.Join(missing, ", "))
	}
	if line := droppedLine(r.Dropped); line != "" {
		pf("%s", line)
	}
	if !o.perPacket {
		pf("per-QP packets, retries and CQEs (-) need --per-packet; device packets and retransmits are rxe's hw_counters")
	}
	// num prints n, or - when the probe that counts it is not attached.
	num := func(probe string, width int, n float64) string {
		if !attached[probe] {
			return fmt.Sprintf("%*s", width, "-")
		}
		return fmt.Sprintf("%*.0f", width, n)
	}
	pf("")
	pf("%-8s %10s %10s %10s %10s %10s %8s %8s %8s %8s %8s", "DEVICE", "DOORBELL/s", "CMDS/s", "TX pkt/s", "RX pkt/s", "CQEV/s", "RETRANS", "TIMEOUT", "RNR", "SEQERR", "QPERR")
	for _, d := range r.Devices {
		pf("%-8s %10.0f %10.0f %10.0f %10.0f %10.0f %8d %8d %8d %8d %8d", d.Name, d.DoorbellsPerS, d.CommandsPerS,
			float64(d.SentPkts)/r.IntervalS, float64(d.RecvPkts)/r.IntervalS, float64(d.CQEventsRaised)/r.IntervalS,
			d.Retransmits, d.Timeouts, d.HW["rcvd_rnr_err"], d.HW["rcvd_seq_err"]+d.HW["out_of_seq_request"], d.QPErrors)
	}
	pf("")
	pf("%-8s %8s %10s %10s %8s %8s %8s %8s %8s", "DEVICE", "QPN", "TX pkt/s", "RX pkt/s", "RETRANS", "TIMEOUT", "SEND CQE", "RECV CQE", "ERR CQE")
	for i, q := range r.QPs {
		if i == o.rows {
			break
		}
		pf("%-8s %#8x %s %s %s %8d %s %s %s", q.Device, q.QPN,
			num("rxe-packets", 10, q.SentPerS), num("rxe-packets", 10, float64(q.RecvPkts)/r.IntervalS),
			num("rxe-retransmits", 8, float64(q.Retransmits)), q.Timeouts,
			num("rxe-completions", 8, float64(q.SendCompletions)), num("rxe-completions", 8, float64(q.RecvCompletions)),
			num("rxe-completions", 8, float64(q.ErrorCompletions)))
	}
	pf("")
	pf("%7s %-14s %-8s %-28s %10s %8s %9s %9s %9s  %s", "PID", "COMM", "DEVICE", "COMMAND", "RATE/s", "ERRORS", "MEAN us", "P50 us", "P99 us", "LATENCY (log2 ns)")
	for i, c := range r.Commands {
		if i == o.rows {
			break
		}
		pf("%7d %-14.14s %-8s %-28.28s %10.0f %8d %9.1f %9.1f %9.1f  %s", c.PID, c.Comm, c.Device, c.Name, c.PerS, c.Errors, c.MeanUS, c.P50US, c.P99US, sparkline(c.Hist))
	}
	if len(r.CQEvents) > 0 {
		pf("")
		pf("%7s %-14s %-8s %-28s %10s %8s %9s %9s %9s  %s", "PID", "COMM", "DEVICE", "CQ EVENTS (raise -> read)", "RATE/s", "UNMATCH", "MEAN us", "P50 us", "P99 us", "LATENCY (log2 ns)")
		for i, e := range r.CQEvents {
			if i == o.rows {
				break
			}
			dev := e.Device
			if dev == "" {
				dev = "?"
			}
			pf("%7d %-14.14s %-8s %-28s %10.0f %8d %9.1f %9.1f %9.1f  %s", e.PID, e.Comm, dev, "completion channel read", e.PerS, e.Unmatched, e.MeanUS, e.P50US, e.P99US, sparkline(e.Hist))
		}
	}
	if len(r.Metrics) > 0 || r.MetricsError != "" {
		pf("")
		pf("METRICS %s", r.MetricsError)
		for i, m := range r.Metrics {
			if i == 3*o.rows {
				break
			}
			if m.PerS != 0 {
				pf("  %-70.70s %14g %12.1f/s", m.Name, m.Value, m.PerS)
			} else {
				pf("  %-70.70s %14g", m.Name, m.Value)
			}
		}
	}
	if live {
		fmt.Fprint(bw, "\x1b[J")
	}
}

// droppedLine says which probe maps filled up and how many updates they
// dropped since the probes attached, e.g. "probe maps full, 12 updates
// dropped: gv_qps 12 (counts are low)"; "" when none did.
func droppedLine(d map[string]uint64) string {
	var total uint64
	var per []string
	for _, name := range slices.Sorted(maps.Keys(d)) {
		if d[name] > 0 {
			total += d[name]
			per = append(per, fmt.Sprintf("%s %d", name, d[name]))
		}
	}
	if total == 0 {
		return ""
	}
	return fmt.Sprintf("probe maps full, %d updates dropped: %s (counts are low)", total, strings.Join(per, ", "))
}

// sparkline draws the non-empty range of a log2 histogram.
func sparkline(h []uint64) string {
	lo, hi := -1, -1
	var max uint64
	for i, v := range h {
		if v > 0 {
			if lo < 0 {
				lo = i
			}
			hi = i
			max = maxU(max, v)
		}
	}
	if lo < 0 {
		return ""
	}
	bars := []rune(" ▁▂▃▄▅▆▇█")
	var b strings.Builder
	fmt.Fprintf(&b, "2^%d ", lo)
	for _, v := range h[lo : hi+1] {
		b.WriteRune(bars[(v*uint64(len(bars)-1)+max-1)/max])
	}
	return b.String()
}

func maxU(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}

// topLive redraws every interval until q, ^C or SIGTERM. On a terminal
// stdin goes to raw mode for the keys.
func topLive(p *probe.Probes, o topOptions, stdout io.Writer) error {
	keys := make(chan byte, 8)
	if old, err := unix.IoctlGetTermios(0, unix.TCGETS); err == nil {
		raw := *old
		raw.Lflag &^= unix.ICANON | unix.ECHO
		raw.Cc[unix.VMIN], raw.Cc[unix.VTIME] = 1, 0
		if unix.IoctlSetTermios(0, unix.TCSETS, &raw) == nil {
			defer unix.IoctlSetTermios(0, unix.TCSETS, old)
		}
		go func() {
			b := make([]byte, 1)
			for {
				if n, err := os.Stdin.Read(b); err != nil || n == 0 {
					return
				}
				keys <- b[0]
			}
		}()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	fmt.Fprint(stdout, "\x1b[?25l\x1b[2J")
	defer fmt.Fprint(stdout, "\x1b[?25h\n")
	prev, err := topRead(p, o)
	if err != nil {
		return err
	}
	prev.metrics, _ = topScrape(o.metrics)
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	var last *topReport
	for {
		select {
		case <-sig:
			return nil
		case k := <-keys:
			switch k {
			case 'q', 'Q', 3:
				return nil
			case 's', 'S':
				i := slices.Index(topSortKeys, o.sort)
				o.sort = topSortKeys[(i+1)%len(topSortKeys)]
				if last != nil {
					last.render(stdout, o, true)
				}
			}
		case <-tick.C:
			r, err := topSample(p, o, prev, 0)
			if err != nil {
				return err
			}
			prev = lastState
			last = r
			r.render(stdout, o, true)
		}
	}
}
