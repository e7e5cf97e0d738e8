package flow

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestZeroAllocs pins the fast paths at zero allocations.
func TestZeroAllocs(t *testing.T) {
	ctx := context.Background()
	c := NewCredits(CreditsConfig{Initial: 1 << 40})
	r, _ := NewReturner(ReturnerConfig{Grant: 1 << 40})
	root := NewWindow(Limits{Msgs: 64, Bytes: 1 << 20})
	q := root.NewChild(Limits{Msgs: 16})
	d := NewDedup(64, 0)
	now := time.Unix(0, 0)
	var seq uint64
	cum := uint64(1 << 40)
	for name, fn := range map[string]func(){
		"Credits.TryAcquire":   func() { c.TryAcquire(1) },
		"Credits.Acquire":      func() { _ = c.Acquire(ctx, 1) },
		"Credits.Grant":        func() { cum++; _ = c.Grant(cum, 0) },
		"Window.TryRelease":    func() { q.TryAcquire(100); _ = q.Release(100) },
		"Window.AcqRelease":    func() { _ = q.Acquire(ctx, 100); _ = q.Release(100) },
		"Returner":             func() { _ = r.Consumed(1); _ = r.Released(1); r.Piggyback(); r.NeedsUpdate(now) },
		"Dedup.Accept":         func() { d.Accept(seq); seq++ },
		"Dedup.Accept reorder": func() { d.Accept(seq + 1); d.Accept(seq); seq += 2 },
	} {
		if a := testing.AllocsPerRun(1000, fn); a != 0 {
			t.Errorf("%s: %v allocs/op", name, a)
		}
	}
}

func BenchmarkCreditsTryAcquire(b *testing.B) {
	c := NewCredits(CreditsConfig{Initial: 1 << 62})
	b.ReportAllocs()
	for b.Loop() {
		c.TryAcquire(1)
	}
}

// BenchmarkCreditsCycle: take a credit, get it back in a grant.
func BenchmarkCreditsCycle(b *testing.B) {
	c := NewCredits(CreditsConfig{Initial: 64, MaxGrant: 64, InOrderGrants: true})
	cum := uint64(64)
	b.ReportAllocs()
	for b.Loop() {
		if !c.TryAcquire(1) {
			b.Fatal("no credit")
		}
		cum++
		if err := c.Grant(cum, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCreditsAcquireParallel(b *testing.B) {
	c := NewCredits(CreditsConfig{Initial: 1 << 62})
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := c.Acquire(ctx, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCreditsContended: parallel senders against a small pool that a
// granter refills; includes the blocking path.
func BenchmarkCreditsContended(b *testing.B) {
	c := NewCredits(CreditsConfig{Initial: 17, MaxGrant: 17})
	ctx := context.Background()
	var cum atomic.Uint64
	cum.Store(17)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := c.Acquire(ctx, 1); err != nil {
				b.Fatal(err)
			}
			_ = c.Grant(cum.Add(1), 0) // reordered grants are stale, the larger wins
		}
	})
}

func BenchmarkWindowTryRelease(b *testing.B) {
	root := NewWindow(Limits{Msgs: 64, Bytes: 1 << 20})
	q := root.NewChild(Limits{Msgs: 16, Bytes: 1 << 18})
	b.ReportAllocs()
	for b.Loop() {
		if !q.TryAcquire(4096) {
			b.Fatal("window full")
		}
		if err := q.Release(4096); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWindowParallel(b *testing.B) {
	root := NewWindow(Limits{Msgs: 1 << 20, Bytes: 1 << 40})
	var qs [8]*Window
	for i := range qs {
		qs[i] = root.NewChild(Limits{Msgs: 1 << 16})
	}
	var next atomic.Uint32
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		q := qs[next.Add(1)%uint32(len(qs))]
		for pb.Next() {
			if err := q.Acquire(ctx, 4096); err != nil {
				b.Fatal(err)
			}
			if err := q.Release(4096); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkReturner(b *testing.B) {
	r, _ := NewReturner(ReturnerConfig{Grant: 64})
	now := time.Unix(0, 0)
	b.ReportAllocs()
	for b.Loop() {
		_ = r.Consumed(1)
		_ = r.Released(1)
		r.NeedsUpdate(now)
		r.Piggyback()
	}
}

func BenchmarkDedupInOrder(b *testing.B) {
	d := NewDedup(64, 0)
	var seq uint64
	b.ReportAllocs()
	for b.Loop() {
		d.Accept(seq)
		seq++
	}
}

func BenchmarkDedupReordered(b *testing.B) {
	d := NewDedup(256, 0)
	var seq uint64
	b.ReportAllocs()
	for b.Loop() {
		// Two QPs: 8 messages of one arrive before the 8 of the other.
		for i := uint64(1); i < 16; i += 2 {
			d.Accept(seq + i)
		}
		for i := uint64(0); i < 16; i += 2 {
			d.Accept(seq + i)
		}
		seq += 16
	}
}
