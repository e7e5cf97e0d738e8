package metrics

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// parseText reads the goverbs_ samples of a text exposition: name{labels}
// -> value.
func parseText(t *testing.T, body string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "goverbs_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// TestDeviceScrape: two endpoints on the two rxe devices make RPC calls;
// the HTTP endpoint then shows that work: one latency observation per call
// of each stream class, the messages, a peer on each side, the pools in
// use.
func TestDeviceScrape(t *testing.T) {
	da, db := rxetest.Pair(t)
	token := []byte("metrics-device-test-token")
	mk := func(dev string) *bx.Endpoint {
		e, err := bx.New(bx.Config{Device: dev, Token: token})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	cli, srv := mk(da), mk(db)
	listen := "127.0.0.1:0"
	if db == "rxe1" {
		listen = "10.99.0.2:0"
	}
	addr, err := srv.Listen(listen)
	if err != nil {
		t.Fatal(err)
	}
	srv.Handle(1, func(_ context.Context, _ *bx.Peer, m *bx.Msg) ([]byte, error) { return m.Data(), nil })
	srv.Handle(2, func(_ context.Context, _ *bx.Peer, m *bx.Msg) ([]byte, error) { return []byte("ok"), nil })
	ctx, wd := hang.For(t, "", time.Minute) // a hang bound (no progress), not a speed bound
	p, err := cli.Dial(ctx, addr.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Accept(ctx); err != nil {
		t.Fatal(err)
	}
	calls := map[uint32]int{1: 25, 2: 12}
	big := make([]byte, 128<<10) // rendezvous (above bx's SplitSize)
	for st, n := range calls {
		for i := range n {
			req := []byte("x")
			if st == 2 && i%3 == 0 {
				req = big
			}
			m, err := p.Call(ctx, st, req)
			if err != nil {
				t.Fatalf("stream %d call %d: %v", st, i, hang.Cause(ctx, err))
			}
			m.Release()
			wd.Progress()
		}
	}

	c := NewCollector()
	must(t, c.AddBX(cli))
	must(t, c.AddBX(srv))
	url, _ := serveTest(t, c)
	got := parseText(t, get(t, url))
	total := 0
	for st, n := range calls {
		total += n
		k := `goverbs_bx_rpc_latency_seconds_count{device="` + da + `",stream_class="` + strconv.Itoa(int(st)) + `"}`
		if got[k] != float64(n) {
			t.Errorf("%s = %v, want %d", k, got[k], n)
		}
		inf := `goverbs_bx_rpc_latency_seconds_bucket{device="` + da + `",stream_class="` + strconv.Itoa(int(st)) + `",le="+Inf"}`
		sum := `goverbs_bx_rpc_latency_seconds_sum{device="` + da + `",stream_class="` + strconv.Itoa(int(st)) + `"}`
		if got[inf] != float64(n) || got[sum] <= 0 {
			t.Errorf("%s = %v, %s = %v", inf, got[inf], sum, got[sum])
		}
	}
	for k, ok := range map[string]bool{
		`goverbs_bx_messages_sent_total{device="` + da + `"}`:                 got[`goverbs_bx_messages_sent_total{device="`+da+`"}`] == float64(total),
		`goverbs_bx_messages_received_total{device="` + db + `"}`:             got[`goverbs_bx_messages_received_total{device="`+db+`"}`] == float64(total),
		`goverbs_bx_rendezvous_total{device="` + db + `"}`:                    got[`goverbs_bx_rendezvous_total{device="`+db+`"}`] == 4,
		`goverbs_bx_peers{device="` + da + `"}`:                               got[`goverbs_bx_peers{device="`+da+`"}`] == 1,
		`goverbs_bx_peers{device="` + db + `"}`:                               got[`goverbs_bx_peers{device="`+db+`"}`] == 1,
		`goverbs_bx_allocator_in_use_bytes{device="` + da + `",pool="eager"}`: got[`goverbs_bx_allocator_in_use_bytes{device="`+da+`",pool="eager"}`] > 0,
		`goverbs_bx_allocator_in_use_bytes{device="` + db + `",pool="eager"}`: got[`goverbs_bx_allocator_in_use_bytes{device="`+db+`",pool="eager"}`] > 0,
		`goverbs_bx_allocator_allocs_total{device="` + da + `",pool="rndv"}`:  got[`goverbs_bx_allocator_allocs_total{device="`+da+`",pool="rndv"}`] == 4,
		`goverbs_bx_allocator_allocs_total{device="` + db + `",pool="large"}`: got[`goverbs_bx_allocator_allocs_total{device="`+db+`",pool="large"}`] == 4,
	} {
		if !ok {
			t.Errorf("%s = %v", k, got[k])
		}
	}
	// The peer series: the client's peer is the server's incarnation.
	peer := fmt.Sprintf(`{device=%q,peer="%016x"}`, da, srv.ID())
	if v, ok := got["goverbs_bx_peer_messages_sent_total"+peer]; !ok || v != float64(total) {
		t.Errorf("goverbs_bx_peer_messages_sent_total%s = %v (present %v), want %d", peer, v, ok, total)
	}
	if v, ok := got["goverbs_bx_peer_credits_available"+peer]; !ok || v <= 0 {
		t.Errorf("goverbs_bx_peer_credits_available%s = %v (present %v)", peer, v, ok)
	}
	t.Logf("%d goverbs_ samples", len(got))
}
