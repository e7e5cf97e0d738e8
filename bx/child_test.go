package bx_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestMain doubles as a bx server process for the tests that kill their
// peer: GOVERBS_BX_CHILD=DEVICE,ADDR runs an echo server until killed.
func TestMain(m *testing.M) {
	if dir := os.Getenv("GOVERBS_BX_POLLER"); dir != "" {
		// A process of the pollers registry (pollers_internal_test.go):
		// registered until killed.
		if err := bx.RegisterPollerForTest(dir); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("ready")
		for {
			// Not select {}: with no other goroutine the runtime calls
			// that a deadlock and exits, dropping the registration.
			time.Sleep(time.Hour)
		}
	}
	if spec := os.Getenv("GOVERBS_BX_CHILD"); spec != "" {
		dev, addr, _ := strings.Cut(spec, ",")
		addr, mode, _ := strings.Cut(addr, ",") // mode "cm": Config.LaneSetup CM
		os.Exit(childServer(dev, addr, mode == "cm"))
	}
	hang.OnDump(bx.DumpState)      // a hang's report shows credits and windows
	os.Exit(rxetest.RunChecked(m)) // and no kernel object or fd left behind
}

func childServer(dev, addr string, cm bool) int {
	cfg := bx.Config{Device: dev, Token: token}
	if cm {
		cfg.LaneSetup = bx.LaneSetupCM
	}
	e, err := bx.New(cfg)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	e.Handle(1, func(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		return req.Data(), nil
	})
	a, err := e.Listen(addr)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("ready", a)
	select {}
}

func startChild(t *testing.T, dev, addr string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GOVERBS_BX_CHILD="+dev+","+addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready") {
		cmd.Process.Kill()
		t.Fatalf("child server: %q %v", line, err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// TestPeerKilledAndRestarted kills the server process (kill -9) while calls
// are in flight: every call returns exactly once, successes carry their
// own payload, failures say the peer is gone; a restarted server (a new
// incarnation) is dialed again and serves.
func TestPeerKilledAndRestarted(t *testing.T) {
	da, db := rxetest.Pair(t)
	const addr = "10.99.0.2:18800"
	child := startChild(t, db, addr)
	cli, err := bx.New(bx.Config{Device: da, Token: token, PeerTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	p, err := cli.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	first := p.ID()
	var started, returned, ok, gone atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				req := fmt.Appendf(nil, "g%d-%d", g, i)
				started.Add(1)
				cctx, c := context.WithTimeout(ctx, hang.Scale(15*time.Second))
				m, err := p.Call(cctx, 1, req)
				c()
				returned.Add(1)
				switch {
				case err == nil:
					if string(m.Data()) != string(req) {
						t.Errorf("call %s answered %q", req, m.Data())
					}
					m.Release()
					ok.Add(1)
					wd.Progress()
				case errors.Is(err, bx.ErrPeerGone) || errors.Is(err, bx.ErrRecovering):
					gone.Add(1)
					return
				default:
					t.Errorf("call %s: %v", req, err)
					return
				}
			}
		}()
	}
	// Kill once calls are succeeding (a slow machine takes longer to get
	// there; a fixed sleep could kill before the first success).
	for ok.Load() < 8 {
		if ctx.Err() != nil {
			t.Fatalf("no 8 calls succeeded before the kill: %v", hang.Err(ctx))
		}
		time.Sleep(10 * time.Millisecond)
	}
	child.Process.Signal(syscall.SIGKILL)
	child.Wait()
	select {
	case <-p.Done():
	case <-time.After(hang.Scale(20 * time.Second)):
		t.Fatalf("the client did not notice its peer died in %v (%s)", hang.Scale(20*time.Second), hang.How())
	}
	close(stop)
	wg.Wait()
	if started.Load() != returned.Load() {
		t.Fatalf("%d calls started, %d returned", started.Load(), returned.Load())
	}
	t.Logf("%d calls succeeded before the kill, %d failed with %v", ok.Load(), gone.Load(), p.Err())
	if ok.Load() == 0 || gone.Load() == 0 {
		t.Errorf("want successes before the kill and peer-gone failures after (ok %d, gone %d)", ok.Load(), gone.Load())
	}
	// A new incarnation on the same address.
	startChild(t, db, addr)
	p2, err := cli.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	if p2.ID() == first {
		t.Error("the restarted server has the same incarnation id")
	}
	m, err := p2.Call(ctx, 1, []byte("again"))
	if err != nil || string(m.Data()) != "again" {
		t.Fatalf("call to the restarted server: %v", err)
	}
	m.Release()
}
