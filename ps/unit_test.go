package ps

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
)

func TestRingPlacement(t *testing.T) {
	r := NewRing(4, 0)
	counts := make([]int, 4)
	for k := range uint64(100000) {
		counts[r.Key("emb", k)]++
	}
	for s, c := range counts {
		if c < 15000 || c > 35000 {
			t.Errorf("server %d holds %d of 100000 keys: ring badly balanced %v", s, c, counts)
		}
	}
	// Adding a server moves about 1/5 of the keys, all of them to it.
	r5 := NewRing(5, 0)
	moved := 0
	for k := range uint64(100000) {
		a, b := r.Key("emb", k), r5.Key("emb", k)
		if a != b {
			moved++
			if b != 4 {
				t.Fatalf("key %d moved from %d to %d, not to the new server", k, a, b)
			}
		}
	}
	if moved < 10000 || moved > 30000 {
		t.Errorf("%d of 100000 keys moved when adding a fifth server, want about 20000", moved)
	}
	if NewRing(1, 0).Tensor("x") != 0 {
		t.Error("one server must own everything")
	}
}

func TestOptimizers(t *testing.T) {
	s := NewStore(StoreConfig{})
	must(t, s.Define(Spec{Name: "sgd", Kind: Sparse, Dim: 2, Rows: 10, Opt: Optimizer{Kind: SGD, LR: 0.5}, Seed: 1}))
	must(t, s.Define(Spec{Name: "ada", Kind: Sparse, Dim: 2, Rows: 10, Opt: Optimizer{Kind: Adagrad, LR: 0.5, Eps: 1e-8, InitAcc: 0.25}, Seed: 2}))
	must(t, s.Define(Spec{Name: "d", Kind: Dense, Size: 5000, Opt: Optimizer{Kind: SGD, LR: 1}, Seed: 3}))
	w0 := initValue(1, 3, 0)
	if _, _, err := s.Push("sgd", []uint64{3}, []float32{2, 4}); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, 2)
	must(t, s.Pull("sgd", []uint64{3}, out))
	if out[0] != w0-0.5*2 || out[1] != initValue(1, 3, 1)-0.5*4 {
		t.Errorf("sgd row %v", out)
	}
	a0 := initValue(2, 7, 0)
	if _, _, err := s.Push("ada", []uint64{7}, []float32{2, 0}); err != nil {
		t.Fatal(err)
	}
	must(t, s.Pull("ada", []uint64{7}, out))
	h := float32(0.25 + 4)
	if want := a0 - 0.5*2/(float32(math.Sqrt(float64(h)))+1e-8); out[0] != want {
		t.Errorf("adagrad w = %v, want %v", out[0], want)
	}
	if out[1] != initValue(2, 7, 1) {
		t.Errorf("zero gradient moved w to %v", out[1])
	}
	g := make([]float32, 5000)
	g[4999] = 1
	if a, _, err := s.PushDense("d", g); err != nil || a != 2 {
		t.Fatalf("dense push: %d chunks, %v", a, err)
	}
	d := make([]float32, 5000)
	must(t, s.PullDense("d", d))
	if d[4999] != initValue(3, 0, 4999)-1 || d[0] != initValue(3, 0, 0) {
		t.Errorf("dense after push: %v %v", d[0], d[4999])
	}
}

func TestStoreErrors(t *testing.T) {
	s := NewStore(StoreConfig{MaxBatch: 4})
	must(t, s.Define(Spec{Name: "e", Kind: Sparse, Dim: 2, Rows: 10, Opt: Optimizer{Kind: SGD, LR: 0.1}}))
	cases := []struct {
		name string
		err  error
		run  func() error
	}{
		{"unknown key", ErrUnknownKey, func() error { return s.Pull("e", []uint64{10}, make([]float32, 2)) }},
		{"unknown table", ErrUnknownParam, func() error { return s.Pull("nope", []uint64{1}, make([]float32, 2)) }},
		{"wrong dim", ErrDim, func() error { return s.Pull("e", []uint64{1}, make([]float32, 3)) }},
		{"batch", ErrTooLarge, func() error { return s.Pull("e", []uint64{1, 2, 3, 4, 5}, make([]float32, 10)) }},
		{"nan", ErrNaN, func() error { _, _, err := s.Push("e", []uint64{1}, []float32{float32(math.NaN()), 0}); return err }},
		{"inf", ErrNaN, func() error { _, _, err := s.Push("e", []uint64{1}, []float32{0, float32(math.Inf(1))}); return err }},
		{"conflict", ErrConflict, func() error {
			return s.Define(Spec{Name: "e", Kind: Sparse, Dim: 3, Rows: 10, Opt: Optimizer{Kind: SGD, LR: 0.1}})
		}},
		{"bad spec", ErrMalformed, func() error { return s.Define(Spec{Name: "x", Kind: Sparse, Rows: 10, Opt: Optimizer{Kind: SGD}}) }},
	}
	for _, c := range cases {
		if err := c.run(); !errors.Is(err, c.err) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.err)
		}
	}
	skip := NewStore(StoreConfig{NaN: NaNSkip})
	must(t, skip.Define(Spec{Name: "e", Kind: Sparse, Dim: 1, Rows: 10, Opt: Optimizer{Kind: SGD, LR: 1}}))
	a, k, err := skip.Push("e", []uint64{1, 2}, []float32{float32(math.NaN()), 1})
	if err != nil || a != 1 || k != 1 {
		t.Errorf("skip policy: applied %d skipped %d err %v", a, k, err)
	}
}

func TestProtoRoundTrip(t *testing.T) {
	s := NewStore(StoreConfig{})
	srv := &Server{store: s, inc: 42}
	spec := Spec{Name: "e", Kind: Sparse, Dim: 3, Rows: 100, Opt: Optimizer{Kind: Adagrad, LR: 0.1, Eps: 1e-6, InitAcc: 0.1}, Seed: 9}
	r, err := DecodeRequest(mustEncode(EncodeDefine(spec)))
	if err != nil || r.Spec != spec {
		t.Fatalf("define round trip: %+v %v", r.Spec, err)
	}
	if _, err := decodeResponse(srv.Handle(mustEncode(EncodeDefine(spec)), nil), 0); err != nil {
		t.Fatal(err)
	}
	resp, err := decodeResponse(srv.Handle(mustEncode(EncodePush("e", 3, []uint64{5, 6}, []float32{1, 2, 3, 4, 5, 6})), nil), 0)
	if err != nil || resp.inc != 42 || len(resp.body) != 8 {
		t.Fatalf("push: %+v %v", resp, err)
	}
	resp, err = decodeResponse(srv.Handle(mustEncode(EncodePull("e", 3, []uint64{5, 6, 7})), nil), 0)
	if err != nil || len(resp.body) != 8+4*9 {
		t.Fatalf("pull: %v", err)
	}
	got := make([]float32, 9)
	getFloats(got, resp.body[8:])
	want := make([]float32, 9)
	must(t, s.Pull("e", []uint64{5, 6, 7}, want))
	if got != nil && got[8] != want[8] || got[0] != want[0] {
		t.Errorf("pull over the protocol %v, store %v", got, want)
	}
	_, err = decodeResponse(srv.Handle(mustEncode(EncodePull("e", 4, []uint64{5})), nil), 3)
	var se *ServerError
	if !errors.As(err, &se) || se.Server != 3 || !errors.Is(err, ErrDim) {
		t.Errorf("wrong dim over the protocol: %v", err)
	}
	for _, bad := range [][]byte{nil, {1}, {2, 1, 0, 0}, {1, 99, 0, 0}, {1, 1, 0, 5, 'a'}, mustEncode(EncodePull("e", 3, []uint64{1}))[:10]} {
		if _, err := DecodeRequest(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("decode %x: %v", bad, err)
		}
		if _, err := decodeResponse(srv.Handle(bad, nil), 0); !errors.Is(err, ErrMalformed) {
			t.Errorf("serve %x: %v", bad, err)
		}
	}
}

// seedRequests are the fuzz seed corpus (also under testdata/fuzz).
func seedRequests() [][]byte {
	return [][]byte{
		mustEncode(EncodePull("emb", 8, []uint64{1, 2, 3})),
		mustEncode(EncodePush("emb", 2, []uint64{7}, []float32{1, 2})),
		mustEncode(EncodePullDense("w", 16)),
		mustEncode(EncodePushDense("w", []float32{1, 2, 3})),
		mustEncode(EncodeDefine(Spec{Name: "emb", Kind: Sparse, Dim: 8, Rows: 1 << 20, Opt: Optimizer{Kind: Adagrad, LR: 0.1, Eps: 1e-6}})),
		EncodeStats(),
		{1, 1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f},
	}
}

func FuzzDecodeRequest(f *testing.F) {
	for _, s := range seedRequests() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRequest(b)
		if err != nil {
			return
		}
		// A request that decodes is served without a panic, and answers
		// something that decodes.
		for i := 0; i < r.N && r.keys != nil; i++ {
			r.Key(i)
		}
		for i := 0; i < r.NumFloats(); i++ {
			r.Float(i)
		}
		srv := &Server{store: NewStore(StoreConfig{MaxBatch: 1024, MaxValues: 1 << 16}), inc: 1}
		srv.store.Define(Spec{Name: "emb", Kind: Sparse, Dim: 8, Rows: 1 << 20, Opt: Optimizer{Kind: SGD, LR: 0.1}})
		srv.store.Define(Spec{Name: "w", Kind: Dense, Size: 16, Opt: Optimizer{Kind: Adagrad, LR: 0.1, Eps: 1e-6}})
		if _, err := decodeResponse(srv.Handle(b, nil), 0); err != nil {
			var se *ServerError
			if !errors.As(err, &se) {
				t.Fatalf("response does not decode: %v", err)
			}
		}
	})
}

// TestFuzzCorpus keeps testdata/fuzz/FuzzDecodeRequest in step with
// seedRequests (PS_WRITE_CORPUS=1 rewrites it).
func TestFuzzCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeRequest")
	if os.Getenv("PS_WRITE_CORPUS") == "1" {
		os.MkdirAll(dir, 0o755)
		for i, s := range seedRequests() {
			body := "go test fuzz v1\n[]byte(" + quote(s) + ")\n"
			must(t, os.WriteFile(filepath.Join(dir, "seed"+string(rune('0'+i))), []byte(body), 0o644))
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) < len(seedRequests()) {
		t.Fatalf("seed corpus %s: %d files, %v (PS_WRITE_CORPUS=1 go test -run TestFuzzCorpus ./ps writes it)", dir, len(ents), err)
	}
}

func quote(b []byte) string {
	const hex = "0123456789abcdef"
	s := []byte{'"'}
	for _, c := range b {
		s = append(s, '\\', 'x', hex[c>>4], hex[c&15])
	}
	return string(append(s, '"'))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestPushedRows: a pull reads a row's initial value until the row is
// pushed and its updated value after, for a neighbour in the same word of
// the pushed-rows bitmap too, and for a table too large for the bitmap.
func TestPushedRows(t *testing.T) {
	for _, rows := range []uint64{1 << 20, 1 << 40} {
		st := NewStore(StoreConfig{})
		spec := Spec{Name: "t", Kind: Sparse, Dim: 4, Rows: rows, Opt: Optimizer{Kind: SGD, LR: 1}, Seed: 7}
		if err := st.Define(spec); err != nil {
			t.Fatal(err)
		}
		keys := []uint64{64 + 5, 64 + 6, rows - 1}
		before := make([]float32, 3*4)
		if err := st.Pull("t", keys, before); err != nil {
			t.Fatal(err)
		}
		if _, _, err := st.Push("t", keys[:1], []float32{1, 1, 1, 1}); err != nil {
			t.Fatal(err)
		}
		after := make([]float32, 3*4)
		if err := st.Pull("t", keys, after); err != nil {
			t.Fatal(err)
		}
		for j := range 4 {
			if after[j] != before[j]-1 {
				t.Errorf("rows %d: pushed row col %d: %v after a gradient of 1 at LR 1, was %v", rows, j, after[j], before[j])
			}
		}
		for j := 4; j < 12; j++ {
			if after[j] != before[j] {
				t.Errorf("rows %d: unpushed rows changed: %v -> %v", rows, before[4:], after[4:])
				break
			}
		}
		// The bytes path (Server.Handle's) agrees.
		got := make([]byte, 4*4)
		st.get2(t, "t").readRowBytes(keys[0], got)
		for j := range 4 {
			if v := math.Float32frombits(binary.LittleEndian.Uint32(got[4*j:])); v != after[j] {
				t.Errorf("rows %d: readRowBytes col %d = %v, Pull %v", rows, j, v, after[j])
			}
		}
	}
}

func (s *Store) get2(t *testing.T, name string) *param {
	p, err := s.get(name, Sparse)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestShortData: a Request's accessors and a Ring's placement answer 0
// where there is nothing to read (an index outside a decoded request, a
// ring of no servers) instead of panicking.
func TestShortData(t *testing.T) {
	r, err := DecodeRequest(mustEncode(EncodePush("emb", 2, []uint64{7, 9}, []float32{1, 2, 3, 4})))
	if err != nil {
		t.Fatal(err)
	}
	if r.Key(0) != 7 || r.Key(1) != 9 || r.Float(3) != 4 || r.NumFloats() != 4 {
		t.Fatalf("push decoded as keys %d %d, float 3 = %v of %d", r.Key(0), r.Key(1), r.Float(3), r.NumFloats())
	}
	for _, i := range []int{-1, 2, 1 << 40, math.MaxInt, math.MinInt} {
		if k := r.Key(i); k != 0 {
			t.Errorf("Key(%d) of 2 keys = %d, want 0", i, k)
		}
	}
	for _, i := range []int{-1, 4, 1 << 40, math.MaxInt, math.MinInt} {
		if f := r.Float(i); f != 0 {
			t.Errorf("Float(%d) of 4 floats = %v, want 0", i, f)
		}
	}
	var zero Request
	if zero.Key(0) != 0 || zero.Float(0) != 0 || zero.NumFloats() != 0 {
		t.Error("a zero Request has data")
	}
	for _, ring := range []*Ring{NewRing(0, 0), NewRing(-3, 0), NewRing(-1, -1), new(Ring), nil} {
		if ring.Key("emb", 1) != 0 || ring.Tensor("x") != 0 || ring.Servers() != 0 {
			t.Errorf("ring of no servers places something: %d %d %d", ring.Key("emb", 1), ring.Tensor("x"), ring.Servers())
		}
	}
}

// TestDialConfig: Dial refuses a config it cannot use with an error that
// names what is wrong, before it dials anything.
func TestDialConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  ClientConfig
		want string
	}{
		{ClientConfig{}, "no servers"},
		{ClientConfig{Servers: []string{"127.0.0.1:1"}, VNodes: MaxVNodes + 1}, "VNodes 4097 outside 1..MaxVNodes"},
		{ClientConfig{Servers: []string{"127.0.0.1:1"}, VNodes: -1}, "VNodes -1 outside"},
		{ClientConfig{Transport: "tcp", Servers: []string{"127.0.0.1:1"}, Pool: -1}, "Pool -1"},
		{ClientConfig{Transport: "tcp", Servers: []string{"127.0.0.1:1", ""}}, "server 1: empty address"},
		{ClientConfig{Transport: "tcp", Servers: []string{"10.0.0.1"}}, "server 0: address 10.0.0.1: missing port"},
		{ClientConfig{Transport: "tcp", Servers: make([]string, MaxServers+1)}, "1025 servers: at most MaxServers (1024)"},
	} {
		cl, err := Dial(c.cfg)
		if err == nil {
			cl.Close()
			t.Errorf("Dial(%+v) succeeded", c.cfg)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("Dial(%+v): %v, want it to say %q", c.cfg, err, c.want)
		}
	}
}

// TestServerConfig: NewServer refuses a config it cannot use with an
// error that names what is wrong, before it listens on anything; 0 takes
// the defaults.
func TestServerConfig(t *testing.T) {
	tcp := func(mod func(*ServerConfig)) ServerConfig {
		c := ServerConfig{Transport: "tcp", Listen: "127.0.0.1:0"}
		mod(&c)
		return c
	}
	for _, c := range []struct {
		cfg  ServerConfig
		want string
	}{
		{ServerConfig{Listen: "127.0.0.1:0"}, `transport "": want rdma or tcp`},
		{tcp(func(c *ServerConfig) { c.Transport = "udp" }), `transport "udp"`},
		{tcp(func(c *ServerConfig) { c.Store.MaxBatch = -1 }), "Store.MaxBatch -1"},
		{tcp(func(c *ServerConfig) { c.Store.MaxValues = -5 }), "Store.MaxValues -5"},
		{tcp(func(c *ServerConfig) { c.Store.NaN = 7 }), "Store.NaN 7"},
		{tcp(func(c *ServerConfig) { c.MaxFrame = -1 }), "MaxFrame -1"},
	} {
		s, err := NewServer(c.cfg)
		if err == nil {
			s.Close()
			t.Errorf("NewServer(%+v) succeeded", c.cfg)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewServer(%+v): %v, want it to say %q", c.cfg, err, c.want)
		}
	}
	s, err := NewServer(tcp(func(*ServerConfig) {}))
	if err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
}

// TestAdagradSpec: Define refuses an Adagrad optimizer whose step is not a
// number (Eps 0 with InitAcc 0 divides 0 by 0 on a zero gradient; a
// negative InitAcc takes the square root of a negative number), naming
// the field; Eps > 0 with InitAcc 0 trains finite values.
func TestAdagradSpec(t *testing.T) {
	s := NewStore(StoreConfig{})
	for _, c := range []struct {
		opt  Optimizer
		want string
	}{
		{Optimizer{Kind: Adagrad, LR: 0.1}, "Adagrad Eps 0: want > 0"},
		{Optimizer{Kind: Adagrad, LR: 0.1, Eps: -1e-6, InitAcc: 0.1}, "Adagrad Eps -1e-06: want > 0"},
		{Optimizer{Kind: Adagrad, LR: 0.1, Eps: 1e-6, InitAcc: -1}, "Adagrad InitAcc -1: want >= 0"},
	} {
		for _, spec := range []Spec{
			{Name: "a", Kind: Sparse, Dim: 2, Rows: 10, Opt: c.opt},
			{Name: "d", Kind: Dense, Size: 4, Opt: c.opt},
		} {
			err := s.Define(spec)
			if !errors.Is(err, ErrMalformed) || !strings.Contains(fmt.Sprint(err), c.want) {
				t.Errorf("Define(%+v): %v, want ErrMalformed saying %q", spec, err, c.want)
			}
			// Over the wire too: the server's store refuses it.
			if _, err := decodeResponse((&Server{store: s, inc: 1}).Handle(mustEncode(EncodeDefine(spec)), nil), 0); !errors.Is(err, ErrMalformed) {
				t.Errorf("define %+v over the protocol: %v, want ErrMalformed", spec, err)
			}
		}
	}
	if len(s.Specs()) != 0 {
		t.Fatalf("refused specs were defined: %+v", s.Specs())
	}
	must(t, s.Define(Spec{Name: "a", Kind: Sparse, Dim: 2, Rows: 10, Opt: Optimizer{Kind: Adagrad, LR: 0.1, Eps: 1e-6}}))
	if _, _, err := s.Push("a", []uint64{1, 2}, []float32{0, 0, 1, -1}); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, 4)
	must(t, s.Pull("a", []uint64{1, 2}, out))
	for j, v := range out {
		if !finite(v) {
			t.Errorf("Adagrad with Eps 1e-6, InitAcc 0: value %d is %v", j, v)
		}
	}
}

// TestStoreUnknownNaNPolicy: NewStore takes a NaN policy it does not know
// as NaNReject: a non-finite gradient is refused, nothing applied.
func TestStoreUnknownNaNPolicy(t *testing.T) {
	s := NewStore(StoreConfig{NaN: 7})
	must(t, s.Define(Spec{Name: "e", Kind: Sparse, Dim: 2, Rows: 10, Opt: Optimizer{Kind: SGD, LR: 1}}))
	must(t, s.Define(Spec{Name: "d", Kind: Dense, Size: 3, Opt: Optimizer{Kind: SGD, LR: 1}}))
	before := make([]float32, 2)
	must(t, s.Pull("e", []uint64{1}, before))
	if a, k, err := s.Push("e", []uint64{1}, []float32{float32(math.NaN()), 1}); !errors.Is(err, ErrNaN) || a != 0 || k != 0 {
		t.Errorf("sparse NaN push under policy 7: applied %d skipped %d, %v; want ErrNaN", a, k, err)
	}
	after := make([]float32, 2)
	must(t, s.Pull("e", []uint64{1}, after))
	if after[0] != before[0] || after[1] != before[1] {
		t.Errorf("row changed by a refused push: %v -> %v", before, after)
	}
	if a, k, err := s.PushDense("d", []float32{0, float32(math.Inf(1)), 0}); !errors.Is(err, ErrNaN) || a != 0 || k != 0 {
		t.Errorf("dense Inf push under policy 7: applied %d skipped %d, %v; want ErrNaN", a, k, err)
	}
	d := make([]float32, 3)
	must(t, s.PullDense("d", d))
	for j, v := range d {
		if !finite(v) {
			t.Errorf("dense value %d is %v after a refused push", j, v)
		}
	}
}

// TestRingBounds: NewRing refuses more than MaxServers servers (a ring of
// no servers, as for n <= 0) instead of allocating n*vnodes points.
func TestRingBounds(t *testing.T) {
	for _, c := range [][2]int{{math.MaxInt, 1}, {1 << 40, 4096}, {MaxServers + 1, 0}, {math.MaxInt, math.MaxInt}} {
		r := NewRing(c[0], c[1])
		if r.Servers() != 0 || r.Key("emb", 5) != 0 || r.Tensor("x") != 0 {
			t.Errorf("NewRing(%d, %d): %d servers, key on %d, tensor on %d; want a ring of none", c[0], c[1], r.Servers(), r.Key("emb", 5), r.Tensor("x"))
		}
	}
	r := NewRing(MaxServers, 1)
	if r.Servers() != MaxServers {
		t.Fatalf("NewRing(MaxServers, 1) has %d servers", r.Servers())
	}
	seen := map[int]bool{}
	for k := range uint64(1 << 16) {
		s := r.Key("emb", k)
		if s < 0 || s >= MaxServers {
			t.Fatalf("key %d on server %d of %d", k, s, MaxServers)
		}
		seen[s] = true
	}
	if len(seen) < MaxServers/2 {
		t.Errorf("65536 keys on only %d of %d servers", len(seen), MaxServers)
	}
}

// loopClient is a Client of one TCP server on loopback, and a context
// for it.
func loopClient(t *testing.T) (*Client, context.Context) {
	t.Helper()
	_, c := tcpServerClient(t)
	ctx, _ := hang.For(t, "ps client on loopback", 2*time.Minute) // catches a hang, not a slow run: the calls are few
	return c, ctx
}

type badCall struct {
	name, want string
	is         error // if not nil, the error must match it too
	run        func() error
}

// checkBad runs the calls, each of which must fail saying want, then
// checks the client still serves.
func checkBad(t *testing.T, c *Client, ctx context.Context, cases []badCall) {
	t.Helper()
	for _, k := range cases {
		err := k.run()
		if err == nil || !strings.Contains(err.Error(), k.want) || k.is != nil && !errors.Is(err, k.is) {
			t.Errorf("%s: %v, want an error saying %q (is %v)", k.name, err, k.want, k.is)
		}
	}
	keys, vals := []uint64{1}, make([]float32, 2)
	must(t, c.Define(ctx, Spec{Name: "e", Kind: Sparse, Dim: 2, Rows: 10, Opt: Optimizer{Kind: SGD, LR: 1}}))
	if _, err := c.Push(ctx, "e", keys, vals); err != nil {
		t.Fatal(err)
	}
	must(t, c.Pull(ctx, "e", keys, vals))
	if _, err := c.Raw(ctx, 0, EncodeStats()); err != nil {
		t.Fatal(err)
	}
}

// TestClientNilContext: every Client method taking a context refuses a
// nil one, naming the method, instead of panicking in the transport.
func TestClientNilContext(t *testing.T) {
	c, ctx := loopClient(t)
	var nilCtx context.Context
	spec := Spec{Name: "e", Kind: Sparse, Dim: 2, Rows: 10, Opt: Optimizer{Kind: SGD, LR: 1}}
	keys, vals := []uint64{1}, make([]float32, 2)
	wait := func(p *Pending) error { _, err := p.Wait(); return err }
	checkBad(t, c, ctx, []badCall{
		{"Define", "ps: Define: nil context", nil, func() error { return c.Define(nilCtx, spec) }},
		{"Pull", "ps: Pull: nil context", nil, func() error { return c.Pull(nilCtx, "e", keys, vals) }},
		{"Push", "ps: Push: nil context", nil, func() error { _, err := c.Push(nilCtx, "e", keys, vals); return err }},
		{"PullDense", "ps: PullDense: nil context", nil, func() error { return c.PullDense(nilCtx, "d", vals) }},
		{"PushDense", "ps: PushDense: nil context", nil, func() error { _, err := c.PushDense(nilCtx, "d", vals); return err }},
		{"Stats", "ps: Stats: nil context", nil, func() error { _, err := c.Stats(nilCtx); return err }},
		{"Raw", "ps: Raw: nil context", nil, func() error { _, err := c.Raw(nilCtx, 0, EncodeStats()); return err }},
		{"PullAsync", "ps: PullAsync: nil context", nil, func() error { return wait(c.PullAsync(nilCtx, "e", keys, vals)) }},
		{"PushAsync", "ps: PushAsync: nil context", nil, func() error { return wait(c.PushAsync(nilCtx, "e", keys, vals)) }},
	})
}

// TestClientRawServer: Raw refuses a server index outside 0..n-1.
func TestClientRawServer(t *testing.T) {
	c, ctx := loopClient(t)
	raw := func(i int) func() error {
		return func() error { _, err := c.Raw(ctx, i, EncodeStats()); return err }
	}
	checkBad(t, c, ctx, []badCall{
		{"-1", "ps: Raw: server -1 outside 0..0 (1 servers)", nil, raw(-1)},
		{"1", "ps: Raw: server 1 outside 0..0 (1 servers)", nil, raw(1)},
		{"MaxInt", "outside 0..0 (1 servers)", nil, raw(math.MaxInt)},
		{"MinInt", "outside 0..0 (1 servers)", nil, raw(math.MinInt)},
	})
}

// TestClientNames: Pull, Push, PullDense and PushDense refuse a name
// Define would not take (the wire carries its length in a byte) with an
// ErrMalformed naming its length, before sending anything.
func TestClientNames(t *testing.T) {
	c, ctx := loopClient(t)
	long := strings.Repeat("x", MaxName+1)
	keys, vals := []uint64{1}, make([]float32, 2)
	checkBad(t, c, ctx, []badCall{
		{"Pull empty", "Pull: table name of 0 bytes outside 1..255", ErrMalformed, func() error { return c.Pull(ctx, "", keys, vals) }},
		{"Pull long", "Pull: table name of 256 bytes outside 1..255", ErrMalformed, func() error { return c.Pull(ctx, long, keys, vals) }},
		{"Push empty", "Push: table name of 0 bytes outside 1..255", ErrMalformed,
			func() error { _, err := c.Push(ctx, "", keys, vals); return err }},
		{"Push long", "Push: table name of 256 bytes outside 1..255", ErrMalformed,
			func() error { _, err := c.Push(ctx, long, keys, vals); return err }},
		{"PullDense empty", "PullDense: tensor name of 0 bytes outside 1..255", ErrMalformed, func() error { return c.PullDense(ctx, "", vals) }},
		{"PullDense long", "PullDense: tensor name of 256 bytes outside 1..255", ErrMalformed, func() error { return c.PullDense(ctx, long, vals) }},
		{"PushDense empty", "PushDense: tensor name of 0 bytes outside 1..255", ErrMalformed,
			func() error { _, err := c.PushDense(ctx, "", vals); return err }},
		{"PushDense long", "PushDense: tensor name of 256 bytes outside 1..255", ErrMalformed,
			func() error { _, err := c.PushDense(ctx, long, vals); return err }},
	})
	// A name of MaxName bytes is fine.
	name := strings.Repeat("y", MaxName)
	must(t, c.Define(ctx, Spec{Name: name, Kind: Dense, Size: 2, Opt: Optimizer{Kind: SGD, LR: 1}}))
	must(t, c.PullDense(ctx, name, vals))
}

// mustEncode is an Encode* call's message; an error is the test's own
// mistake.
func mustEncode(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// TestEncodeRefuses: the encoders refuse, naming the field, what the wire
// cannot carry or the decoder would refuse (they wrote a one-byte name
// length and 32-bit counts without a check: a 300-byte name went out as
// 44 bytes of name and 256 bytes of garbage body), and what they accept
// decodes back to what was given.
func TestEncodeRefuses(t *testing.T) {
	long := strings.Repeat("n", MaxName+1)
	for _, c := range []struct {
		what string
		enc  func() ([]byte, error)
		want string
	}{
		{"EncodePull long name", func() ([]byte, error) { return EncodePull(long, 1, []uint64{1}) }, "EncodePull: name of 256 bytes"},
		{"EncodePull dim -1", func() ([]byte, error) { return EncodePull("e", -1, []uint64{1}) }, "EncodePull: dim -1"},
		{"EncodePull dim 1<<32", func() ([]byte, error) { return EncodePull("e", 1<<32, []uint64{1}) }, "EncodePull: dim 4294967296"},
		{"EncodePush long name", func() ([]byte, error) { return EncodePush(long, 1, []uint64{1}, []float32{1}) }, "EncodePush: name of 256 bytes"},
		{"EncodePush short grads", func() ([]byte, error) { return EncodePush("e", 2, []uint64{1, 2}, []float32{1, 2, 3}) }, "EncodePush: 3 gradient values for 2 keys of dim 2, want 4"},
		{"EncodePullDense long name", func() ([]byte, error) { return EncodePullDense(long, 4) }, "EncodePullDense: name of 256 bytes"},
		{"EncodePullDense size -1", func() ([]byte, error) { return EncodePullDense("w", -1) }, "EncodePullDense: -1 values"},
		{"EncodePullDense size 1<<40", func() ([]byte, error) { return EncodePullDense("w", 1<<40) }, "EncodePullDense: 1099511627776 values"},
		{"EncodePushDense long name", func() ([]byte, error) { return EncodePushDense(long, []float32{1}) }, "EncodePushDense: name of 256 bytes"},
		{"EncodeDefine long name", func() ([]byte, error) { return EncodeDefine(Spec{Name: long, Kind: Sparse, Dim: 2, Rows: 4}) }, "EncodeDefine: name of 256 bytes"},
		{"EncodeDefine dense size -1", func() ([]byte, error) { return EncodeDefine(Spec{Name: "w", Kind: Dense, Size: -1}) }, "EncodeDefine: -1 values"},
		{"EncodeDefine dim -2", func() ([]byte, error) { return EncodeDefine(Spec{Name: "e", Kind: Sparse, Dim: -2, Rows: 4}) }, "EncodeDefine: dim -2"},
	} {
		b, err := c.enc()
		if !errors.Is(err, ErrMalformed) || !strings.Contains(fmt.Sprint(err), c.want) || b != nil {
			t.Errorf("%s: %d bytes, %v; want no message and ErrMalformed saying %q", c.what, len(b), err, c.want)
		}
	}
	name := strings.Repeat("n", MaxName)
	b, err := EncodePush(name, 2, []uint64{7, 9}, []float32{1, 2, 3, 4})
	if err != nil {
		t.Fatalf("EncodePush of a %d-byte name: %v", MaxName, err)
	}
	r, err := DecodeRequest(b)
	if err != nil || r.Name != name || r.Dim != 2 || r.N != 2 || r.Key(1) != 9 || r.Float(3) != 4 {
		t.Errorf("decoded %q dim %d n %d key1 %d float3 %v, %v; want the name, 2, 2, 9, 4", r.Name, r.Dim, r.N, r.Key(1), r.Float(3), err)
	}
}
