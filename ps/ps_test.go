package ps_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/ps"
)

var token = []byte("ps-test-token-0123456789")

// env says where servers listen and which devices the two sides use.
type env struct {
	transport          string
	srvDev, cliDev, ip string
}

// envFor returns the environment of a transport: rdma needs two devices
// (servers on the second, rxe1/10.99.0.2 in the guest); tcp runs on the
// same addresses when there are devices, on loopback otherwise.
func envFor(t testing.TB, transport string) env {
	t.Helper()
	if transport == "rdma" {
		rxetest.Pair(t)
	}
	devs, err := ps.ActiveDevices()
	if err != nil {
		t.Fatal(err)
	}
	e := env{transport: transport, ip: "127.0.0.1"}
	if len(devs) >= 2 {
		e.cliDev, e.srvDev, e.ip = devs[0].Name, devs[1].Name, devs[1].IP.String()
	}
	return e
}

func (e env) server(t testing.TB, listen string, mod func(*ps.ServerConfig)) *ps.Server {
	t.Helper()
	if listen == "" {
		listen = e.ip + ":0"
	}
	cfg := ps.ServerConfig{Transport: e.transport, Listen: listen, Device: e.srvDev, Token: token}
	if mod != nil {
		mod(&cfg)
	}
	s, err := ps.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func (e env) servers(t *testing.T, n int, mod func(*ps.ServerConfig)) ([]*ps.Server, []string) {
	var ss []*ps.Server
	var addrs []string
	for range n {
		s := e.server(t, "", mod)
		ss = append(ss, s)
		addrs = append(addrs, s.Addr().String())
	}
	return ss, addrs
}

func (e env) client(t testing.TB, addrs []string) *ps.Client {
	t.Helper()
	c, err := ps.Dial(ps.ClientConfig{Transport: e.transport, Servers: addrs, Device: e.cliDev, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var transports = []string{"rdma", "tcp"}

// fcAdaSize is the size of the Adagrad tensor: large enough that its
// pushes and pulls (120 KB) go by rendezvous, small enough that the
// per-value work (gradients, Adagrad's square root, the reference) stays
// cheap in the TCG guest, where floating point is emulated and runs under
// the race detector. At 300000 values that work was most of the ps
// package's 15 minutes in scripts/test's guest stage; messages over 1 MiB
// are the bx tests' (up to 4 MiB) and the ps bench's.
const fcAdaSize = 30000

var specs = []ps.Spec{
	{Name: "emb", Kind: ps.Sparse, Dim: 8, Rows: 5000, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.1}, Seed: 1},
	{Name: "emb_ada", Kind: ps.Sparse, Dim: 4, Rows: 300, Opt: ps.Optimizer{Kind: ps.Adagrad, LR: 0.05, Eps: 1e-6, InitAcc: 0.1}, Seed: 2},
	{Name: "fc", Kind: ps.Dense, Size: 10000, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.01}, Seed: 3},
	{Name: "fc_ada", Kind: ps.Dense, Size: fcAdaSize, Opt: ps.Optimizer{Kind: ps.Adagrad, LR: 0.01, Eps: 1e-6, InitAcc: 0.1}, Seed: 4},
}

type push struct {
	table string
	keys  []uint64
	grads []float32
}

// TestTrainingMatchesReference: workers train concurrently against two
// servers; afterwards every parameter on the servers equals a single-process
// reference (a local Store) that applied the same gradients.
//
// Tolerance: "emb" (SGD) is pushed by one worker per row (keys are split by
// worker), so every row sees its gradients in a fixed order and must match
// bit for bit. "emb_ada" and the dense tensors are pushed by all workers
// concurrently, so the order of float32 additions per row differs from the
// reference's: they must match within 1e-4 absolute (values are O(0.1), a
// row gets at most 4x12 updates of O(0.01)).
func TestTrainingMatchesReference(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			e := envFor(t, tr)
			_, addrs := e.servers(t, 2, nil)
			// A correctness test, not a timed one: the watchdog catches a
			// hang (no push for 2 minutes), not a slow run (a run under
			// -race with two guests on a slow 2-core machine took 4
			// minutes).
			ctx, wd := hang.For(t, "ps training over "+tr, 2*time.Minute)
			const workers, steps = 4, 12
			var mu sync.Mutex
			var log []push
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				c := e.client(t, addrs)
				if err := c.Define(ctx, specs...); err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- worker(ctx, c, w, workers, steps, func(p push) {
						mu.Lock()
						log = append(log, p)
						n := len(log)
						mu.Unlock()
						wd.Note("%d of %d pushes", n, workers*steps*4)
					})
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(hang.Cause(ctx, err))
				}
			}
			ref := ps.NewStore(ps.StoreConfig{})
			for _, s := range specs {
				must(t, ref.Define(s))
			}
			for _, p := range log {
				var err error
				if p.keys == nil {
					_, _, err = ref.PushDense(p.table, p.grads)
				} else {
					_, _, err = ref.Push(p.table, p.keys, p.grads)
				}
				must(t, err)
			}
			// The verification has its own watchdog: a slow training
			// run must not eat into its time.
			ctx, wd = hang.For(t, "ps verification over "+tr, 2*time.Minute)
			c := e.client(t, addrs)
			for _, s := range specs {
				wd.Note("verifying %s", s.Name)
				var got, want []float32
				if s.Kind == ps.Dense {
					got, want = make([]float32, s.Size), make([]float32, s.Size)
					must(t, hang.Cause(ctx, c.PullDense(ctx, s.Name, got)))
					must(t, ref.PullDense(s.Name, want))
				} else {
					keys := make([]uint64, s.Rows)
					for i := range keys {
						keys[i] = uint64(i)
					}
					got, want = make([]float32, len(keys)*s.Dim), make([]float32, len(keys)*s.Dim)
					must(t, hang.Cause(ctx, c.Pull(ctx, s.Name, keys, got)))
					must(t, ref.Pull(s.Name, keys, want))
				}
				tol := 1e-4
				if s.Name == "emb" {
					tol = 0
				}
				bad := 0
				for i := range got {
					if d := math.Abs(float64(got[i] - want[i])); d > tol || math.IsNaN(d) {
						if bad++; bad < 5 {
							t.Errorf("%s[%d] = %v on the servers, %v in the reference (tolerance %g)", s.Name, i, got[i], want[i], tol)
						}
					}
				}
				if bad > 0 {
					t.Errorf("%s: %d of %d values differ", s.Name, bad, len(got))
				}
			}
			if len(log) != workers*steps*4 {
				t.Errorf("%d pushes logged, want %d", len(log), workers*steps*4)
			}
		})
	}
}

// worker pulls and pushes like a training step, logging what it pushed.
func worker(ctx context.Context, c *ps.Client, w, workers, steps int, logf func(push)) error {
	rng := rand.New(rand.NewPCG(uint64(w), 7))
	for range steps {
		// emb: 64 keys of this worker's residue class (one pusher per row).
		keys := make([]uint64, 64)
		for i := range keys {
			keys[i] = uint64(rng.IntN(5000/workers)*workers + w)
		}
		rows := make([]float32, 64*8)
		if err := c.Pull(ctx, "emb", keys, rows); err != nil {
			return err
		}
		g := make([]float32, len(rows))
		for i := range g {
			g[i] = rows[i]*0.5 + float32(rng.NormFloat64()*0.01)
		}
		if _, err := c.Push(ctx, "emb", keys, g); err != nil {
			return err
		}
		logf(push{"emb", keys, g})
		// emb_ada: shared keys, duplicates within a batch allowed.
		ak := make([]uint64, 32)
		for i := range ak {
			ak[i] = uint64(rng.IntN(300))
		}
		ag := make([]float32, 32*4)
		for i := range ag {
			ag[i] = float32(rng.NormFloat64() * 0.01)
		}
		if _, err := c.Push(ctx, "emb_ada", ak, ag); err != nil {
			return err
		}
		logf(push{"emb_ada", ak, ag})
		for _, d := range []struct {
			name string
			n    int
		}{{"fc", 10000}, {"fc_ada", fcAdaSize}} {
			v := make([]float32, d.n)
			if err := c.PullDense(ctx, d.name, v); err != nil {
				return err
			}
			g := make([]float32, d.n)
			for i := range g {
				g[i] = float32(rng.NormFloat64() * 0.01)
			}
			if _, err := c.PushDense(ctx, d.name, g); err != nil {
				return err
			}
			logf(push{table: d.name, grads: g})
		}
	}
	return nil
}

// TestBadInput: every bad request gets a clear error and the server keeps
// serving.
func TestBadInput(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			e := envFor(t, tr)
			mod := func(c *ps.ServerConfig) { c.Store.MaxBatch = 1000 }
			_, addrs := e.servers(t, 1, mod)
			_, skipAddrs := e.servers(t, 1, func(c *ps.ServerConfig) { c.Store.NaN = ps.NaNSkip })
			ctx, wd := hang.For(t, "ps bad input over "+tr, 2*time.Minute) // catches a hang, not a slow run
			c := e.client(t, addrs)
			must(t, c.Define(ctx, specs...))
			nan := float32(math.NaN())
			big := make([]uint64, 1001)
			cases := []struct {
				name, text string
				err        error
				run        func() error
			}{
				{"unknown key", "key 5000 of table \"emb\" outside 0..4999", ps.ErrUnknownKey,
					func() error { return c.Pull(ctx, "emb", []uint64{1, 5000}, make([]float32, 16)) }},
				{"unknown table", "no parameter \"nope\"", ps.ErrUnknownParam,
					func() error { return c.Pull(ctx, "nope", []uint64{1}, make([]float32, 8)) }},
				{"wrong dim pull", "table \"emb\" has dim 8, request says 4", ps.ErrDim,
					func() error { return c.Pull(ctx, "emb", []uint64{1, 2}, make([]float32, 8)) }},
				{"wrong dim push", "table \"emb\" has dim 8, push says 2", ps.ErrDim,
					func() error { _, err := c.Push(ctx, "emb", []uint64{1}, []float32{1, 2}); return err }},
				{"wrong dense size", "tensor \"fc\" has 10000 values, request says 3", ps.ErrDim,
					func() error { return c.PullDense(ctx, "fc", make([]float32, 3)) }},
				{"oversized batch", "batch of 1001 keys for \"emb\" exceeds the server's limit of 1000", ps.ErrTooLarge,
					func() error { return c.Pull(ctx, "emb", big, make([]float32, 1001*8)) }},
				{"oversized message", "", ps.ErrTooLarge,
					func() error { _, err := c.PushDense(ctx, "fc", make([]float32, 2<<20)); return err }},
				{"nan gradient", "gradient of key 2 (batch row 1) is not finite; nothing applied", ps.ErrNaN,
					func() error {
						_, err := c.Push(ctx, "emb", []uint64{1, 2}, append(make([]float32, 9), nan, 0, 0, 0, 0, 0, 0))
						return err
					}},
				{"inf dense gradient", "gradient value 7 is not finite", ps.ErrNaN,
					func() error {
						g := make([]float32, 10000)
						g[7] = float32(math.Inf(-1))
						_, err := c.PushDense(ctx, "fc", g)
						return err
					}},
				{"conflicting define", "already defined", ps.ErrConflict,
					func() error {
						return c.Define(ctx, ps.Spec{Name: "emb", Kind: ps.Sparse, Dim: 9, Rows: 5000, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.1}})
					}},
				{"malformed", "malformed", ps.ErrMalformed,
					func() error { _, err := c.Raw(ctx, 0, []byte{1, 2, 0, 3, 'e', 'm'}); return err }},
			}
			for _, k := range cases {
				wd.Note("case %q", k.name)
				err := k.run()
				if !errors.Is(err, k.err) || !strings.Contains(fmt.Sprint(err), k.text) {
					t.Errorf("%s: got %v, want %v containing %q", k.name, err, k.err, k.text)
				} else {
					t.Logf("%s: %v", k.name, err)
				}
			}
			if tr == "rdma" {
				// A pull whose response is over bx's MaxMessage (4 MiB
				// here): refused before it is built, as too large, not
				// answered with bx's error (ErrInternal at the client).
				wd.Note("case %q", "oversized response")
				must(t, c.Define(ctx, ps.Spec{Name: "wide", Kind: ps.Sparse, Dim: 2048, Rows: 1000, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.1}}))
				keys := make([]uint64, 600)
				for i := range keys {
					keys[i] = uint64(i)
				}
				err := c.Pull(ctx, "wide", keys, make([]float32, 600*2048))
				if !errors.Is(err, ps.ErrTooLarge) || !strings.Contains(fmt.Sprint(err), "exceeds the server's bx MaxMessage") {
					t.Errorf("oversized response: got %v, want %v naming bx's MaxMessage", err, ps.ErrTooLarge)
				} else {
					t.Logf("oversized response: %v", err)
				}
			}
			// The NaN row was not applied: row 1 is still its pull value.
			before := make([]float32, 8)
			must(t, c.Pull(ctx, "emb", []uint64{1}, before))
			if _, err := c.Push(ctx, "emb", []uint64{1}, make([]float32, 8)); err != nil {
				t.Fatalf("server stopped serving after bad input: %v", err)
			}
			// Skip policy: the NaN row is skipped and counted, the rest applied.
			sc := e.client(t, skipAddrs)
			must(t, sc.Define(ctx, specs...))
			res, err := sc.Push(ctx, "emb", []uint64{1, 2, 3}, append(append(make([]float32, 8), nan), make([]float32, 15)...))
			if err != nil || res.Applied != 2 || res.Skipped != 1 {
				t.Errorf("skip policy: %+v %v", res, err)
			}
		})
	}
}

// TestKilledWorker: a worker process is killed (SIGKILL) in the middle of
// pushing; the servers keep serving the other workers.
func TestKilledWorker(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			e := envFor(t, tr)
			servers, addrs := e.servers(t, 2, nil)
			ctx, wd := hang.For(t, "ps calls after a killed worker over "+tr, 2*time.Minute) // catches a hang, not a slow run
			c := e.client(t, addrs)
			must(t, c.Define(ctx, specs...))
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "PS_TEST_WORKER="+strings.Join([]string{tr, e.cliDev, strings.Join(addrs, ",")}, ";"))
			out, _ := cmd.StdoutPipe()
			cmd.Stderr = os.Stderr
			must(t, cmd.Start())
			line, _ := bufio.NewReader(out).ReadString('\n')
			if !strings.HasPrefix(line, "pushing") {
				cmd.Process.Kill()
				t.Fatalf("worker child said %q", line)
			}
			time.Sleep(300 * time.Millisecond)
			must(t, cmd.Process.Kill())
			cmd.Wait()
			// The survivors: the existing client and a new one.
			for _, cl := range []*ps.Client{c, e.client(t, addrs)} {
				for i := range 20 {
					if _, err := cl.PushDense(ctx, "fc_ada", make([]float32, fcAdaSize)); err != nil {
						t.Fatalf("after the kill: %v", hang.Cause(ctx, err))
					}
					if err := cl.Pull(ctx, "emb", []uint64{1, 2, 3, 4}, make([]float32, 32)); err != nil {
						t.Fatalf("after the kill: %v", hang.Cause(ctx, err))
					}
					wd.Note("%d calls after the kill", i+1)
				}
			}
			st, err := c.Stats(ctx)
			must(t, err)
			t.Logf("servers after the kill: %+v (%d, %d)", st, servers[0].Incarnation(), servers[1].Incarnation())
		})
	}
}

// TestRestartedServer: a server restarts on the same address; its clients
// reconnect (bx: a new peer, as the old one is gone), get ErrStateLost once,
// and go on with a re-initialised shard (the client re-defines its
// parameters there).
func TestRestartedServer(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			e := envFor(t, tr)
			s0 := e.server(t, "", nil)
			addr := s0.Addr().String()
			ctx, wd := hang.For(t, "ps calls across a server restart over "+tr, 2*time.Minute) // catches a hang, not a slow run
			c := e.client(t, []string{addr})
			must(t, c.Define(ctx, specs...))
			if _, err := c.Push(ctx, "emb", []uint64{1}, []float32{1, 1, 1, 1, 1, 1, 1, 1}); err != nil {
				t.Fatal(err)
			}
			pushed := make([]float32, 8)
			must(t, c.Pull(ctx, "emb", []uint64{1}, pushed))
			must(t, s0.Close())
			wd.Note("server closed")
			var s1 *ps.Server
			for i := 0; ; i++ {
				s, err := ps.NewServer(ps.ServerConfig{Transport: tr, Listen: addr, Device: e.srvDev, Token: token})
				if err == nil {
					s1 = s
					break
				}
				if ctx.Err() != nil { // the old server's address is still held
					t.Fatalf("restart after %d tries: %v", i+1, hang.Cause(ctx, err))
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Cleanup(func() { s1.Close() })
			row := make([]float32, 8)
			var err error
			for range 3 { // the first call may still find the old connection dead
				if err = c.Pull(ctx, "emb", []uint64{1}, row); errors.Is(err, ps.ErrStateLost) {
					break
				}
				t.Logf("while the server restarts: %v", err)
			}
			if !errors.Is(err, ps.ErrStateLost) {
				t.Fatalf("after a restart: %v, want ErrStateLost", hang.Cause(ctx, err))
			}
			t.Logf("restart reported: %v", err)
			must(t, c.Pull(ctx, "emb", []uint64{1}, row))
			if row[0] == pushed[0] {
				t.Errorf("row survived a restart of an in-memory server?")
			}
		})
	}
}

func TestMain(m *testing.M) {
	if w := os.Getenv("PS_TEST_WORKER"); w != "" {
		os.Exit(childWorker(w))
	}
	os.Exit(m.Run())
}

// childWorker pushes large dense gradients until it is killed.
func childWorker(arg string) int {
	f := strings.Split(arg, ";")
	c, err := ps.Dial(ps.ClientConfig{Transport: f[0], Device: f[1], Servers: strings.Split(f[2], ","), Token: token})
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	ctx := context.Background()
	g := make([]float32, fcAdaSize)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				if _, err := c.PushDense(ctx, "fc_ada", g); err != nil {
					fmt.Println("push:", err)
					os.Exit(1)
				}
				if i == 0 && k == 2 {
					fmt.Println("pushing")
				}
			}
		}()
	}
	wg.Wait()
	return 0
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
