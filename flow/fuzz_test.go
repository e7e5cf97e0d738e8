package flow

import (
	"errors"
	"testing"
)

// FuzzCreditsGrant drives Credits with a byte-coded sequence of grants
// (fresh, stale, duplicate, impossible, other epochs), acquisitions and
// resyncs, checking after each step: granted >= consumed, never more
// outstanding than posted, the reserve never used by data, the grant
// monotonic within an epoch, TryAcquire succeeding exactly when enough
// data credits were available.
func FuzzCreditsGrant(f *testing.F) {
	f.Add([]byte{8, 0, 1, 3, 0, 5, 2, 9, 1, 2, 3, 0, 4, 1})
	f.Add([]byte{3, 1, 0, 2, 0, 2, 1, 0, 2, 3, 5, 4, 0, 4})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		posted := uint64(MinGrant + data[0]%14)
		inOrder := data[1]&1 == 1
		c := NewCredits(CreditsConfig{Initial: posted, MaxGrant: posted, InOrderGrants: inOrder})
		for i := 2; i+1 < len(data); i += 2 {
			op, arg := data[i]%6, uint64(data[i+1])
			e0, g0, c0 := c.State()
			avail0 := c.Available()
			switch op {
			case 0, 1: // grant near the frontier, possibly stale or impossible
				cum := c0 + arg%(posted+3)
				epoch := e0
				if arg&0x80 != 0 {
					epoch = e0 + uint32(arg>>5&3) - 1 // older, same or newer
				}
				err := c.Grant(cum, epoch)
				switch {
				case epoch > e0:
					if !errors.Is(err, ErrEpochAhead) {
						t.Fatalf("grant epoch %d > %d: %v", epoch, e0, err)
					}
				case epoch < e0:
					if err != nil {
						t.Fatalf("older-epoch grant: %v", err)
					}
				case cum < g0 && inOrder:
					if !errors.Is(err, ErrGrantBackwards) {
						t.Fatalf("backwards grant %d < %d: %v", cum, g0, err)
					}
				case cum > g0 && cum-c0 > posted:
					if !errors.Is(err, ErrImpossibleGrant) {
						t.Fatalf("impossible grant %d (consumed %d, posted %d): %v", cum, c0, posted, err)
					}
				case err != nil:
					t.Fatalf("grant %d epoch %d: %v", cum, epoch, err)
				}
			case 2, 3:
				n := arg % 6
				ok := c.TryAcquire(n)
				if ok != (avail0 >= n) {
					t.Fatalf("TryAcquire(%d) = %v with %d available", n, ok, avail0)
				}
				if _, _, c1 := c.State(); ok && c1 != c0+n || !ok && c1 != c0 {
					t.Fatalf("TryAcquire(%d) = %v moved consumed %d -> %d", n, ok, c0, c1)
				}
			case 4:
				ok := c.TryAcquireControl()
				if ok != (g0 > c0) {
					t.Fatalf("TryAcquireControl = %v with %d of %d consumed", ok, c0, g0)
				}
			case 5:
				lost := arg % 4
				seen := c0 - min(c0, lost)
				if err := c.Resync(e0+1, seen+(g0-c0), seen); err != nil {
					t.Fatalf("resync: %v", err)
				}
			}
			e1, g1, c1 := c.State()
			if g1 < c1 || g1-c1 > posted {
				t.Fatalf("op %d: granted %d consumed %d posted %d", op, g1, c1, posted)
			}
			if e1 == e0 && g1 < g0 {
				t.Fatalf("op %d: grant went backwards %d -> %d", op, g0, g1)
			}
			if e1 < e0 {
				t.Fatalf("op %d: epoch went backwards %d -> %d", op, e0, e1)
			}
			if a := c.Available(); a+ControlReserve > posted {
				t.Fatalf("op %d: %d available + reserve > %d posted", op, a, posted)
			}
		}
	})
}

// FuzzDedup compares Dedup with an unbounded reference on sequences coded
// as signed offsets from the lowest undelivered one.
func FuzzDedup(f *testing.F) {
	f.Add([]byte{0, 0, 1, 2, 3, 1, 2, 4, 200, 5})
	f.Add([]byte{1, 5, 3, 1, 0, 2, 4, 130, 127, 64, 63})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		d := NewDedup(64<<(data[0]%3), 1000)
		m := &dedupModel{seen: map[uint64]bool{}, next: 1000, size: uint64(d.Window())}
		for i, b := range data[1:] {
			seq := m.next + uint64(b)
			if b >= 224 { // the last 32 codes reach back below the frontier
				seq = m.next - uint64(b-223)
			} else if b >= 192 {
				seq = m.next + uint64(d.Window()) + uint64(b-192) - 16 // around the window edge
			}
			if got, want := d.Offer(seq), m.offer(seq); got != want {
				t.Fatalf("op %d: Offer(%d) = %v, model %v", i, seq, got, want)
			}
			if d.Next() != m.next {
				t.Fatalf("op %d: Next %d, model %d", i, d.Next(), m.next)
			}
		}
	})
}
