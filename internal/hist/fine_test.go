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
