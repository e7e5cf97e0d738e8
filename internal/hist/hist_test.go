package hist

import (
	"math"
	"sync"
	"testing"
	"time"
)

func TestIndexBound(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want int
	}{
		{-5, 0}, {0, 0}, {1, 0}, {1024, 0}, {1025, 1}, {2048, 1}, {2049, 2},
		{time.Millisecond, 10}, // 2^19 < 1e6 <= 2^20 ns
		{1 << 35, Buckets - 2}, {1<<35 + 1, Buckets - 1}, {math.MaxInt64, Buckets - 1},
	} {
		if got := Index(tt.d); got != tt.want {
			t.Errorf("Index(%d) = %d, want %d", tt.d, got, tt.want)
		}
	}
	for i := range Buckets - 1 {
		if b := Bound(i); Index(b) != i || Index(b+1) != i+1 {
			t.Errorf("bucket %d: bound %v lands in %d, bound+1 in %d", i, b, Index(b), Index(b+1))
		}
	}
	if Bound(Buckets-1) != math.MaxInt64 || Bound(-1) != math.MaxInt64 {
		t.Error("last bound is not +Inf")
	}
}

func TestRecorder(t *testing.T) {
	var r Recorder
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				r.Observe(time.Duration(g*1000+i) * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	h := r.Read()
	if h.Count != 4000 {
		t.Fatalf("count %d", h.Count)
	}
	var sum time.Duration
	for i := range 4000 {
		sum += time.Duration(i) * time.Microsecond
	}
	if h.Sum != sum {
		t.Fatalf("sum %v, want %v", h.Sum, sum)
	}
	// Uniform on [0, 4 ms): the median is near 2 ms, within a bucket.
	if q := h.Quantile(0.5); q < 1048576 || q > 2097152 {
		t.Errorf("p50 %v", q)
	}
	var h2 Histogram
	h2.Add(h)
	h2.Add(h)
	if h2.Count != 8000 || h2.Sum != 2*sum || h2.Quantile(0.5) != h.Quantile(0.5) {
		t.Errorf("Add: %+v", h2)
	}
	if (&Histogram{}).Quantile(0.5) != 0 || h.Quantile(2) != 0 {
		t.Error("quantile of nothing, or out of range, is not 0")
	}
}

func TestObserveAllocs(t *testing.T) {
	var r Recorder
	if a := testing.AllocsPerRun(1000, func() { r.Observe(3 * time.Microsecond) }); a != 0 {
		t.Fatalf("%v allocs", a)
	}
}
