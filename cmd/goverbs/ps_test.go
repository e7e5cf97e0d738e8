package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/rxetest"
)

func TestPSHist(t *testing.T) {
	h := newHist()
	for i := 1; i <= 1000; i++ {
		h.add(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct{ q, want float64 }{{0.5, 500e3}, {0.99, 990e3}, {0.999, 999e3}} {
		if got := h.quantile(c.q); got < c.want || got > c.want*1.02 {
			t.Errorf("quantile %v = %v, want %v (+2%%)", c.q, got, c.want)
		}
	}
	if m := h.mean(); m != 500.5e3 {
		t.Errorf("mean %v", m)
	}
	for _, ns := range []uint64{0, 1, 127, 128, 129, 1000, 1 << 20, 1<<40 + 12345} {
		if b := bucketOf(ns); bucketHigh(b) < float64(ns) || bucketOf(uint64(bucketHigh(b))-1) != b {
			t.Errorf("%d ns: bucket %d up to %v", ns, b, bucketHigh(b))
		}
	}
}

// TestPSBench runs the bench end to end (servers and workers as child
// processes) for each transport this machine has, and the report on its
// output.
func TestPSBench(t *testing.T) {
	transports := []string{"tcp"}
	if len(rxetest.Active(t)) >= 2 {
		transports = append(transports, "rdma")
	}
	dir := t.TempDir()
	var files []string
	for _, tr := range transports {
		for _, wl := range []string{"inference", "training", "incast"} {
			r := goverbs(t, 90*time.Second, "ps", "bench", "--transport", tr, "--workload", wl, "--workers", "2", "--duration", "1s", "--json")
			if r.code != 0 {
				t.Fatalf("%s %s: exit %d: %s %s", tr, wl, r.code, r.stdout, r.stderr)
			}
			var res benchResult
			if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
				t.Fatalf("%s %s: %v: %q", tr, wl, err, r.stdout)
			}
			if res.Transport != tr || res.Workload != wl || len(res.Ops) == 0 || res.Errors != 0 {
				t.Fatalf("%s %s: %+v", tr, wl, res)
			}
			for _, o := range res.Ops {
				if o.Count == 0 || o.Mean <= 0 || o.P50 > o.P99 || o.P99 > o.P999 || o.OpsPerSec <= 0 || o.CPUPerKop <= 0 {
					t.Errorf("%s %s %s: %+v", tr, wl, o.Op, o)
				}
			}
			if tr == "rdma" && (res.RNR == nil || *res.RNR != 0) {
				t.Errorf("rdma %s: RNR NAK retries %v", wl, res.RNR)
			}
			f := filepath.Join(dir, tr+"-"+wl+".json")
			os.WriteFile(f, []byte(r.stdout), 0o644)
			files = append(files, f)
		}
	}
	r := goverbs(t, 60*time.Second, append([]string{"ps", "report", "--plots", dir}, files...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "inference") {
		t.Fatalf("report: %d %s %s", r.code, r.stdout, r.stderr)
	}
	for _, p := range []string{"p99.png", "cdf-inference.png", "cdf-incast.png"} {
		if st, err := os.Stat(filepath.Join(dir, p)); err != nil || st.Size() < 1000 {
			t.Errorf("plot %s: %v", p, err)
		}
	}
}

func TestPSUsage(t *testing.T) {
	for _, args := range [][]string{{"ps"}, {"ps", "nope"}, {"ps", "bench", "--transport", "udp"}, {"ps", "bench", "--workload", "x"}, {"ps", "serve"}} {
		if r := goverbs(t, 20*time.Second, args...); r.code != 1 {
			t.Errorf("%v: exit %d, want 1: %s", args, r.code, r.stderr)
		}
	}
}
