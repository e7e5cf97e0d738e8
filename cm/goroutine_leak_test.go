package cm_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/leakcheck"
)

// TestGoroutineLeaks: a Channel's event reader ends with Close, on every
// path: a listener's GetRequest blocked when its ID or the channel
// (with IDs open) closes, a channel whose IDs resolved addresses (events
// came through the reader) closed with them open.
func TestGoroutineLeaks(t *testing.T) {
	needCM(t)
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	base := leakcheck.Take()
	srvIP := netip.MustParseAddr("10.99.0.2")
	cliIP := netip.MustParseAddr("10.99.0.1")
	for round := range 3 {
		srv, err := cm.Open()
		if err != nil {
			t.Fatal(err)
		}
		cli, err := cm.Open()
		if err != nil {
			t.Fatal(err)
		}
		var lns []*cm.ID
		blocked := make(chan error, 2)
		for range 2 {
			ln, err := srv.CreateID(cm.TCP)
			if err != nil {
				t.Fatal(err)
			}
			if err := ln.Bind(netip.AddrPortFrom(srvIP, 0)); err != nil {
				t.Fatal(err)
			}
			if err := ln.Listen(4); err != nil {
				t.Fatal(err)
			}
			lns = append(lns, ln)
			go func() {
				_, err := ln.GetRequest(context.Background())
				blocked <- err
			}()
		}
		rt, err := lns[0].Query()
		if err != nil {
			t.Fatal(err)
		}
		// Events through the client channel's reader.
		id, err := cli.CreateID(cm.TCP)
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, hang.Scale(30*time.Second))
		if err := id.ResolveAddr(rctx, cliIP, netip.AddrPortFrom(srvIP, rt.Src.Port())); err != nil {
			t.Fatal(err)
		}
		cancel()
		// One listener closed under its GetRequest, the other by the
		// channel's Close; the client channel closes with its ID open.
		if err := lns[0].Close(); err != nil {
			t.Fatal(err)
		}
		if round%2 == 0 {
			if err := srv.Close(); err != nil {
				t.Fatal(err)
			}
			if err := cli.Close(); err != nil {
				t.Fatal(err)
			}
		} else {
			if err := cli.Close(); err != nil {
				t.Fatal(err)
			}
			if err := srv.Close(); err != nil {
				t.Fatal(err)
			}
		}
		for range 2 {
			select {
			case err := <-blocked:
				if err == nil {
					t.Error("GetRequest returned a request nobody sent")
				}
			case <-ctx.Done():
				t.Fatalf("a GetRequest did not end with its ID's or channel's Close: %v", hang.Err(ctx))
			}
		}
		wd.Progress()
	}
	base.Check(t, "channels closed")
}
