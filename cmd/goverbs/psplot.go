package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/goverbs/goverbs/internal/hist"
)

// goverbs ps report: bench --json results side by side (rdma against tcp
// per workload and operation, with the change in percent), and PNG plots.

// scanResults adds the bench results and rtt lines sc reads to rs and
// rtts; other lines are skipped. A read error (a folder, a line over the
// scanner's 64 MiB) is returned: it used to end the file silently, its
// later results dropped.
func scanResults(sc *bufio.Scanner, rs *[]benchResult, rtts *[]rttResult) error {
	for sc.Scan() {
		var l rttLine
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.RTT != nil {
			*rtts = append(*rtts, *l.RTT)
			continue
		}
		var r benchResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Transport == "" {
			continue
		}
		*rs = append(*rs, r)
	}
	return sc.Err()
}

func psReport(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("goverbs ps report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	plots := fs.String("plots", "", "write PNG plots into this folder")
	files, err := parseGetopt(fs, args)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return usageError("no result files")
	}
	var rs []benchResult
	var rtts []rttResult
	for _, f := range files {
		b, err := os.Open(f)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(b)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		if err := scanResults(sc, &rs, &rtts); err != nil {
			b.Close()
			return fmt.Errorf("%s: %w", f, err)
		}
		b.Close()
	}
	if len(rs) == 0 {
		return fmt.Errorf("no bench results in %v", files)
	}
	rs = mergeRounds(rs)
	printSideBySide(stdout, rs)
	printPaperTable(stdout, rs, rtts)
	if *plots != "" {
		if err := os.MkdirAll(*plots, 0o755); err != nil {
			return err
		}
		written, err := writePlots(*plots, rs)
		if err != nil {
			return err
		}
		for _, w := range written {
			fmt.Fprintf(stdout, "wrote %s\n", w)
		}
	}
	return nil
}

// mergeRounds folds repeated runs of one (workload, transport) into one:
// histograms and counts add up, CPU adds up; means and percentiles are
// recomputed from the merged histograms.
func mergeRounds(rs []benchResult) []benchResult {
	type key struct {
		w, t    string
		mtu     int
		offered float64
	}
	keyOf := func(r *benchResult) key { return key{r.Workload, r.Transport, r.MTU, r.Offered} }
	idx := map[key]int{}
	var out []benchResult
	hists := map[key]map[string]*hist.Fine{}
	for _, r := range rs {
		k := keyOf(&r)
		i, ok := idx[k]
		if !ok {
			idx[k] = len(out)
			out = append(out, benchResult{Transport: r.Transport, Workload: r.Workload, Workers: r.Workers, Servers: r.Servers, WorkerProcs: r.WorkerProcs,
				MTU: r.MTU, IBMTU: r.IBMTU, Offered: r.Offered})
			hists[k] = map[string]*hist.Fine{}
			i = idx[k]
		}
		o := &out[i]
		o.Achieved += r.Achieved * r.Duration // per second again below
		o.Late += r.Late
		o.Duration += r.Duration
		o.CPU += r.CPU
		o.ServerCPU += r.ServerCPU
		o.WorkerCPU += r.WorkerCPU
		o.Errors += r.Errors
		if r.RNR != nil {
			v := *r.RNR
			if o.RNR != nil {
				v += *o.RNR
			}
			o.RNR = &v
		}
		for _, op := range r.Ops {
			h := hists[k][op.Op]
			if h == nil {
				h = hist.NewFine()
				hists[k][op.Op] = h
			}
			for _, b := range op.Hist {
				h.C[hist.FineBucket(b[0]-1)] += int64(b[1])
			}
			h.N += op.Count
			h.Sum += op.Mean * 1e3 * float64(op.Count)
		}
	}
	for i := range out {
		o := &out[i]
		k := keyOf(o)
		if o.Duration > 0 {
			o.Achieved /= o.Duration
		}
		var total int64
		for _, h := range hists[k] {
			total += h.N
		}
		for _, name := range []string{"pull", "push"} {
			h := hists[k][name]
			if h == nil || h.N == 0 {
				continue
			}
			op := benchOp{Op: name, Count: h.N, Mean: h.Mean() / 1e3, P50: h.Quantile(0.5) / 1e3, P99: h.Quantile(0.99) / 1e3,
				P999: h.Quantile(0.999) / 1e3, OpsPerSec: float64(h.N) / o.Duration, Hist: h.Buckets()}
			if total > 0 {
				op.CPUPerKop = o.CPU / (float64(total) / 1000)
			}
			o.Ops = append(o.Ops, op)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := &out[i], &out[j]
		if a.Workload != b.Workload {
			return a.Workload < b.Workload
		}
		if a.MTU != b.MTU {
			return a.MTU < b.MTU
		}
		return a.Offered < b.Offered
	})
	return out
}

func printSideBySide(w io.Writer, rs []benchResult) {
	printBench(w, rs)
	find := func(g benchResult, tr string) *benchResult {
		for i := range rs {
			if r := &rs[i]; r.Workload == g.Workload && r.MTU == g.MTU && r.Offered == g.Offered && r.Transport == tr {
				return r
			}
		}
		return nil
	}
	pct := func(a, b float64) string {
		if b == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%+.1f%%", (a-b)/b*100)
	}
	fmt.Fprintf(w, "\nrdma vs tcp (negative = rdma lower)\n")
	fmt.Fprintf(w, "%-9s %5s %-11s %-4s %9s %9s %9s %9s %11s %10s\n", "workload", "mtu", "load", "op", "mean", "p50", "p99", "p999", "cpu/op", "rnr(rdma)")
	type gkey struct {
		w       string
		mtu     int
		offered float64
	}
	seen := map[gkey]bool{}
	for _, r := range rs {
		if k := (gkey{r.Workload, r.MTU, r.Offered}); seen[k] {
			continue
		} else {
			seen[k] = true
		}
		a, b := find(r, "rdma"), find(r, "tcp")
		if a == nil || b == nil {
			continue
		}
		rnr := "n/a"
		if a.RNR != nil {
			rnr = fmt.Sprint(*a.RNR)
		}
		for _, oa := range a.Ops {
			for _, ob := range b.Ops {
				if oa.Op == ob.Op {
					fmt.Fprintf(w, "%-9s %5s %-11s %-4s %9s %9s %9s %9s %11s %10s\n", r.Workload, mtuString(r.MTU), loadString(r.Offered), oa.Op, pct(oa.Mean, ob.Mean), pct(oa.P50, ob.P50),
						pct(oa.P99, ob.P99), pct(oa.P999, ob.P999), pct(oa.CPUPerKop, ob.CPUPerKop), rnr)
				}
			}
		}
	}
}

var transportColor = map[string]color.Color{"rdma": color.RGBA{0x1f, 0x77, 0xb4, 0xff}, "tcp": color.RGBA{0xd6, 0x27, 0x28, 0xff}}

// writePlots: per workload and MTU a latency CDF of the closed loop (one
// line per transport and op, cdf-WORKLOAD[-mtuN].png) and, where there are
// open-loop runs, latency against offered load (p50 and p99 of the
// workload's main op per transport, load-WORKLOAD[-mtuN].png); and one bar
// chart of closed-loop P99 per workload and op, rdma next to tcp.
func writePlots(dir string, rs []benchResult) ([]string, error) {
	var written []string
	type group struct {
		wl  string
		mtu int
	}
	workloads := map[group][]benchResult{}
	var order []group
	mtus := map[int]bool{}
	for _, r := range rs {
		g := group{r.Workload, r.MTU}
		if _, ok := workloads[g]; !ok {
			order = append(order, g)
		}
		workloads[g] = append(workloads[g], r)
		mtus[r.MTU] = true
	}
	suffix := func(g group) string {
		if g.mtu == 0 {
			return ""
		}
		return "-mtu" + strconv.Itoa(g.mtu)
	}
	title := func(g group) string {
		if g.mtu == 0 {
			return "ps " + g.wl
		}
		return fmt.Sprintf("ps %s, MTU %d", g.wl, g.mtu)
	}
	for _, g := range order {
		p := newLogPlot(title(g)+": latency CDF, closed loop", "latency (us, log)", "fraction of operations", true)
		lines := 0
		for _, r := range workloads[g] {
			if r.Offered != 0 {
				continue
			}
			for i, op := range r.Ops {
				var pts plotter.XYs
				var cum, n uint64
				for _, b := range op.Hist {
					n += b[1]
				}
				if n == 0 {
					continue // nothing counted: no CDF (0/0 made NaN points)
				}
				for _, b := range op.Hist {
					cum += b[1]
					pts = append(pts, plotter.XY{X: max(float64(b[0])/1e3, 0.001), Y: float64(cum) / float64(n)})
				}
				if len(pts) == 0 {
					continue
				}
				l, err := plotter.NewLine(pts)
				if err != nil {
					return written, err
				}
				l.Color = transportColor[r.Transport]
				l.Width = vg.Points(1.5)
				if i > 0 {
					l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
				}
				p.Add(l)
				p.Legend.Add(r.Transport+" "+op.Op, l)
				lines++
			}
		}
		if lines > 0 {
			f := filepath.Join(dir, "cdf-"+g.wl+suffix(g)+".png")
			padLogAxis(&p.X)
			if err := p.Save(7*vg.Inch, 4.5*vg.Inch, f); err != nil {
				return written, err
			}
			written = append(written, f)
		}
		f, err := writeLoadPlot(dir, "load-"+g.wl+suffix(g)+".png", title(g), workloads[g])
		if err != nil {
			return written, err
		}
		if f != "" {
			written = append(written, f)
		}
	}
	// P99 bars.
	var labels []string
	vals := map[string]plotter.Values{"rdma": nil, "tcp": nil}
	for _, g := range order {
		ops := map[string]bool{}
		for _, r := range workloads[g] {
			if r.Offered != 0 {
				continue
			}
			for _, o := range r.Ops {
				ops[o.Op] = true
			}
		}
		for _, opn := range []string{"pull", "push"} {
			if !ops[opn] {
				continue
			}
			l := g.wl + " " + opn
			if len(mtus) > 1 {
				l += " " + mtuString(g.mtu)
			}
			labels = append(labels, l)
			for _, tr := range []string{"rdma", "tcp"} {
				v := 0.0
				for _, r := range workloads[g] {
					if r.Transport != tr || r.Offered != 0 {
						continue
					}
					for _, o := range r.Ops {
						if o.Op == opn {
							v = o.P99
						}
					}
				}
				vals[tr] = append(vals[tr], v)
			}
		}
	}
	p := plot.New()
	if len(labels) == 0 {
		return written, nil
	}
	p.Title.Text = "ps: P99 latency per workload and operation, closed loop"
	p.Y.Label.Text = "P99 (us)"
	w := vg.Points(14)
	for i, tr := range []string{"rdma", "tcp"} {
		b, err := plotter.NewBarChart(vals[tr], w)
		if err != nil {
			return written, err
		}
		b.Color = transportColor[tr]
		b.LineStyle.Width = 0
		b.Offset = vg.Length(2*i-1) * w / 2
		p.Add(b)
		p.Legend.Add(tr, b)
	}
	p.Legend.Top = true
	p.NominalX(labels...)
	f := filepath.Join(dir, "p99.png")
	if err := p.Save(vg.Length(2+1.3*float64(len(labels)))*vg.Inch, 4.5*vg.Inch, f); err != nil {
		return written, err
	}
	return append(written, f), nil
}

// rttLine is a line of scripts/demo's rtt-*.json: the bare round trips of
// a workload's request and response bytes in the boot of the ps runs.
type rttLine struct {
	RTT *rttResult `json:"rtt"`
}

type rttResult struct {
	Workload string  `json:"workload"`
	MTU      int     `json:"mtu"`
	Req      int     `json:"req_bytes"`
	Resp     int     `json:"resp_bytes"`
	Verbs    float64 `json:"verbs_us"` // goverbs perf send_lat: t_typical at Req plus at Resp (each half a round trip)
	BX       float64 `json:"bx_us"`    // goverbs perf bx_lat -s Req --resp-size Resp: t_typical
	TCP      float64 `json:"tcp_us"`   // goverbs perf tcp_lat -s Req --resp-size Resp: t_typical
}

// The paper's goals (ByteExpress against kernel TCP), as ratios rdma/tcp.
const (
	goalPullMean = 0.643 // parameter fetch latency -35.7% mean
	goalPullP99  = 0.563 // -43.7% P99
	goalCPUOp    = 0.893 // total CPU -10.69%
	goalIncast   = 0.26  // training push P99 under incast up to -74.0%
)

// tableRate is the open-loop rate of a workload that the paper table
// reads, and the knee it derives from: the lower of the two transports'
// closed-loop throughputs (steps/s) is the knee, and the table takes the
// offered rate nearest half of it. Without a closed loop of both
// transports, the lowest offered rate (knee 0); without open-loop runs,
// rate 0.
func tableRate(rs []benchResult, workload string, mtu int) (rate, knee float64) {
	kn := map[string]float64{}
	var offered []float64
	for _, r := range rs {
		if r.Workload != workload || r.MTU != mtu {
			continue
		}
		if r.Offered == 0 {
			kn[r.Transport] = r.Achieved
		} else {
			offered = append(offered, r.Offered)
		}
	}
	if kn["rdma"] > 0 && kn["tcp"] > 0 {
		knee = min(kn["rdma"], kn["tcp"])
	}
	if len(offered) == 0 {
		return 0, knee
	}
	sort.Float64s(offered)
	rate = offered[0]
	if knee == 0 {
		return rate, 0
	}
	for _, o := range offered {
		if math.Abs(math.Log(o/(knee/2))) < math.Abs(math.Log(rate/(knee/2))) {
			rate = o
		}
	}
	return rate, knee
}

// printPaperTable prints, per MTU, the paper's figures as ratios rdma/tcp
// against its goals, in closed loop and in open loop at the table rate,
// with the bare round trips of the same bytes measured in the same boot.
func printPaperTable(w io.Writer, rs []benchResult, rtts []rttResult) {
	var mtus []int
	for _, r := range rs {
		if (r.Workload == "inference" || r.Workload == "incast") && !slices.Contains(mtus, r.MTU) {
			mtus = append(mtus, r.MTU)
		}
	}
	sort.Ints(mtus)
	get := func(wl string, mtu int, offered float64, tr, op string) (*benchResult, *benchOp) {
		for i := range rs {
			r := &rs[i]
			if r.Workload == wl && r.MTU == mtu && r.Offered == offered && r.Transport == tr {
				for j := range r.Ops {
					if r.Ops[j].Op == op {
						return r, &r.Ops[j]
					}
				}
			}
		}
		return nil, nil
	}
	// cell: rdma/tcp of f over (wl, op) at a load, against goal.
	cell := func(wl, op string, mtu int, offered float64, f func(*benchOp) float64, goal float64) string {
		_, a := get(wl, mtu, offered, "rdma", op)
		_, b := get(wl, mtu, offered, "tcp", op)
		if a == nil || b == nil || f(b) == 0 {
			return "-"
		}
		x := f(a) / f(b)
		met := "no"
		if x <= goal {
			met = "MET"
		}
		return fmt.Sprintf("%.3f %s (%.4g/%.4g)", x, met, f(a), f(b))
	}
	mean := func(o *benchOp) float64 { return o.Mean }
	p99 := func(o *benchOp) float64 { return o.P99 }
	cpu := func(o *benchOp) float64 { return o.CPUPerKop * 1000 } // us per op
	for _, mtu := range mtus {
		ir, iknee := tableRate(rs, "inference", mtu)
		cr, cknee := tableRate(rs, "incast", mtu)
		ib := 0
		procs := map[string]bool{}
		for _, r := range rs {
			if r.MTU == mtu && r.IBMTU != 0 {
				ib = r.IBMTU
			}
			if r.MTU == mtu && r.WorkerProcs > 0 {
				procs[fmt.Sprintf("servers %d, worker processes %d", r.Servers, r.WorkerProcs)] = true
			}
		}
		topo := ""
		if len(procs) > 0 {
			topo = ", " + strings.Join(slices.Sorted(maps.Keys(procs)), " / ")
		}
		fmt.Fprintf(w, "\npaper table, link MTU %s (rxe active_mtu %s%s): rdma/tcp, goal, measured (rdma/tcp in us)\n", mtuString(mtu), mtuString(ib), topo)
		open := "open loop"
		if ir > 0 || cr > 0 {
			open = fmt.Sprintf("open loop (inference %.0f, incast %.0f steps/s)", ir, cr)
		}
		fmt.Fprintf(w, "  %-30s %7s  %-34s %s\n", "figure", "goal", "closed loop", open)
		row := func(name string, goal float64, wl, op string, f func(*benchOp) float64, orate float64) {
			o := "-"
			if orate > 0 {
				o = cell(wl, op, mtu, orate, f, goal)
			}
			fmt.Fprintf(w, "  %-30s %7s  %-34s %s\n", name, fmt.Sprintf("<=%.3g", goal), cell(wl, op, mtu, 0, f, goal), o)
		}
		row("inference pull mean", goalPullMean, "inference", "pull", mean, ir)
		row("inference pull P99", goalPullP99, "inference", "pull", p99, ir)
		row("inference CPU per op", goalCPUOp, "inference", "pull", cpu, ir)
		row("incast push P99", goalIncast, "incast", "push", p99, cr)
		var rnr uint64
		runs := 0
		for _, r := range rs {
			if r.MTU == mtu && r.Transport == "rdma" && r.RNR != nil {
				rnr += *r.RNR
				runs++
			}
		}
		met := "no"
		if rnr == 0 {
			met = "MET"
		}
		fmt.Fprintf(w, "  %-30s %7s  %d %s (all %d rdma runs at this MTU)\n", "RNR NAK retries", "0", rnr, met, runs)
		if iknee > 0 || cknee > 0 {
			fmt.Fprintf(w, "  knee (lower closed-loop steps/s of the two): inference %.0f, incast %.0f; open loop at the rate nearest half of it\n", iknee, cknee)
		}
		// The bare round trips of the same bytes, and what they predict.
		var any bool
		for _, wl := range []string{"inference", "incast"} {
			var v, x, t []float64
			var req, resp int
			for _, q := range rtts {
				if q.Workload == wl && q.MTU == mtu {
					v, x, t = append(v, q.Verbs), append(x, q.BX), append(t, q.TCP)
					req, resp = q.Req, q.Resp
				}
			}
			if len(v) == 0 {
				continue
			}
			if !any {
				fmt.Fprintf(w, "  bare round trip of the same bytes, same boot (median of runs, us): verbs (send_lat), bx (bx_lat), tcp (tcp_lat)\n")
				any = true
			}
			vm, xm, tm := median(v), median(x), median(t)
			op := "pull"
			if wl == "incast" {
				op = "push"
			}
			verdict := "verbs not below tcp: no must-show"
			if vm > 0 && vm < tm {
				_, a := get(wl, mtu, 0, "rdma", op)
				_, b := get(wl, mtu, 0, "tcp", op)
				verdict = "verbs below tcp: rdma must be below tcp"
				if a != nil && b != nil {
					verdict += fmt.Sprintf("; closed-loop %s mean rdma/tcp %.3f", op, a.Mean/b.Mean)
					if a.Mean < b.Mean {
						verdict += " MET"
					} else {
						verdict += " no"
					}
				}
			}
			fmt.Fprintf(w, "  %-9s %6d -> %-6d verbs %8.1f  bx %8.1f  tcp %8.1f  verbs/tcp %.3f  bx/tcp %.3f  (%s)\n",
				wl, req, resp, vm, xm, tm, vm/tm, xm/tm, verdict)
		}
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// mainOp is the operation a workload's load plot shows.
func mainOp(workload string) string {
	if workload == "incast" {
		return "push"
	}
	return "pull"
}

// writeLoadPlot plots the open-loop runs of one workload: p50 (solid) and
// p99 (dashed) of its main op against the offered steps per second, one
// color per transport. No file without at least one open-loop run.
func writeLoadPlot(dir, name, title string, rs []benchResult) (string, error) {
	op := mainOp(rs[0].Workload)
	p := newLogPlot(title+": "+op+" latency against offered load, open loop", "offered steps per second", op+" latency (us, log)", false)
	n := 0
	for _, tr := range []string{"rdma", "tcp"} {
		var p50, p99 plotter.XYs
		for _, r := range rs {
			if r.Transport != tr || r.Offered == 0 {
				continue
			}
			for _, o := range r.Ops {
				if o.Op == op && o.Count > 0 {
					p50 = append(p50, plotter.XY{X: r.Offered, Y: max(o.P50, 0.001)})
					p99 = append(p99, plotter.XY{X: r.Offered, Y: max(o.P99, 0.001)})
				}
			}
		}
		if len(p50) == 0 {
			continue
		}
		sort.Slice(p50, func(i, j int) bool { return p50[i].X < p50[j].X })
		sort.Slice(p99, func(i, j int) bool { return p99[i].X < p99[j].X })
		for i, pts := range []plotter.XYs{p50, p99} {
			l, sc, err := plotter.NewLinePoints(pts)
			if err != nil {
				return "", err
			}
			l.Color, sc.Color = transportColor[tr], transportColor[tr]
			l.Width = vg.Points(1.5)
			q := "p50"
			if i == 1 {
				l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
				q = "p99"
			}
			p.Add(l, sc)
			p.Legend.Add(tr+" "+q, l, sc)
			n++
		}
	}
	if n == 0 {
		return "", nil
	}
	f := filepath.Join(dir, name)
	padLogAxis(&p.Y)
	return f, p.Save(7*vg.Inch, 4.5*vg.Inch, f)
}

// padLogAxis widens a logarithmic axis whose data is one value (one
// open-loop run with p50 = p99, a histogram of one bucket) to a decade
// each side: gonum pads such a range by 1 either way, which below 1 makes
// it reach 0 or less, and its log ticks panic on that.
func padLogAxis(ax *plot.Axis) {
	if ax.Min > 0 && ax.Min == ax.Max {
		ax.Min, ax.Max = ax.Min/10, math.Min(ax.Max*10, math.MaxFloat64)
	}
}

// newLogPlot is a plot with a grid and a logarithmic x axis (logX, legend
// at the bottom right) or y axis (legend at the top left).
func newLogPlot(title, xLabel, yLabel string, logX bool) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text, p.Y.Label.Text = xLabel, yLabel
	ax := &p.Y
	if logX {
		ax = &p.X
	}
	ax.Scale = plot.LogScale{}
	ax.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = !logX, !logX
	p.Add(plotter.NewGrid())
	return p
}
