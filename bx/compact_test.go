package bx_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
)

// TestCompactHeaders: in steady state requests, responses and stream
// messages go compact (their header in the immediate, wire.go), with
// every payload intact, through a recovery too: the first message on each
// new QP goes in full, and compact ones follow it again.
func TestCompactHeaders(t *testing.T) {
	if os.Getenv("GOVERBS_BX_COMPACT") == "0" {
		t.Skip("GOVERBS_BX_COMPACT=0 sends every header in full")
	}
	srv, cli, p, sp := pair(t, nil)
	srv.Handle(7, func(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		return append([]byte("echo:"), req.Data()...), nil
	})
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	// Up to the largest eager payload whose response (5 bytes more) is
	// eager too.
	sizes := []int{0, 1, 64, 1000, 4096 - 5, 4096, 8192 - bx.HeaderSize - 5}
	round := func(tag string) int {
		n := 0
		for i := range 40 {
			for _, size := range sizes {
				req := bytes.Repeat([]byte{byte(i + size)}, size)
				copy(req, fmt.Sprintf("%s-%d-%d", tag, i, size))
				m, err := p.Call(ctx, 7, req)
				if err != nil {
					t.Fatalf("%s call %d of %d bytes: %v", tag, i, size, hang.Cause(ctx, err))
				}
				if !bytes.Equal(m.Data(), append([]byte("echo:"), req...)) {
					t.Fatalf("%s call %d of %d bytes answered %d bytes %.40q", tag, i, size, len(m.Data()), m.Data())
				}
				m.Release()
				n++
			}
			// A stream's message (no flags) both ways.
			msg := fmt.Appendf(nil, "%s-stream-%d", tag, i)
			if err := p.Stream(3).Send(ctx, msg); err != nil {
				t.Fatal(hang.Cause(ctx, err))
			}
			m, err := sp.Stream(3).Recv(ctx)
			if err != nil {
				t.Fatal(hang.Cause(ctx, err))
			}
			if !bytes.Equal(m.Data(), msg) {
				t.Fatalf("stream message %q, sent %q", m.Data(), msg)
			}
			m.Release()
			n++
			wd.Progress()
		}
		return n
	}
	sent := round("a")
	// Each lane's (two) first message goes in full, and so may a second
	// after a large jump of the credits or acknowledgement; the rest go
	// compact, whatever the stream and size.
	const full = 2 * 2
	c, s := cli.Stats().Compact.Load(), srv.Stats().Compact.Load()
	if c+full < uint64(sent) || s+full < uint64(sent-40) {
		t.Fatalf("compact messages: client %d of %d, server %d of %d", c, sent, s, sent-40)
	}
	if err := p.BreakLanesForTest(); err != nil {
		t.Fatal(err)
	}
	sent = round("b")
	if cli.Stats().Recoveries.Load() == 0 {
		t.Fatal("no recovery counted")
	}
	if c2 := cli.Stats().Compact.Load(); c2-c+full < uint64(sent) {
		t.Fatalf("after recovery: %d compact messages of the client's %d", c2-c, sent)
	}
	t.Logf("compact: client %d, server %d; duplicates at the server %d", cli.Stats().Compact.Load(), srv.Stats().Compact.Load(), srv.Stats().Duplicates.Load())
}
