package ps

import "testing"

// TestRespSize: the bx handler's response buffer is allocated at the
// response's size for a pull (no regrowth while the rows are appended),
// and a request claiming more rows than it could hold does not make the
// server allocate for them.
func TestRespSize(t *testing.T) {
	s := &Server{store: NewStore(StoreConfig{}), inc: 1}
	must(t, s.store.Define(Spec{Name: "t", Kind: Sparse, Dim: 32, Rows: 100, Opt: Optimizer{Kind: SGD, LR: 0.1}}))
	must(t, s.store.Define(Spec{Name: "d", Kind: Dense, Size: 1000, Opt: Optimizer{Kind: SGD, LR: 0.1}}))
	for _, req := range [][]byte{mustEncode(EncodePull("t", 32, []uint64{1, 2, 3})), mustEncode(EncodePullDense("d", 1000))} {
		n := s.respSize(req)
		b := s.Handle(req, make([]byte, 0, n))
		if b[0] != 0 || cap(b) != n || len(b) > n {
			t.Errorf("op %v: response of %d bytes (status %d, cap %d), respSize %d", Op(req[1]), len(b), b[0], cap(b), n)
		}
	}
	bogus := mustEncode(EncodePull("t", 1<<16, []uint64{1}))
	bogus[len(bogus)-12] = 0xff // n: 255 keys claimed, one present
	if n := s.respSize(bogus); n > respHeader+8+64<<10 {
		t.Errorf("a pull claiming %d bytes of rows: respSize %d", 4*255<<16, n)
	}
	if b := s.Handle(bogus, nil); b[0] != 1 {
		t.Errorf("bogus pull answered with status %d", b[0])
	}
}

// TestInitValue: a row's initial values are what they were defined as
// (the per-row and per-column parts split, the scaling a multiplication):
// the formula, spelled out, for a spread of seeds, keys and columns.
func TestInitValue(t *testing.T) {
	ref := func(seed, key uint64, col int) float32 {
		r := mix(seed ^ mix(key+0x9e3779b97f4a7c15) ^ uint64(col)*0xd1b54a32d192ed03)
		return (float32(r>>40)/float32(1<<24) - 0.5) * 0.1
	}
	for _, seed := range []uint64{0, 1, 4, 1 << 63} {
		for _, key := range []uint64{0, 1, 12345, 1<<20 - 1, 1<<64 - 1} {
			for col := range 70 {
				if got, want := initValue(seed, key, col), ref(seed, key, col); got != want {
					t.Fatalf("initValue(%d, %d, %d) = %v, want %v", seed, key, col, got, want)
				}
			}
		}
	}
}
