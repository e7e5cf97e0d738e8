package bx_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestTLS: with Config.TLS the control connection runs over TLS with
// mutual authentication: RPC works, a peer whose certificate another
// authority signed is refused with ErrTLS (both directions), and recovery
// (credit resync, lane rebuild over the control connection) works over it.
func TestTLS(t *testing.T) {
	pk := bx.NewTestPKI(t)
	srv, cli, p, sp := pair(t, func(c *bx.Config) {
		cert := pk.Server
		if c.Device != "rxe1" {
			cert = pk.Client
		}
		c.TLS = pk.Config(cert)
	})
	if !p.ControlTLSForTest() || !sp.ControlTLSForTest() {
		t.Fatal("control connection not over TLS")
	}
	srv.Handle(9, func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) { return req.Data(), nil })
	ctx, wd := hang.For(t, "", 90*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	m, err := p.Call(ctx, 9, []byte("over tls"))
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data()) != "over tls" {
		t.Errorf("response %q", m.Data())
	}
	m.Release()

	// Recovery over TLS: break the client's QPs mid-stream; every message
	// arrives once, in order.
	const n = 200
	numberedAcrossBreak(t, ctx, wd, p, sp, n)
	if cli.Stats().Recoveries.Load() == 0 {
		t.Error("no recovery counted")
	}
	if m, err := p.Call(ctx, 9, []byte("after recovery")); err != nil {
		t.Fatalf("call after recovery: %v", err)
	} else {
		m.Release()
	}
	wd.Progress()

	// A client whose certificate another authority signed.
	da, _ := rxetest.Pair(t)
	addr := srv.ListenAddrs()[0].String()
	dial := func(cfg bx.Config) error {
		cfg.Device, cfg.Token = da, token
		e, err := bx.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		_, err = e.Dial(ctx, addr)
		wd.Progress() // each refused dial is a step: the hang bound starts again
		return err
	}
	err = dial(bx.Config{TLS: pk.Config(pk.Stranger)})
	t.Logf("stranger: %v", err)
	if !errors.Is(err, bx.ErrTLS) {
		t.Errorf("dial with a certificate of another authority: %v, want ErrTLS", err)
	}
	// A client that does not trust the server's authority.
	strict := pk.Config(pk.Client)
	strict.RootCAs = nil
	err = dial(bx.Config{TLS: strict})
	t.Logf("untrusted server: %v", err)
	if !errors.Is(err, bx.ErrTLS) || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("dial to an untrusted server: %v, want ErrTLS about its certificate", err)
	}
	// A client without TLS.
	err = dial(bx.Config{HandshakeTimeout: 2 * time.Second})
	t.Logf("plain client: %v", err)
	if err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Errorf("dial without TLS: %v, want an error that mentions TLS", err)
	}
}
