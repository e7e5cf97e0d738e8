package metrics

import (
	"bytes"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// FuzzScrapedParse: what Scraped reads comes from another process's
// endpoint. parse must not panic or allocate far beyond the text's size,
// every series it keeps is a goverbs_ one with our labels, once each,
// sorted, its own label of one of those names kept as exported_NAME, and
// what it returns encodes in the text format and parses back.
func FuzzScrapedParse(f *testing.F) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "goverbs_test_total", Help: "A test."}, []string{"process", "op"})
	c.WithLabelValues("w1", "pull").Add(3)
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "goverbs_lat_seconds", Help: "Latency.", Buckets: []float64{0.001, 0.01}})
	h.Observe(0.005)
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "other_gauge", Help: "Not ours."})
	reg.MustRegister(c, h, g)
	fams, err := reg.Gather()
	if err != nil {
		f.Fatal(err)
	}
	var all bytes.Buffer
	for _, m := range fams {
		if _, err := expfmt.MetricFamilyToText(&all, m); err != nil {
			f.Fatal(err)
		}
	}
	f.Add(all.Bytes())
	f.Add([]byte("goverbs_x{process=\"a\",exported_process=\"b\"} 1\n"))
	f.Add([]byte("# TYPE goverbs_s summary\ngoverbs_s{quantile=\"0.5\"} NaN\ngoverbs_s_sum +Inf\ngoverbs_s_count 2\n"))
	s := scraped{url: "http://fuzz/metrics", labels: map[string]string{"process": "worker1", "host": "h"}}
	f.Fuzz(func(t *testing.T, text []byte) {
		var out []*dto.MetricFamily
		var err error
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		out, err = s.parse(bytes.NewReader(text))
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > 256*uint64(len(text))+64<<10 {
			t.Fatalf("parsing %d bytes allocated %d", len(text), n)
		}
		if err != nil {
			if !strings.Contains(err.Error(), "scrape http://fuzz/metrics") {
				t.Fatalf("error without the endpoint: %v", err)
			}
			return
		}
		var enc bytes.Buffer
		for _, fam := range out {
			if !strings.HasPrefix(fam.GetName(), "goverbs_") {
				t.Fatalf("kept family %q", fam.GetName())
			}
			for _, m := range fam.Metric {
				names := make([]string, len(m.Label))
				for i, l := range m.Label {
					names[i] = l.GetName()
					if want, ok := s.labels[l.GetName()]; ok && l.GetValue() != want {
						t.Fatalf("%s: label %s=%q, want %q", fam.GetName(), l.GetName(), l.GetValue(), want)
					}
				}
				if !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != len(names) {
					t.Fatalf("%s: labels %q not sorted, or not unique", fam.GetName(), names)
				}
				for k := range s.labels {
					if !slices.Contains(names, k) {
						t.Fatalf("%s: no label %s in %q", fam.GetName(), k, names)
					}
				}
			}
			if _, err := expfmt.MetricFamilyToText(&enc, fam); err != nil {
				t.Fatalf("%s does not encode: %v", fam.GetName(), err)
			}
		}
		again, err := s.parse(bytes.NewReader(enc.Bytes()))
		if err != nil {
			t.Fatalf("our encoding %q does not parse: %v", enc.Bytes(), err)
		}
		if len(again) != len(out) {
			t.Fatalf("%d families became %d", len(out), len(again))
		}
	})
}
