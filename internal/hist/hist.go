// Package hist is a fixed-bucket log2 latency histogram with atomic
// counters: Observe allocates nothing and takes no lock, so bx and ps can
// record every call.
package hist

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// Buckets is the number of buckets. Bucket i < Buckets-1 counts durations
// in (Bound(i-1), Bound(i)], with Bound(i) = 2^(10+i) ns (1.024 µs, 2.048
// µs, ... 2^35 ns = 34.4 s); bucket 0 also counts zero and negative
// durations; the last bucket counts everything above 34.4 s.
const Buckets = 27

const minShift = 10

// Bound returns bucket i's inclusive upper bound; the last bucket's (and
// any i out of range) is math.MaxInt64 (+Inf).
func Bound(i int) time.Duration {
	if i < 0 || i >= Buckets-1 {
		return math.MaxInt64
	}
	return time.Duration(1) << (minShift + i)
}

// Index returns the bucket d falls in.
func Index(d time.Duration) int {
	if d <= 1<<minShift {
		return 0
	}
	i := bits.Len64(uint64(d-1)) - minShift
	return min(i, Buckets-1)
}

// Histogram is a snapshot: plain values.
type Histogram struct {
	Count   uint64          // observations: the sum of Buckets
	Sum     time.Duration   // of all observations
	Buckets [Buckets]uint64 // per bucket, not cumulative (see Bound)
}

// Add adds o's counts to h.
func (h *Histogram) Add(o Histogram) {
	if h == nil {
		return
	}
	h.Count += o.Count
	h.Sum += o.Sum
	for i := range h.Buckets {
		h.Buckets[i] += o.Buckets[i]
	}
}

// Quantile estimates the q-quantile (0 <= q <= 1), interpolating linearly
// inside the bucket; 0 without observations. An estimate in the last
// bucket is its lower bound.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h == nil || h.Count == 0 || q < 0 || q > 1 || math.IsNaN(q) {
		return 0
	}
	want := q * float64(h.Count)
	var acc float64
	for i, n := range h.Buckets {
		if n == 0 || acc+float64(n) < want {
			acc += float64(n)
			continue
		}
		lo := time.Duration(0)
		if i > 0 {
			lo = Bound(i - 1)
		}
		if i == Buckets-1 {
			return lo
		}
		return lo + time.Duration(float64(Bound(i)-lo)*(want-acc)/float64(n))
	}
	return Bound(Buckets - 2)
}

// Recorder records durations. The zero value is ready; it is safe for
// concurrent use.
type Recorder struct {
	sum     atomic.Int64
	buckets [Buckets]atomic.Uint64
}

// Observe records one duration.
func (r *Recorder) Observe(d time.Duration) {
	r.buckets[Index(d)].Add(1)
	r.sum.Add(int64(max(d, 0)))
}

// Read returns a snapshot. Under concurrent Observes, Count is consistent
// with Buckets (it is their sum) and Sum may lag or lead by those in
// progress.
func (r *Recorder) Read() Histogram {
	var h Histogram
	for i := range r.buckets {
		h.Buckets[i] = r.buckets[i].Load()
		h.Count += h.Buckets[i]
	}
	h.Sum = time.Duration(r.sum.Load())
	return h
}
