package ps

import (
	"encoding/binary"
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"
)

// FuzzDecodeResponse: what a client decodes comes from a server, or from
// whoever sits between: decodeResponse and a call's body decoding must
// never panic, write no more rows than the call asked for, allocate
// nothing in proportion to lengths the response claims, wrap ErrMalformed
// in what they reject, and give back an error response as it was
// encoded.
func FuzzDecodeResponse(f *testing.F) {
	srv := &Server{store: NewStore(StoreConfig{MaxBatch: 1024, MaxValues: 1 << 16}), inc: 7}
	srv.store.Define(Spec{Name: "emb", Kind: Sparse, Dim: 2, Rows: 1 << 20, Opt: Optimizer{Kind: SGD, LR: 0.1}})
	srv.store.Define(Spec{Name: "w", Kind: Dense, Size: 3, Opt: Optimizer{Kind: SGD, LR: 0.1}})
	for op, req := range [][]byte{
		mustEncode(EncodePull("emb", 2, []uint64{1, 2, 3})),
		mustEncode(EncodePullDense("w", 3)),
		mustEncode(EncodePush("emb", 2, []uint64{7}, []float32{1, 2})),
		EncodeStats(),
		mustEncode(EncodePull("nope", 2, []uint64{1})), // an error response
	} {
		f.Add(uint8(op), uint8(3), uint8(2), srv.Handle(req, nil))
	}
	f.Add(uint8(0), uint8(3), uint8(2), appendErrResp(nil, 9, errorf(codeDim, "dim %d", 4)))
	f.Add(uint8(0), uint8(1), uint8(1), []byte{1, 200, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, op, nk, dim uint8, resp []byte) {
		k := call{name: "t", dim: int(dim % 16), keys: make([]uint64, nk%32)}
		switch op % 4 {
		case 0:
			k.op = OpPull
			n := len(k.keys) * k.dim
			k.vals = make([]float32, n+1)[:n] // one beyond: a guard
			if nk&32 != 0 && len(k.keys) > 0 {
				k.pos = []int32{int32(len(k.keys) - 1), 0}
			}
		case 1:
			k.op = OpPullDense
			k.vals = make([]float32, k.dim)
		case 2:
			k.op = OpPush
		case 3:
			k.isRaw = true
			k.read = func(body []byte) error { return nil }
		}
		guard := float32(math.Float32frombits(0x7fc0dead))
		if k.op == OpPull {
			k.vals[:len(k.vals)+1][len(k.vals)] = guard
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		k.finish(resp, 3)
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > 4*uint64(len(resp))+16<<10 {
			t.Fatalf("decoding %d bytes allocated %d", len(resp), n)
		}
		if k.op == OpPull && math.Float32bits(k.vals[:len(k.vals)+1][len(k.vals)]) != math.Float32bits(guard) {
			t.Fatalf("wrote beyond the %d rows of dim %d asked for", len(k.keys), k.dim)
		}
		if k.err == nil {
			return
		}
		var se *ServerError
		if errors.As(k.err, &se) {
			if se.Server != 3 {
				t.Fatalf("server %d, want 3", se.Server)
			}
			if len(se.Msg) > 4000 {
				return // more than a server sends (appendErrResp cuts it)
			}
			again, err := decodeResponse(appendErrResp(nil, k.inc, &codeError{code: se.Code, msg: se.Msg}), 3)
			var se2 *ServerError
			if !errors.As(err, &se2) || se2.Code != se.Code || se2.Msg != se.Msg || again.inc != k.inc {
				t.Fatalf("round trip: %+v (inc %#x) became %v (inc %#x)", se, k.inc, err, again.inc)
			}
			return
		}
		if !errors.Is(k.err, ErrMalformed) || !strings.Contains(k.err.Error(), "response") {
			t.Fatalf("error %v: not ErrMalformed, or does not say what", k.err)
		}
		if len(resp) >= respHeader && resp[0] == 0 && k.inc != binary.LittleEndian.Uint64(resp[4:]) {
			t.Fatalf("incarnation %#x, response has %#x", k.inc, binary.LittleEndian.Uint64(resp[4:]))
		}
	})
}
