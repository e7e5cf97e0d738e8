package main

import (
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hist"
)

// FuzzWorkerResult: ps bench reads its worker processes' lines (progress
// and the result, JSON) and merges the results into its report. Decoding
// as psBencher.wait does, then psBencher.result and printBench, must not
// panic; a report's percentiles are ordered, its histogram counts what
// its count says, and it encodes as --json prints it.
func FuzzWorkerResult(f *testing.F) {
	h := hist.NewFine()
	for _, d := range []time.Duration{3 * time.Microsecond, 40 * time.Microsecond, time.Millisecond} {
		h.Add(d)
	}
	for _, m := range []map[string]any{
		{"result": workerResult{Pull: h, Push: hist.NewFine(), CPUns: 5e8, Wallns: 1e9, Steps: 3}},
		{"result": workerResult{Pull: hist.NewFine(), Push: h, Wallns: 1e9, Errors: 2, FirstErr: "ps: boom", Steps: 3, Late: 1}},
		{"progress": 12},
	} {
		b, err := json.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"result":{"Pull":{"c":{"-5":3,"5000":-2},"sum":-1,"n":1},"Wallns":1}}`))
	f.Add([]byte(`{"result":{"Pull":{"c":{"5":1},"sum":1,"n":3},"Wallns":1}}`))
	f.Add([]byte(`{"result":{"Pull":{"c":{"5":1},"sum":1,"n":1},"Wallns":0}}`)) // ops in no time: +Inf ops/s
	f.Fuzz(func(t *testing.T, line []byte) {
		var m struct {
			Progress *int64
			Result   *workerResult
		}
		if json.Unmarshal(line, &m) != nil || m.Result == nil {
			return
		}
		b := &psBencher{o: &psBenchOpts{transport: "tcp", workload: "inference", workers: 1, procs: 1, duration: time.Second}, stderr: io.Discard}
		res, err := b.result(0, []*wproc{{res: m.Result}}, nil, nil, nil, nil)
		if err != nil {
			return
		}
		for _, op := range res.Ops {
			if !(op.P50 <= op.P99 && op.P99 <= op.P999) {
				t.Fatalf("%s: p50 %v, p99 %v, p99.9 %v", op.Op, op.P50, op.P99, op.P999)
			}
			var n uint64
			for _, b := range op.Hist {
				n += b[1]
			}
			if n != uint64(op.Count) {
				t.Fatalf("%s: %d counted, the histogram has %d", op.Op, op.Count, n)
			}
		}
		printBench(io.Discard, []benchResult{res})
		// (A report of operations in no time, a rate of +Inf, is refused
		// by result.)
		if _, err := json.Marshal(res); err != nil {
			t.Fatalf("%+v does not encode: %v", res, err)
		}
	})
}
