package hist

import (
	"testing"
	"time"
)

func TestFine(t *testing.T) {
	h := NewFine()
	for i := 1; i <= 1000; i++ {
		h.Add(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct{ q, want float64 }{{0.5, 500e3}, {0.99, 990e3}, {0.999, 999e3}} {
		if got := h.Quantile(c.q); got < c.want || got > c.want*1.02 {
			t.Errorf("quantile %v = %v, want %v (+2%%)", c.q, got, c.want)
		}
	}
	if m := h.Mean(); m != 500.5e3 {
		t.Errorf("mean %v", m)
	}
	for _, ns := range []uint64{0, 1, 127, 128, 129, 1000, 1 << 20, 1<<40 + 12345} {
		if b := FineBucket(ns); FineBucketHigh(b) < float64(ns) || FineBucket(uint64(FineBucketHigh(b))-1) != b {
			t.Errorf("%d ns: bucket %d up to %v", ns, b, FineBucketHigh(b))
		}
	}
	o := NewFine()
	o.Add(2 * time.Second)
	h.Merge(o)
	h.Merge(nil)
	if h.N != 1001 || h.Quantile(1) < 2e9 {
		t.Errorf("after Merge: n %d, max %v", h.N, h.Quantile(1))
	}
	if b := h.Buckets(); len(b) == 0 || b[len(b)-1][1] != 1 {
		t.Errorf("Buckets: %v", b)
	}
	if NewFine().Quantile(0.5) != 0 || NewFine().Mean() != 0 {
		t.Error("empty Fine: nonzero quantile or mean")
	}
}

func TestLog2Quantile(t *testing.T) {
	h := make([]uint64, 40)
	h[10] = 100 // [1024, 2048) ns
	if q := Log2Quantile(h, 0.5); q < 1024 || q >= 2048 {
		t.Errorf("p50 %v", q)
	}
	if q := Log2Quantile(make([]uint64, 40), 0.5); q != 0 {
		t.Errorf("empty p50 %v", q)
	}
}

// TestFineNegativeAndZero: a negative duration counts as 0 in the mean as
// in the buckets, and a zero Fine (one decoded without "c") takes Add and
// Merge instead of panicking on its nil map.
func TestFineNegativeAndZero(t *testing.T) {
	h := NewFine()
	h.Add(-10 * time.Microsecond)
	h.Add(10)
	if m, q := h.Mean(), h.Quantile(0); m != 5 || q != 1 {
		t.Errorf("after Add(-10µs), Add(10ns): mean %v, min bucket %v; want 5, 1 (the negative one as 0)", m, q)
	}
	var z Fine
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("zero Fine: Add panicked: %v", r)
			}
		}()
		z.Add(100)
	}()
	var m Fine
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("zero Fine: Merge panicked: %v", r)
			}
		}()
		m.Merge(h)
	}()
	if z.N != 1 || z.Quantile(1) != 101 || m.N != 2 || m.Quantile(1) != 11 {
		t.Errorf("zero Fines after Add(100), Merge: %+v, %+v", z, m)
	}
}

// TestLog2QuantileTopBuckets: the bounds of buckets 63 and up ([2^63,
// 2^64) ns and beyond) do not wrap to 0.
func TestLog2QuantileTopBuckets(t *testing.T) {
	h := make([]uint64, 64)
	h[63] = 10
	if q := Log2Quantile(h, 0.5); q < 0x1p63 || q >= 0x1p64 {
		t.Errorf("p50 of bucket 63: %v, want in [2^63, 2^64)", q)
	}
	if q := Log2Quantile(h, 2); q < 0x1p63 {
		t.Errorf("quantile past the top: %v, want at least 2^63", q)
	}
}

// TestFineBucketHighTop: the upper bound of the buckets of 2^63 ns and
// more is 2^64, not a shift wrapped to 0.
func TestFineBucketHighTop(t *testing.T) {
	for _, ns := range []uint64{1 << 63, 1<<64 - 1} {
		if hi := FineBucketHigh(FineBucket(ns)); hi < float64(ns) {
			t.Errorf("%d ns: bucket %d up to %v", ns, FineBucket(ns), hi)
		}
	}
}
