package bx_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestLargeEager: with Config.EagerSize raised on both ends, a call up to
// that size goes in one message each way (no rendezvous) and one above it
// by rendezvous, every payload intact.
func TestLargeEager(t *testing.T) {
	const eager = 64<<10 - bx.HeaderSize
	big := func(c *bx.Config) { c.EagerSize = eager }
	srv, cli, p, _ := pair(t, big)
	srv.HandleInline(1, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		return append([]byte(nil), req.Data()...), nil
	})
	ctx, wd := hang.For(t, "", 30*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	for _, n := range []int{8145, 32 << 10, eager, eager + 1, 100000} {
		before := cli.Stats().Rendezvous.Load() + srv.Stats().Rendezvous.Load()
		for i := range 3 {
			req := make([]byte, n)
			for j := range req {
				req[j] = byte(j*7 + i + n)
			}
			m, err := p.Call(ctx, 1, req)
			if err != nil {
				t.Fatalf("call of %d bytes: %v", n, err)
			}
			if !bytes.Equal(m.Data(), req) {
				t.Fatalf("call of %d bytes: the echo differs (%d bytes back)", n, len(m.Data()))
			}
			m.Release()
			wd.Progress()
		}
		rv := cli.Stats().Rendezvous.Load() + srv.Stats().Rendezvous.Load() - before
		if want := uint64(0); n > eager {
			if rv == 0 {
				t.Errorf("%d bytes, above EagerSize %d: no rendezvous counted", n, eager)
			}
		} else if rv != want {
			t.Errorf("%d bytes, within EagerSize %d: %d rendezvous counted, want none", n, eager, rv)
		}
	}
}

// TestEagerSizeMismatch: endpoints of different EagerSize refuse each
// other at the handshake, with an error naming the setting, and nothing
// stays routed (a larger message than the receiver's buffers would fail
// its QP again after every recovery).
func TestEagerSizeMismatch(t *testing.T) {
	da, db := rxetest.Pair(t)
	big := func(c *bx.Config) { c.EagerSize = 32 << 10 }
	for _, bigServer := range []bool{true, false} {
		srvMod, cliMod := big, func(*bx.Config) {}
		if !bigServer {
			srvMod, cliMod = cliMod, srvMod
		}
		srv, cli := newEndpoint(t, db, srvMod), newEndpoint(t, da, cliMod)
		addr, err := srv.Listen(listenAddr(t, db))
		if err != nil {
			t.Fatal(err)
		}
		ctx, wd := hang.For(t, "", 20*time.Second) // a hang bound (no progress), not a speed bound
		_, err = cli.Dial(ctx, addr.String())
		if !errors.Is(err, bx.ErrProtocol) || !strings.Contains(err.Error(), "Config.EagerSize") {
			t.Errorf("large server %v: dial between different eager sizes: %v, want a protocol error naming Config.EagerSize", bigServer, err)
		}
		t.Logf("large server %v: %v", bigServer, err)
		wd.Stop()
		if n := cli.QPsForTest() + srv.QPsForTest(); n != 0 {
			t.Errorf("large server %v: %d QPs routed after the failed dial", bigServer, n)
		}
	}
}
