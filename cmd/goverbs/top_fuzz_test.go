package main

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzTopMetrics: goverbs top's samples come from another process's
// metrics endpoint, two scrapes an interval apart. topMetrics (its
// histogram quantiles, splitLabels) must not panic on any names or
// values, and gives a histogram's p50 and p99 together.
func FuzzTopMetrics(f *testing.F) {
	f.Add([]byte("goverbs_ops_total{op=\"pull\"} 10\ngoverbs_lat_seconds_bucket{op=\"pull\",le=\"0.001\"} 1\ngoverbs_lat_seconds_bucket{op=\"pull\",le=\"+Inf\"} 2\ngoverbs_lat_seconds_count{op=\"pull\"} 2\n"),
		[]byte("goverbs_ops_total{op=\"pull\"} 20\ngoverbs_lat_seconds_bucket{op=\"pull\",le=\"0.001\"} 5\ngoverbs_lat_seconds_bucket{op=\"pull\",le=\"+Inf\"} 9\ngoverbs_lat_seconds_count{op=\"pull\"} 9\n"), 1.0)
	f.Add([]byte(""), []byte("goverbs_x_bucket{le=\"NaN\",a=\"b\\\"\"} NaN\ngoverbs_x_bucket{le=\"1\\\"} -Inf\ngoverbs_x_bucket{} 1\n"), 0.0)
	f.Fuzz(func(t *testing.T, prev, cur []byte, secs float64) {
		pm, _ := topSamples(bytes.NewReader(prev)) // what it read before an error
		cm, _ := topSamples(bytes.NewReader(cur))
		out := topMetrics(pm, cm, secs)
		names := map[string]bool{}
		for _, m := range out {
			names[m.Name] = true
		}
		for n := range names {
			if i := strings.Index(n, "_p50{"); i >= 0 && !names[n[:i]+"_p99"+n[i+4:]] {
				t.Fatalf("%s without its p99 in %v", n, names)
			}
		}
	})
}
