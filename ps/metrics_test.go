package ps_test

import (
	"errors"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/ps"
)

func opsOf(ops []ps.OpMetrics) map[string]ps.OpMetrics {
	m := map[string]ps.OpMetrics{}
	for _, o := range ops {
		m[o.Op] = o
	}
	return m
}

// TestMetrics: the client and server operation counters are the calls the
// test made; on rdma the client's bx RPC counts are the servers' requests.
func TestMetrics(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			e := envFor(t, tr)
			srvs, addrs := e.servers(t, 2, nil)
			c := e.client(t, addrs)
			ctx, _ := hang.For(t, "ps metrics calls over "+tr, 2*time.Minute) // a hang bound: the calls are few
			emb := ps.Spec{Name: "emb", Kind: ps.Sparse, Dim: 4, Rows: 100, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.1}, Seed: 1}
			fc := ps.Spec{Name: "fc", Kind: ps.Dense, Size: 64, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.1}, Seed: 2}
			must(t, c.Define(ctx, emb, fc))
			const pulls, pushes, dense = 30, 10, 5
			row := make([]float32, 4)
			for i := range pulls {
				must(t, c.Pull(ctx, "emb", []uint64{uint64(i)}, row))
			}
			for i := range pushes {
				_, err := c.Push(ctx, "emb", []uint64{uint64(i)}, row)
				must(t, err)
			}
			if err := c.Pull(ctx, "emb", []uint64{1}, make([]float32, 3)); !errors.Is(err, ps.ErrDim) {
				t.Fatalf("pull of the wrong dimension: %v", err)
			}
			out := make([]float32, 64)
			for range dense {
				must(t, c.PullDense(ctx, "fc", out))
			}

			cm := c.Metrics()
			if cm.Transport != tr {
				t.Errorf("client transport %q", cm.Transport)
			}
			want := map[string][2]uint64{"define": {1, 0}, "pull": {pulls + 1, 1}, "push": {pushes, 0}, "pull-dense": {dense, 0}}
			got := opsOf(cm.Ops)
			if len(got) != len(want) {
				t.Errorf("client ops %+v, want %v", cm.Ops, want)
			}
			for op, w := range want {
				o := got[op]
				if o.Requests != w[0] || o.Errors != w[1] || o.Latency.Count != w[0] || o.Latency.Sum <= 0 {
					t.Errorf("client %s: %d calls, %d errors, latency count %d sum %v; want %d, %d", op, o.Requests, o.Errors, o.Latency.Count, o.Latency.Sum, w[0], w[1])
				}
			}

			// Servers: every single-key pull and push is one request on one
			// server; emb is defined on both, fc on one. The wrong-dimension
			// pull fails there (the client does not know the dimension).
			sum := map[string][2]uint64{}
			var reqs, errs uint64
			for _, s := range srvs {
				m := s.Metrics()
				if m.Transport != tr {
					t.Errorf("server transport %q", m.Transport)
				}
				reqs += m.Requests
				errs += m.Errors
				var opReqs uint64
				for _, o := range m.Ops {
					sum[o.Op] = [2]uint64{sum[o.Op][0] + o.Requests, sum[o.Op][1] + o.Errors}
					opReqs += o.Requests
					if o.Latency.Count != o.Requests {
						t.Errorf("server %s: latency count %d of %d requests", o.Op, o.Latency.Count, o.Requests)
					}
				}
				if opReqs != m.Requests {
					t.Errorf("server: ops sum to %d requests of %d", opReqs, m.Requests)
				}
			}
			wantSrv := map[string][2]uint64{"define": {3, 0}, "pull": {pulls + 1, 1}, "push": {pushes, 0}, "pull-dense": {dense, 0}}
			for op, w := range wantSrv {
				if sum[op] != w {
					t.Errorf("servers %s: %v requests, errors; want %v", op, sum[op], w)
				}
			}
			// No request outside Client's operations (the rdma client no
			// longer probes a peer after dialing it).
			if n := sum["stats"][0]; n != 0 {
				t.Errorf("%d stats requests on the servers", n)
			}
			if errs != 1 || reqs != 3+pulls+1+pushes+dense {
				t.Errorf("servers: %d requests, %d errors", reqs, errs)
			}
			ep := c.Endpoint()
			if tr == "tcp" {
				if ep != nil {
					t.Error("tcp client has a bx endpoint")
				}
				return
			}
			var calls uint64
			for _, cl := range ep.Snapshot().Classes {
				calls += cl.Latency.Count
			}
			if calls != reqs {
				t.Errorf("client bx calls %d, server requests %d", calls, reqs)
			}
		})
	}
}

func TestMetricsNil(t *testing.T) {
	var s *ps.Server
	var c *ps.Client
	if m := s.Metrics(); m.Ops != nil || m.Requests != 0 {
		t.Errorf("nil server metrics %+v", m)
	}
	if m := c.Metrics(); m.Ops != nil || c.Endpoint() != nil {
		t.Errorf("nil client metrics %+v", m)
	}
}
