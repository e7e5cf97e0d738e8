package hist

import (
	"encoding/json"
	"maps"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"
)

// FuzzFineJSON: ps bench's worker processes send their Fine as JSON, and
// the bench merges and reports what it decodes: bucket keys outside the
// range FineBucket gives, negative or overflowing counts, an N that
// disagrees with the counts. Decoding, Merge, Mean, Quantile and Buckets
// must not panic, loop or allocate beyond the input's size, a quantile is
// 0 or the bound of a bucket the histogram has, and what decodes encodes
// back to the same histogram.
func FuzzFineJSON(f *testing.F) {
	h := NewFine()
	for _, d := range []time.Duration{0, 1, 127, 128, 1000, time.Millisecond, time.Second, math.MaxInt64} {
		h.Add(d)
	}
	for _, x := range []*Fine{h, NewFine(), {}} {
		b, err := json.Marshal(x)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"c":{"-5":3,"99999999":-2,"4096":9223372036854775807},"sum":-1e308,"n":-3}`))
	f.Add([]byte(`{"c":{"5":1},"n":3,"sum":1}`)) // n beyond the counts: Quantile(1) was 0
	f.Add([]byte(`{"c":{"9223372036854775807":1,"-9223372036854775808":1},"sum":1e308,"n":2}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Fine
		var err error
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err = json.Unmarshal(b, &h)
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > 64*uint64(len(b))+16<<10 {
			t.Fatalf("decoding %d bytes allocated %d", len(b), n)
		}
		if err != nil {
			if !strings.Contains(err.Error(), "hist: Fine: ") && !strings.HasPrefix(err.Error(), "json: ") && !strings.Contains(err.Error(), "JSON") && !strings.Contains(err.Error(), "invalid character") && !strings.Contains(err.Error(), "unexpected end") {
				t.Fatalf("error does not say what: %v", err)
			}
			return
		}
		if m := h.Mean(); !(m >= 0) {
			t.Fatalf("mean %v", m)
		}
		bounds := map[float64]bool{0: true}
		for k := range h.C {
			bounds[FineBucketHigh(k)] = true
		}
		last := 0.0
		for _, q := range []float64{0, 0.001, 0.5, 0.99, 0.999, 1} {
			v := h.Quantile(q)
			if !bounds[v] || v < last || h.N > 0 && q > 0 && v == 0 {
				t.Fatalf("%+v: Quantile(%v) = %v after %v", h, q, v, last)
			}
			last = v
		}
		for _, q := range []float64{math.NaN(), -1, 2} {
			h.Quantile(q)
		}
		var total uint64
		for _, b := range h.Buckets() {
			total += b[1]
		}
		if total != uint64(h.N) {
			t.Fatalf("%+v: the buckets count %d", h, total)
		}
		var m Fine
		m.Merge(&h)
		m.Merge(nil)
		if m.N != h.N || len(m.C) != len(h.C) {
			t.Fatalf("merged into an empty one: %+v became %+v", h, m)
		}
		enc, err := json.Marshal(&h)
		if err != nil {
			if math.IsNaN(h.Sum) || math.IsInf(h.Sum, 0) {
				return
			}
			t.Fatalf("%+v does not encode: %v", h, err)
		}
		var again Fine
		if err := json.Unmarshal(enc, &again); err != nil {
			t.Fatalf("%s does not decode: %v", enc, err)
		}
		if again.N != h.N || again.Sum != h.Sum || !maps.Equal(again.C, h.C) && len(again.C)+len(h.C) > 0 {
			t.Fatalf("round trip: %+v became %+v", h, again)
		}
	})
}
