package ps_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/leakcheck"
	"github.com/goverbs/goverbs/ps"
)

// TestGoroutineLeaks: servers and clients made and closed several times,
// on every path (a normal close, the servers closed first, a failed
// NewServer and Dial, a call blocked on a server that never answers when
// the client closes), leave no goroutine behind once Close returned.
func TestGoroutineLeaks(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			e := envFor(t, tr)
			ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
			base := leakcheck.Take()
			spec := ps.Spec{Name: "emb", Kind: ps.Sparse, Dim: 4, Rows: 64, Opt: ps.Optimizer{Kind: ps.SGD, LR: 0.1}}
			keys := []uint64{1, 2, 3, 40}
			for round := range 3 {
				var ss []*ps.Server
				var addrs []string
				for range 2 {
					s, err := ps.NewServer(ps.ServerConfig{Transport: tr, Listen: e.ip + ":0", Device: e.srvDev, Token: token})
					if err != nil {
						t.Fatal(err)
					}
					ss, addrs = append(ss, s), append(addrs, s.Addr().String())
				}
				c, err := ps.Dial(ps.ClientConfig{Transport: tr, Servers: addrs, Device: e.cliDev, Token: token})
				if err != nil {
					t.Fatal(err)
				}
				must(t, c.Define(ctx, spec))
				g := make([]float32, len(keys)*spec.Dim)
				for i := range g {
					g[i] = 1
				}
				out := make([]float32, len(g))
				pulls := []*ps.Pending{c.PullAsync(ctx, spec.Name, keys, out), c.PushAsync(ctx, spec.Name, keys, g)}
				for _, p := range pulls {
					if _, err := p.Wait(); err != nil {
						t.Fatal(err)
					}
				}
				wd.Progress()
				if round == 1 {
					// The servers die first: the client's next call fails,
					// then it closes.
					for _, s := range ss {
						must(t, s.Close())
					}
					if err := c.Pull(ctx, spec.Name, keys, out); err == nil {
						t.Error("a pull from closed servers succeeded")
					}
					must(t, c.Close())
				} else {
					must(t, c.Close())
					for _, s := range ss {
						must(t, s.Close())
					}
				}
				wd.Progress()
			}
			base.Check(t, "servers and clients closed")

			// Constructors that fail: the address is taken, the device
			// does not exist.
			s, err := ps.NewServer(ps.ServerConfig{Transport: tr, Listen: e.ip + ":0", Device: e.srvDev, Token: token})
			if err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if s2, err := ps.NewServer(ps.ServerConfig{Transport: tr, Listen: s.Addr().String(), Device: e.srvDev, Token: token}); err == nil {
					s2.Close()
					t.Error("a second server on the same address")
				}
				if tr == "rdma" {
					if s2, err := ps.NewServer(ps.ServerConfig{Transport: tr, Listen: e.ip + ":0", Device: "nodev9", Token: token}); err == nil {
						s2.Close()
						t.Error("a server on device nodev9")
					}
					if c, err := ps.Dial(ps.ClientConfig{Transport: tr, Servers: []string{s.Addr().String()}, Device: "nodev9", Token: token}); err == nil {
						c.Close()
						t.Error("a client on device nodev9")
					}
				}
			}
			must(t, s.Close())
			base.Check(t, "failed NewServer and Dial")

			if tr != "tcp" {
				// Over rdma the same blocked call waits in bx's dial
				// handshake (bx's TestGoroutineLeaks covers it).
				return
			}
			// A call blocked on a server that accepts and never answers
			// ends when the client closes, and its goroutine with it.
			ln, err := net.Listen("tcp", e.ip+":0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			got := make(chan net.Conn, 8)
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					got <- c
				}
			}()
			for range 3 {
				c, err := ps.Dial(ps.ClientConfig{Transport: tr, Servers: []string{ln.Addr().String()}})
				if err != nil {
					t.Fatal(err)
				}
				p := c.PullAsync(context.Background(), spec.Name, keys, make([]float32, len(keys)*spec.Dim))
				var sc net.Conn
				select {
				case sc = <-got:
				case <-ctx.Done():
					t.Fatalf("the client never connected: %v", hang.Err(ctx))
				}
				// The request arrived: the call is now waiting for its
				// answer.
				if _, err := io.ReadFull(sc, make([]byte, 4)); err != nil {
					t.Fatal(err)
				}
				must(t, c.Close())
				select {
				case <-p.Done():
					if _, err := p.Wait(); err == nil {
						t.Error("a call cut short by Close succeeded")
					} else if errors.Is(err, context.Canceled) {
						t.Errorf("a call cut short by Close: %v", err)
					}
				case <-ctx.Done():
					t.Fatalf("a call blocked on a silent server did not end with Client.Close: %v", hang.Err(ctx))
				}
				sc.Close()
				wd.Progress()
			}
			ln.Close()
			base.Check(t, "clients closed during a blocked call")
		})
	}
}
