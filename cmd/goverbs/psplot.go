package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// goverbs ps report: bench --json results side by side (rdma against tcp
// per workload and operation, with the change in percent), and PNG plots.

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
	for _, f := range files {
		b, err := os.Open(f)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(b)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			var r benchResult
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Transport == "" {
				continue
			}
			rs = append(rs, r)
		}
		b.Close()
	}
	if len(rs) == 0 {
		return fmt.Errorf("no bench results in %v", files)
	}
	rs = mergeRounds(rs)
	printSideBySide(stdout, rs)
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
	type key struct{ w, t string }
	idx := map[key]int{}
	var out []benchResult
	hists := map[key]map[string]*hist{}
	for _, r := range rs {
		k := key{r.Workload, r.Transport}
		i, ok := idx[k]
		if !ok {
			idx[k] = len(out)
			out = append(out, benchResult{Transport: r.Transport, Workload: r.Workload, Workers: r.Workers, Servers: r.Servers})
			hists[k] = map[string]*hist{}
			i = idx[k]
		}
		o := &out[i]
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
				h = newHist()
				hists[k][op.Op] = h
			}
			for _, b := range op.Hist {
				h.C[bucketOf(b[0]-1)] += int64(b[1])
			}
			h.N += op.Count
			h.n = h.N
			h.Sum += op.Mean * 1e3 * float64(op.Count)
		}
	}
	for i := range out {
		o := &out[i]
		k := key{o.Workload, o.Transport}
		var total int64
		for _, h := range hists[k] {
			total += h.N
		}
		for _, name := range []string{"pull", "push"} {
			h := hists[k][name]
			if h == nil || h.N == 0 {
				continue
			}
			op := benchOp{Op: name, Count: h.N, Mean: h.mean() / 1e3, P50: h.quantile(0.5) / 1e3, P99: h.quantile(0.99) / 1e3,
				P999: h.quantile(0.999) / 1e3, OpsPerSec: float64(h.N) / o.Duration, Hist: h.buckets()}
			if total > 0 {
				op.CPUPerKop = o.CPU / (float64(total) / 1000)
			}
			o.Ops = append(o.Ops, op)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Workload < out[j].Workload })
	return out
}

func printSideBySide(w io.Writer, rs []benchResult) {
	printBench(w, rs)
	find := func(wl, tr string) *benchResult {
		for i := range rs {
			if rs[i].Workload == wl && rs[i].Transport == tr {
				return &rs[i]
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
	fmt.Fprintf(w, "%-9s %-4s %9s %9s %9s %9s %11s %10s\n", "workload", "op", "mean", "p50", "p99", "p999", "cpu/op", "rnr(rdma)")
	seen := map[string]bool{}
	for _, r := range rs {
		if seen[r.Workload] {
			continue
		}
		seen[r.Workload] = true
		a, b := find(r.Workload, "rdma"), find(r.Workload, "tcp")
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
					fmt.Fprintf(w, "%-9s %-4s %9s %9s %9s %9s %11s %10s\n", r.Workload, oa.Op, pct(oa.Mean, ob.Mean), pct(oa.P50, ob.P50),
						pct(oa.P99, ob.P99), pct(oa.P999, ob.P999), pct(oa.CPUPerKop, ob.CPUPerKop), rnr)
				}
			}
		}
	}
}

var transportColor = map[string]color.Color{"rdma": color.RGBA{0x1f, 0x77, 0xb4, 0xff}, "tcp": color.RGBA{0xd6, 0x27, 0x28, 0xff}}

// writePlots: per workload a latency CDF (one line per transport and op),
// and one bar chart of P99 per workload and op, rdma next to tcp.
func writePlots(dir string, rs []benchResult) ([]string, error) {
	var written []string
	workloads := map[string][]benchResult{}
	var order []string
	for _, r := range rs {
		if _, ok := workloads[r.Workload]; !ok {
			order = append(order, r.Workload)
		}
		workloads[r.Workload] = append(workloads[r.Workload], r)
	}
	for _, wl := range order {
		p := plot.New()
		p.Title.Text = "ps " + wl + ": latency CDF"
		p.X.Label.Text = "latency (us, log)"
		p.Y.Label.Text = "fraction of operations"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Legend.Top = false
		p.Legend.Left = false
		p.Add(plotter.NewGrid())
		for _, r := range workloads[wl] {
			for i, op := range r.Ops {
				var pts plotter.XYs
				var cum, n uint64
				for _, b := range op.Hist {
					n += b[1]
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
			}
		}
		f := filepath.Join(dir, "cdf-"+wl+".png")
		if err := p.Save(7*vg.Inch, 4.5*vg.Inch, f); err != nil {
			return written, err
		}
		written = append(written, f)
	}
	// P99 bars.
	var labels []string
	vals := map[string]plotter.Values{"rdma": nil, "tcp": nil}
	for _, wl := range order {
		ops := map[string]bool{}
		for _, r := range workloads[wl] {
			for _, o := range r.Ops {
				ops[o.Op] = true
			}
		}
		for _, opn := range []string{"pull", "push"} {
			if !ops[opn] {
				continue
			}
			labels = append(labels, wl+" "+opn)
			for _, tr := range []string{"rdma", "tcp"} {
				v := 0.0
				for _, r := range workloads[wl] {
					if r.Transport != tr {
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
	p.Title.Text = "ps: P99 latency per workload and operation"
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
