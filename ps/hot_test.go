package ps_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/ps"
)

// The hot path (issue 15 item 1): the per-operation cost of a pull and a
// push on the server and the client, in steady state. The benchmarks
// report allocations (-benchmem); TestHotPathAllocs asserts that steady
// state allocates nothing.

// hotSpec is the ps bench's embedding table (cmd/goverbs: inference).
var hotSpec = ps.Spec{Name: "emb", Kind: ps.Sparse, Dim: 32, Rows: 1 << 20,
	Opt: ps.Optimizer{Kind: ps.Adagrad, LR: 0.05, Eps: 1e-6, InitAcc: 0.1}, Seed: 1}

const hotKeys = 32 // inference's batch: 271 request bytes, 4116 response bytes

func hotBatch(rng *rand.Rand) ([]uint64, []float32) {
	keys := make([]uint64, hotKeys)
	for i := range keys {
		keys[i] = rng.Uint64N(hotSpec.Rows)
	}
	g := make([]float32, hotKeys*hotSpec.Dim)
	for i := range g {
		g[i] = float32(rng.NormFloat64() * 0.001)
	}
	return keys, g
}

// hotServer is a tcp server on loopback with hotSpec defined and the rows
// of keys materialised (pushed once).
func hotServer(t testing.TB, e env, keys []uint64, g []float32) (*ps.Server, *ps.Client) {
	s := e.server(t, "", nil)
	c := e.client(t, []string{s.Addr().String()})
	ctx := context.Background()
	must(t, c.Define(ctx, hotSpec))
	if _, err := c.Push(ctx, hotSpec.Name, keys, g); err != nil {
		t.Fatal(err)
	}
	return s, c
}

func BenchmarkDecodeRequest(b *testing.B) {
	keys, _ := hotBatch(rand.New(rand.NewPCG(1, 2)))
	req := mustEncode(ps.EncodePull(hotSpec.Name, hotSpec.Dim, keys))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ps.DecodeRequest(req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkServerHandle(b *testing.B) {
	keys, g := hotBatch(rand.New(rand.NewPCG(1, 2)))
	s, _ := hotServer(b, envFor(b, "tcp"), keys, g)
	cold := make([]uint64, hotKeys) // never pushed: initial values
	for i := range cold {
		cold[i] = hotSpec.Rows - 1 - uint64(i)
	}
	for _, tc := range []struct {
		name string
		req  []byte
	}{
		{"pull", mustEncode(ps.EncodePull(hotSpec.Name, hotSpec.Dim, keys))},
		{"pull-cold", mustEncode(ps.EncodePull(hotSpec.Name, hotSpec.Dim, cold))},
		{"push", mustEncode(ps.EncodePush(hotSpec.Name, hotSpec.Dim, keys, g))},
	} {
		b.Run(tc.name, func(b *testing.B) {
			buf := s.Handle(tc.req, nil)
			b.ReportAllocs()
			b.SetBytes(int64(len(tc.req) + len(buf)))
			for b.Loop() {
				buf = s.Handle(tc.req, buf[:0])
			}
		})
	}
}

func BenchmarkStorePull(b *testing.B) {
	keys, g := hotBatch(rand.New(rand.NewPCG(1, 2)))
	st := ps.NewStore(ps.StoreConfig{})
	must(b, st.Define(hotSpec))
	if _, _, err := st.Push(hotSpec.Name, keys, g); err != nil {
		b.Fatal(err)
	}
	out := make([]float32, len(g))
	b.ReportAllocs()
	for b.Loop() {
		must(b, st.Pull(hotSpec.Name, keys, out))
	}
}

// BenchmarkClient: a Client's Pull and Push against one server, one call
// outstanding (the server in this process: allocations are both sides').
func BenchmarkClient(b *testing.B) {
	for _, tr := range transports {
		b.Run(tr, func(b *testing.B) {
			keys, g := hotBatch(rand.New(rand.NewPCG(1, 2)))
			_, c := hotServer(b, envFor(b, tr), keys, g)
			ctx := context.Background()
			out := make([]float32, len(g))
			b.Run("pull", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					must(b, c.Pull(ctx, hotSpec.Name, keys, out))
				}
			})
			b.Run("push", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := c.Push(ctx, hotSpec.Name, keys, g); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkBareBX is the transport alone for BenchmarkClient/rdma/pull: a
// bx Call of a pull's bytes (271) to an inline handler answering with a
// pull response's (4116), the endpoints configured as ps's (goverbs perf
// bx_lat -s 271 --resp-size 4116, in one process).
func BenchmarkBareBX(b *testing.B) {
	e := envFor(b, "rdma")
	keys, _ := hotBatch(rand.New(rand.NewPCG(1, 2)))
	req := mustEncode(ps.EncodePull(hotSpec.Name, hotSpec.Dim, keys))
	resp := make([]byte, 12+8+4*hotKeys*hotSpec.Dim)
	srvCfg, cliCfg := ps.DefaultServerBX, ps.DefaultClientBX
	srvCfg.Device, srvCfg.Token = e.srvDev, token
	cliCfg.Device, cliCfg.Token = e.cliDev, token
	srv, err := bx.New(srvCfg)
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	srv.HandleInline(ps.Streams, func(context.Context, *bx.Peer, *bx.Msg) ([]byte, error) { return resp, nil })
	addr, err := srv.Listen(e.ip + ":0")
	if err != nil {
		b.Fatal(err)
	}
	cli, err := bx.New(cliCfg)
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	p, err := cli.Dial(ctx, addr.String())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		m, err := p.Call(ctx, ps.Streams, req)
		if err != nil {
			b.Fatal(err)
		}
		if len(m.Data()) != len(resp) {
			b.Fatalf("response of %d bytes", len(m.Data()))
		}
		m.Release()
	}
}

// TestHotPathAllocs: in steady state, serving a pull or a push (decoded in
// place) and a client's pull or push (both ends in this process) allocate
// nothing, over tcp and over rdma (where the server builds its response in
// bx's send buffer: bx.Msg.Reply).
func TestHotPathAllocs(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			keys, g := hotBatch(rand.New(rand.NewPCG(1, 2)))
			s, c := hotServer(t, envFor(t, tr), keys, g)
			ctx := context.Background()
			pull := mustEncode(ps.EncodePull(hotSpec.Name, hotSpec.Dim, keys))
			push := mustEncode(ps.EncodePush(hotSpec.Name, hotSpec.Dim, keys, g))
			buf := s.Handle(push, nil)
			out := make([]float32, len(g))
			for _, tc := range []struct {
				name   string
				f      func()
				pooled bool // uses sync.Pool, which the race detector makes allocate
			}{
				{"Server.Handle pull", func() { buf = s.Handle(pull, buf[:0]) }, false},
				{"Server.Handle push", func() { buf = s.Handle(push, buf[:0]) }, false},
				{"Client.Pull", func() { must(t, c.Pull(ctx, hotSpec.Name, keys, out)) }, true},
				{"Client.Push", func() {
					if _, err := c.Push(ctx, hotSpec.Name, keys, g); err != nil {
						t.Fatal(err)
					}
				}, true},
			} {
				tc.f() // warm: pools, slabs, connections
				if tc.pooled && raceEnabled {
					// scripts/test runs this package without -race in
					// its no-huge-pages guest too, where it is checked.
					t.Logf("%s: allocations not checked under the race detector (its sync.Pool drops items)", tc.name)
					continue
				}
				if n := testing.AllocsPerRun(200, tc.f); n != 0 {
					t.Errorf("%s: %v allocations per operation, want 0", tc.name, n)
				}
			}
			// The pull still reads what was pushed.
			want := make([]float32, len(out))
			must(t, s.Store().Pull(hotSpec.Name, keys, want))
			must(t, c.Pull(ctx, hotSpec.Name, keys, out))
			if fmt.Sprint(out) != fmt.Sprint(want) {
				t.Errorf("pull over %s differs from the store's rows", tr)
			}
		})
	}
}

// TestAsync: a worker keeps several pulls and pushes outstanding on two
// servers; each pull returns the rows the servers hold, each push what it
// applied.
func TestAsync(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			e := envFor(t, tr)
			_, addrs := e.servers(t, 2, nil)
			c := e.client(t, addrs)
			ctx := context.Background()
			must(t, c.Define(ctx, hotSpec))
			ref := ps.NewStore(ps.StoreConfig{})
			must(t, ref.Define(hotSpec))
			rng := rand.New(rand.NewPCG(3, 4))
			const depth = 8
			var keys [depth][]uint64
			var grads, outs [depth][]float32
			var pushes, pulls [depth]*ps.Pending
			for i := range depth {
				keys[i], grads[i] = hotBatch(rng)
				for j := range keys[i] {
					keys[i][j] = uint64(i*hotKeys + j) // distinct rows per batch
				}
				outs[i] = make([]float32, len(grads[i]))
				pushes[i] = c.PushAsync(ctx, hotSpec.Name, keys[i], grads[i])
			}
			for i := range depth {
				res, err := pushes[i].Wait()
				must(t, err)
				if res.Applied != hotKeys || res.Skipped != 0 {
					t.Errorf("push %d: %+v, want %d rows applied", i, res, hotKeys)
				}
				pulls[i] = c.PullAsync(ctx, hotSpec.Name, keys[i], outs[i])
			}
			for i := range depth {
				<-pulls[i].Done()
				if _, err := pulls[i].Wait(); err != nil {
					t.Fatalf("pull %d: %v", i, err)
				}
				// As a local store that applied the same pushes: the
				// rows were pushed to the right server, applied once, and
				// pulled back into the right places.
				want := make([]float32, len(outs[i]))
				if _, _, err := ref.Push(hotSpec.Name, keys[i], grads[i]); err != nil {
					t.Fatal(err)
				}
				must(t, ref.Pull(hotSpec.Name, keys[i], want))
				if fmt.Sprint(outs[i]) != fmt.Sprint(want) {
					t.Fatalf("pull %d: %v, want %v", i, outs[i], want)
				}

			}
		})
	}
}

// BenchmarkStorePullBig: 32 random keys of a 2^20-row table of which a
// quarter was pushed (as in a long inference run: most pulled rows are
// still cold, the pushed ones are spread over a large map).
func BenchmarkStorePullBig(b *testing.B) {
	st := ps.NewStore(ps.StoreConfig{})
	spec := hotSpec
	spec.Rows = 1 << 20
	must(b, st.Define(spec))
	rng := rand.New(rand.NewPCG(3, 4))
	keys := make([]uint64, 1024)
	g := make([]float32, len(keys)*spec.Dim)
	for range spec.Rows / 4 / uint64(len(keys)) {
		for i := range keys {
			keys[i] = rng.Uint64N(spec.Rows)
		}
		if _, _, err := st.Push(spec.Name, keys, g); err != nil {
			b.Fatal(err)
		}
	}
	keys = keys[:32]
	out := make([]float32, len(keys)*spec.Dim)
	b.ReportAllocs()
	for b.Loop() {
		for i := range keys {
			keys[i] = rng.Uint64N(spec.Rows)
		}
		must(b, st.Pull(spec.Name, keys, out))
	}
}

// mustEncode is an Encode* call's message; an error is the test's own
// mistake.
func mustEncode(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
