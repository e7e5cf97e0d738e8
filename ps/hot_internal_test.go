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
	for _, req := range [][]byte{EncodePull("t", 32, []uint64{1, 2, 3}), EncodePullDense("d", 1000)} {
		n := s.respSize(req)
		b := s.Handle(req, make([]byte, 0, n))
		if b[0] != 0 || cap(b) != n || len(b) > n {
			t.Errorf("op %v: response of %d bytes (status %d, cap %d), respSize %d", Op(req[1]), len(b), b[0], cap(b), n)
		}
	}
	bogus := EncodePull("t", 1<<16, []uint64{1})
	bogus[len(bogus)-12] = 0xff // n: 255 keys claimed, one present
	if n := s.respSize(bogus); n > respHeader+8+64<<10 {
		t.Errorf("a pull claiming %d bytes of rows: respSize %d", 4*255<<16, n)
	}
	if b := s.Handle(bogus, nil); b[0] != 1 {
		t.Errorf("bogus pull answered with status %d", b[0])
	}
}
