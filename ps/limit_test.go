package ps_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/ps"
)

// TestStorageLimit: a server bounds its parameter storage in all
// (Store.MaxBytes), not only per parameter: defines past it, and pushes
// that would materialise rows past it, fail with ErrTooLarge naming the
// limit and change nothing; pushes to rows already there go on. Any
// number of parameters of up to MaxValues each, and any number of rows
// of a sparse table (materialised on first push), were taken: workers
// made a server allocate without bound.
func TestStorageLimit(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			e := envFor(t, tr)
			const limit = 1 << 20
			// A server of its own for each part: each starts with the
			// whole limit.
			server := func() (*ps.Store, *ps.Client) {
				srvs, addrs := e.servers(t, 1, func(c *ps.ServerConfig) { c.Store.MaxBytes = limit })
				return srvs[0].Store(), e.client(t, addrs)
			}
			ctx, wd := hang.For(t, "ps storage limit over "+tr, 2*time.Minute) // catches a hang, not a slow run
			over := func(what string, err error, text ...string) {
				t.Helper()
				var se *ps.ServerError
				if !errors.As(err, &se) || !errors.Is(err, ps.ErrTooLarge) {
					t.Fatalf("%s: %v; want a *ServerError that is ErrTooLarge", what, err)
				}
				for _, s := range append(text, "Store.MaxBytes) of 1 MiB") {
					if !strings.Contains(err.Error(), s) {
						t.Fatalf("%s: %v; want it to say %q", what, err, s)
					}
				}
				t.Logf("%s: %v", what, err)
			}

			// Sparse rows: a table too large for a bitmap (each push's
			// rows are counted without one), and one with a bitmap.
			for _, s := range []ps.Spec{
				{Name: "huge", Kind: ps.Sparse, Dim: 64, Rows: 1 << 40, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.1}, Seed: 1},
				{Name: "small", Kind: ps.Sparse, Dim: 64, Rows: 1 << 16, Opt: ps.Optimizer{Kind: ps.Adagrad, LR: 0.1, Eps: 1e-6}, Seed: 2},
			} {
				st, c := server()
				must(t, c.Define(ctx, s))
				wd.Progress()
				keys := make([]uint64, 500)
				grads := make([]float32, 500*64)
				for i := range grads {
					grads[i] = 1
				}
				var err error
				base := uint64(0)
				for n := 0; n < 100; n++ { // far more than fit
					for i := range keys {
						keys[i] = base + uint64(i)
					}
					if _, err = c.Push(ctx, s.Name, keys, grads); err != nil {
						break
					}
					base += uint64(len(keys))
					wd.Progress()
				}
				if base == 0 {
					t.Fatalf("%q: the first push failed: %v", s.Name, err)
				}
				over(fmt.Sprintf("push of 500 new rows to %q after %d", s.Name, base), err, fmt.Sprintf("push to %q would materialise", s.Name), "nothing applied")
				if b := st.Bytes(); b > limit {
					t.Errorf("the store counts %d bytes, over its limit of %d", b, limit)
				}
				// Nothing of the refused push was applied: its rows still
				// pull as never pushed (a fresh table's initial values).
				ref := ps.NewStore(ps.StoreConfig{})
				must(t, ref.Define(s))
				want := make([]float32, len(keys)*64)
				must(t, ref.Pull(s.Name, keys, want))
				got := make([]float32, len(keys)*64)
				must(t, c.Pull(ctx, s.Name, keys, got))
				for i := range got {
					if got[i] != want[i] {
						t.Fatalf("%q: key %d after the refused push: %v, want its initial %v", s.Name, keys[i/64], got[i], want[i])
					}
				}
				// Rows already there are still pushed to at the limit.
				if res, err := c.Push(ctx, s.Name, []uint64{0, 1}, grads[:128]); err != nil || res.Applied != 2 {
					t.Errorf("push to rows already there, at the limit: %+v, %v", res, err)
				}
			}

			// Defines: a parameter that does not fit is refused; the
			// server goes on serving.
			st, c := server()
			must(t, c.Define(ctx, ps.Spec{Name: "small", Kind: ps.Sparse, Dim: 64, Rows: 10, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.1}}))
			err := c.Define(ctx, ps.Spec{Name: "dense", Kind: ps.Dense, Size: 1 << 18, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.1}})
			over("define of a 1 MiB dense tensor", err, `defining "dense" needs 1 MiB`)
			var n int
			for n = 0; n < 1000; n++ { // far more than fit
				if err = c.Define(ctx, ps.Spec{Name: fmt.Sprint("t", n), Kind: ps.Sparse, Dim: 4, Rows: 1 << 20, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.1}}); err != nil {
					break
				}
				wd.Progress()
			}
			if n == 0 {
				t.Fatalf("the first define of a sparse table failed: %v", err)
			}
			over(fmt.Sprintf("define of a sparse table after %d", n), err, fmt.Sprintf(`defining "t%d" needs`, n))
			if b := st.Bytes(); b > limit {
				t.Errorf("the store counts %d bytes, over its limit of %d", b, limit)
			}
			must(t, c.Pull(ctx, "small", []uint64{0}, make([]float32, 64)))
		})
	}
}

// TestStorageLimitConfig: a negative MaxBytes is refused, 0 is the
// default.
func TestStorageLimitConfig(t *testing.T) {
	s, err := ps.NewServer(ps.ServerConfig{Transport: "tcp", Listen: "127.0.0.1:0", Store: ps.StoreConfig{MaxBytes: -1}})
	if err == nil {
		s.Close()
		t.Fatal("NewServer with Store.MaxBytes -1 succeeded")
	}
	if !strings.Contains(err.Error(), "Store.MaxBytes -1") {
		t.Errorf("NewServer with Store.MaxBytes -1: %v, want it named", err)
	}
	st := ps.NewStore(ps.StoreConfig{})
	if err := st.Define(ps.Spec{Name: "d", Kind: ps.Dense, Size: 1 << 24, Opt: ps.Optimizer{Kind: ps.Adagrad, LR: 1, Eps: 1}}); err != nil {
		t.Errorf("a 128 MiB tensor under the default limit: %v", err)
	}
	if b := st.Bytes(); b < 128<<20 || b > ps.DefaultMaxBytes {
		t.Errorf("the store counts %d bytes for a 128 MiB tensor", b)
	}
}
