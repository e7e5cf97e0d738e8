package hist

import (
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"time"
)

// This package has three views of a latency distribution, one for each
// use: Recorder/Histogram, fixed log2 buckets with atomic counters that bx
// and ps record every call into and export as Prometheus histograms; Fine,
// the report's histogram (goverbs ps bench: p50, p99, p99.9 and CDFs,
// under 1.6% error); Log2Quantile, quantiles of the power-of-two buckets
// the eBPF probes count in the kernel (goverbs top).

// Fine is a log-bucket latency histogram: values below 128 ns exact, above
// with 64 buckets per power of two (under 1.6% error); the mean is exact.
// It is plain data, JSON-encoded as it is (ps bench's worker processes
// send theirs to the bench), and not safe for concurrent use. The zero
// value (or one decoded without "c") is empty and ready.
type Fine struct {
	C   map[int]int64 `json:"c"` // count per bucket (FineBucket)
	Sum float64       `json:"sum"`
	N   int64         `json:"n"`
}

// fineMaxBucket is the largest bucket.
var fineMaxBucket = FineBucket(math.MaxUint64)

// UnmarshalJSON decodes a Fine as it is encoded, refusing what Add and
// Merge never make (it comes from another process): a bucket outside
// 0..FineBucket(math.MaxUint64), a negative count, counts that overflow or
// do not add up to n, a negative sum.
func (h *Fine) UnmarshalJSON(b []byte) error {
	type plain Fine // without this method
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	var n int64
	for k, c := range p.C {
		switch {
		case k < 0 || k > fineMaxBucket:
			return fmt.Errorf("hist: Fine: bucket %d outside 0..%d", k, fineMaxBucket)
		case c < 0:
			return fmt.Errorf("hist: Fine: bucket %d has a count of %d", k, c)
		case c > math.MaxInt64-n:
			return fmt.Errorf("hist: Fine: the bucket counts overflow")
		}
		n += c
	}
	if p.N != n {
		return fmt.Errorf("hist: Fine: n is %d, the buckets count %d", p.N, n)
	}
	if !(p.Sum >= 0) {
		return fmt.Errorf("hist: Fine: sum %v", p.Sum)
	}
	*h = Fine(p)
	return nil
}

// NewFine returns an empty Fine.
func NewFine() *Fine { return &Fine{C: map[int]int64{}} }

// FineBucket is the bucket of ns nanoseconds.
func FineBucket(ns uint64) int {
	if ns < 128 {
		return int(ns)
	}
	e := bits.Len64(ns) - 7
	return e*64 + int(ns>>e)
}

// FineBucketHigh is a bucket's (exclusive) upper bound in ns.
func FineBucketHigh(b int) float64 {
	if b < 128 {
		return float64(b + 1)
	}
	e := b/64 - 1
	m := b - e*64
	return math.Ldexp(float64(m+1), e) // not (m+1)<<e: 2^64 for ns >= 2^63 wraps to 0
}

// Add counts one duration (a negative one as 0, in the mean too).
func (h *Fine) Add(d time.Duration) {
	d = max(d, 0)
	if h.C == nil {
		h.C = map[int]int64{}
	}
	h.C[FineBucket(uint64(d))]++
	h.N++
	h.Sum += float64(d)
}

// Merge adds o's counts to h; a nil o adds nothing.
func (h *Fine) Merge(o *Fine) {
	if o == nil {
		return
	}
	if h.C == nil && len(o.C) > 0 {
		h.C = map[int]int64{}
	}
	for b, c := range o.C {
		h.C[b] += c
	}
	h.N += o.N
	h.Sum += o.Sum
}

// Mean is the exact mean in ns, 0 when empty.
func (h *Fine) Mean() float64 {
	if h.N == 0 {
		return 0
	}
	return h.Sum / float64(h.N)
}

func (h *Fine) sorted() []int {
	bs := make([]int, 0, len(h.C))
	for b := range h.C {
		bs = append(bs, b)
	}
	slices.Sort(bs)
	return bs
}

// Quantile is the upper bound in ns of the bucket that holds the
// q-quantile, 0 when empty.
func (h *Fine) Quantile(q float64) float64 {
	if h.N == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(h.N)))
	var seen int64
	for _, b := range h.sorted() {
		seen += h.C[b]
		if seen >= rank {
			return FineBucketHigh(b)
		}
	}
	return 0
}

// Buckets lists the non-empty buckets in order as {upper bound in ns,
// count}.
func (h *Fine) Buckets() [][2]uint64 {
	var out [][2]uint64
	for _, b := range h.sorted() {
		out = append(out, [2]uint64{uint64(FineBucketHigh(b)), uint64(h.C[b])})
	}
	return out
}

// Log2Quantile estimates a quantile from power-of-two buckets (bucket i
// holds [2^i, 2^(i+1)) ns, bucket 0 [0, 2)), interpolating inside the
// bucket, as the eBPF probes count them; 0 when empty.
func Log2Quantile(h []uint64, q float64) float64 {
	var total uint64
	for _, v := range h {
		total += v
	}
	if total == 0 {
		return 0
	}
	want := q * float64(total)
	var acc float64
	for i, v := range h {
		if v == 0 {
			continue
		}
		if acc+float64(v) >= want {
			lo := math.Ldexp(1, i) // not 1<<i: from bucket 63 on it wraps to 0
			if i == 0 {
				lo = 0
			}
			hi := math.Ldexp(1, i+1)
			return lo + (hi-lo)*(want-acc)/float64(v)
		}
		acc += float64(v)
	}
	return math.Ldexp(1, len(h))
}
