package bx

import "testing"

// TestSplitDefaults: the parts a payload takes, the default SplitSize
// (fewer parts with fewer credits or a smaller lane window, none below
// 2), and what a peer's grant leaves of it.
func TestSplitDefaults(t *testing.T) {
	for _, c := range []struct {
		credits  int
		laneMsgs int64
		want     int
	}{
		{0, 0, 9*8144 - rndvSize},
		{8, 0, 4*8144 - rndvSize},
		{0, 10, 5*8144 - rndvSize},
		{3, 0, -1},
		{4, 0, 2*8144 - rndvSize},
	} {
		cfg := Config{Device: "x", Token: make([]byte, 16), Credits: c.credits, LaneMsgs: c.laneMsgs}
		if err := cfg.defaults(); err != nil {
			t.Fatalf("credits %d lane msgs %d: %v", c.credits, c.laneMsgs, err)
		}
		if cfg.SplitSize != c.want {
			t.Errorf("credits %d lane msgs %d: SplitSize %d, want %d", c.credits, c.laneMsgs, cfg.SplitSize, c.want)
		}
		if cfg.SplitSize > 0 && cfg.parts(cfg.SplitSize) > int(min(int64(cfg.Credits), cfg.LaneMsgs)/2) {
			t.Errorf("credits %d lane msgs %d: SplitSize %d takes %d parts", c.credits, c.laneMsgs, cfg.SplitSize, cfg.parts(cfg.SplitSize))
		}
	}
	cfg := Config{Device: "x", Token: make([]byte, 16)}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ n, parts int }{
		{8145, 2}, {2*8144 - 8, 2}, {2*8144 - 7, 3}, {65536, 9}, {9*8144 - 8, 9}, {9*8144 - 7, 10},
	} {
		if got := cfg.parts(c.n); got != c.parts {
			t.Errorf("parts(%d) = %d, want %d", c.n, got, c.parts)
		}
		// The parts' shares add up to the payload, each within a buffer.
		rest := c.n
		for i := 0; i < c.parts; i++ {
			k := cfg.partLen(i, rest)
			typ := uint8(typPart)
			if i == 0 {
				typ = typSplit
			}
			if k <= 0 || k+splitHead(typ) > cfg.EagerSize {
				t.Errorf("%d bytes: part %d of %d bytes", c.n, i, k)
			}
			rest -= k
		}
		if rest != 0 {
			t.Errorf("%d bytes: %d left after %d parts", c.n, rest, c.parts)
		}
	}
	for _, c := range []struct {
		grant uint64
		want  int
	}{
		{64, cfg.SplitSize}, {18, cfg.SplitSize}, {17, 8*8144 - rndvSize}, {8, 4*8144 - rndvSize}, {4, 2*8144 - rndvSize}, {3, -1},
	} {
		if got := cfg.splitFor(c.grant); got != c.want {
			t.Errorf("splitFor(grant %d) = %d, want %d", c.grant, got, c.want)
		}
	}
	never := Config{Device: "x", Token: make([]byte, 16), SplitSize: -1}
	if err := never.defaults(); err != nil || never.splitFor(64) != -1 {
		t.Errorf("SplitSize -1: %v, splitFor %d", err, never.splitFor(64))
	}
}
