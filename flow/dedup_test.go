package flow

import (
	"math/rand/v2"
	"testing"
)

func TestDedupTable(t *testing.T) {
	tests := []struct {
		name   string
		window int
		first  uint64
		seqs   []uint64
		want   []Verdict
		next   uint64
	}{
		{"in order", 64, 0,
			[]uint64{0, 1, 2, 3},
			[]Verdict{Deliver, Deliver, Deliver, Deliver}, 4},
		{"resent prefix after recovery", 64, 0,
			[]uint64{0, 1, 2, 3, 1, 2, 3, 4},
			[]Verdict{Deliver, Deliver, Deliver, Deliver, Duplicate, Duplicate, Duplicate, Deliver}, 5},
		{"interleaved across QPs", 64, 10,
			[]uint64{11, 13, 10, 12, 13, 14, 11},
			[]Verdict{Deliver, Deliver, Deliver, Deliver, Duplicate, Deliver, Duplicate}, 15},
		{"window bound", 64, 0,
			[]uint64{64, 63, 0, 64, 1},
			[]Verdict{Ahead, Deliver, Deliver, Deliver, Deliver}, 2},
		{"run across words", 128, 0,
			append(seqRange(1, 130), 0),
			append(fill(Deliver, 127), Ahead, Ahead, Deliver), 128},
		{"rounds up the window", 65, 0,
			[]uint64{127, 128},
			[]Verdict{Deliver, Ahead}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDedup(tt.window, tt.first)
			for i, s := range tt.seqs {
				if got := d.Offer(s); got != tt.want[i] {
					t.Fatalf("Offer(%d) #%d = %v, want %v", s, i, got, tt.want[i])
				}
			}
			if d.Next() != tt.next {
				t.Fatalf("Next = %d, want %d", d.Next(), tt.next)
			}
		})
	}
}

func seqRange(lo, hi uint64) []uint64 {
	var s []uint64
	for i := lo; i < hi; i++ {
		s = append(s, i)
	}
	return s
}

func fill(v Verdict, n int) []Verdict {
	s := make([]Verdict, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// dedupModel is the obvious unbounded reference: a set of delivered
// sequences and the lowest undelivered one.
type dedupModel struct {
	seen map[uint64]bool
	next uint64
	size uint64
}

func (m *dedupModel) offer(s uint64) Verdict {
	switch {
	case s < m.next || m.seen[s]:
		return Duplicate
	case s-m.next >= m.size:
		return Ahead
	}
	m.seen[s] = true
	for m.seen[m.next] {
		delete(m.seen, m.next)
		m.next++
	}
	return Deliver
}

func TestDedupRandomAgainstModel(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		window := 64 << rng.IntN(3)
		d := NewDedup(window, 0)
		m := &dedupModel{seen: map[uint64]bool{}, size: uint64(d.Window())}
		for i := range 20000 {
			// Mostly near the frontier, sometimes old or far ahead.
			s := m.next + uint64(rng.IntN(window+window/4))
			if rng.IntN(5) == 0 && m.next > 0 {
				s = m.next - 1 - uint64(rng.IntN(int(min(m.next, 300))))
			}
			if got, want := d.Offer(s), m.offer(s); got != want {
				t.Fatalf("seed %d op %d: Offer(%d) = %v, model %v (next %d)", seed, i, s, got, want, m.next)
			}
			if d.Next() != m.next {
				t.Fatalf("seed %d op %d: Next %d, model %d", seed, i, d.Next(), m.next)
			}
		}
	}
}
