// Package extest runs the example programs in their tests: the test
// binary doubles as the example program (Main, for a second process), and
// Start runs it as a child whose output the test waits on.
//
// Device tests must still import internal/rxetest themselves (and call
// rxetest.Pair): scripts/test finds the packages to run in the rxe guest
// by that import.
package extest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
)

// envArgs holds a child's arguments (a JSON list of strings): set, the
// test binary runs the example with them instead of the tests.
const envArgs = "GOVERBS_EXAMPLE_ARGS"

// Run is an example's run function.
type Run func(ctx context.Context, args []string, stdout io.Writer) error

// Main is an example's TestMain: with GOVERBS_EXAMPLE_ARGS set the process
// is the example program (SIGINT or SIGTERM cancel its context; exit
// status 1 on an error), else it runs the tests.
func Main(m *testing.M, run Run) {
	if spec, ok := os.LookupEnv(envArgs); ok {
		var args []string
		if err := json.Unmarshal([]byte(spec), &args); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", envArgs, err)
			os.Exit(2)
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := run(ctx, args, os.Stdout)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// ListenIP is the IPv4 address of the rxe guest's netdev under dev
// (docs/vm.md): rxe1 is on 10.99.0.2, rxe0 on 10.99.0.1.
func ListenIP(dev string) string {
	if dev == "rxe1" {
		return "10.99.0.2"
	}
	return "10.99.0.1"
}

// Proc is the example running as a child process.
type Proc struct {
	cmd  *exec.Cmd
	wd   *hang.Watchdog
	mu   sync.Mutex
	out  bytes.Buffer  // stdout and stderr
	kick chan struct{} // a write arrived (capacity 1)
	done chan struct{} // closed once the process exited and err is set
	err  error
}

// Start runs the test binary as the example program with args. Its output
// counts as progress for wd. The child is killed when the test ends, if it
// still runs.
func Start(t testing.TB, wd *hang.Watchdog, args ...string) *Proc {
	t.Helper()
	spec, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	p := &Proc{wd: wd, kick: make(chan struct{}, 1), done: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.cmd.Env = append(os.Environ(), envArgs+"="+string(spec))
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// Write collects the child's output.
func (p *Proc) Write(b []byte) (int, error) {
	p.wd.Progress()
	p.mu.Lock()
	p.out.Write(b)
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
	return len(b), nil
}

// Output is what the child printed so far.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// line returns the first complete line of output that starts with prefix.
func (p *Proc) line(prefix string) (string, bool) {
	out := p.Output()
	if i := strings.LastIndexByte(out, '\n'); i >= 0 {
		out = out[:i]
	} else {
		return "", false
	}
	for l := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l, true
		}
	}
	return "", false
}

// WaitLine waits for a line starting with prefix and returns it.
func (p *Proc) WaitLine(ctx context.Context, prefix string) (string, error) {
	for {
		if l, ok := p.line(prefix); ok {
			return l, nil
		}
		select {
		case <-p.kick:
		case <-p.done:
			if l, ok := p.line(prefix); ok {
				return l, nil
			}
			return "", fmt.Errorf("child exited (%v) before printing %q; output:\n%s", p.err, prefix, p.Output())
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for the child to print %q: %w; output:\n%s", prefix, hang.Err(ctx), p.Output())
		}
	}
}

// Addr waits for the server's "server: listening on ADDR ..." line and
// returns ADDR.
func (p *Proc) Addr(ctx context.Context) (string, error) {
	const prefix = "server: listening on "
	l, err := p.WaitLine(ctx, prefix)
	if err != nil {
		return "", err
	}
	f := strings.Fields(strings.TrimPrefix(l, prefix))
	if len(f) == 0 {
		return "", fmt.Errorf("no address in %q", l)
	}
	return f[0], nil
}

// Wait waits for the child to exit and returns its output; the error says
// why it failed, if it did.
func (p *Proc) Wait(ctx context.Context) (string, error) {
	select {
	case <-p.done:
		return p.Output(), p.err
	case <-ctx.Done():
		p.cmd.Process.Kill()
		<-p.done
		return p.Output(), fmt.Errorf("waiting for the child to exit: %w", hang.Err(ctx))
	}
}

// Stop interrupts the child (SIGINT, as Ctrl-C would) and waits for it
// to exit.
func (p *Proc) Stop(ctx context.Context) (string, error) {
	select {
	case <-p.done:
	default:
		if err := p.cmd.Process.Signal(os.Interrupt); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return p.Output(), err
		}
	}
	return p.Wait(ctx)
}

// CheckLines checks that each of want starts a line of out.
func CheckLines(t testing.TB, out string, want []string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	for _, w := range want {
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, w) }) {
			t.Errorf("no line starting with %q in the output", w)
		}
	}
}

// Both runs an example with both roles in this process, as `go run` does:
// the server on db, the client on da (rxetest.Pair's devices). Its output
// must hold a line starting with each of want.
func Both(t *testing.T, run Run, da, db string, want []string) {
	t.Helper()
	ctx, wd := hang.For(t, "", time.Minute) // a hang bound (no progress), not a speed bound
	var out bytes.Buffer
	err := run(ctx, []string{"-role", "both", "-d", db + "," + da, "-addr", ListenIP(db) + ":0"}, wd.Writer(&out))
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(hang.Cause(ctx, err))
	}
	CheckLines(t, out.String(), want)
}

// TwoProcesses runs an example's server as a second process (this test
// binary again, see Main) on db and its client here on da. With
// serverEnds the server must exit by itself once the client is done;
// otherwise it is interrupted (SIGINT, as Ctrl-C) after the client. Either
// way it must exit with status 0. The client's and the server's output
// must hold a line starting with each of cli and srv.
func TwoProcesses(t *testing.T, run Run, da, db string, serverEnds bool, cli, srv []string) {
	t.Helper()
	ctx, wd := hang.For(t, "", time.Minute) // a hang bound (no progress), not a speed bound
	p := Start(t, wd, "-role", "server", "-d", db, "-addr", ListenIP(db)+":0")
	addr, err := p.Addr(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = run(ctx, []string{"-role", "client", "-d", da, "-addr", addr}, wd.Writer(&out))
	t.Logf("client output:\n%s", out.String())
	if err != nil {
		t.Fatal(hang.Cause(ctx, err))
	}
	CheckLines(t, out.String(), cli)
	var srvOut string
	if serverEnds {
		srvOut, err = p.Wait(ctx)
	} else {
		srvOut, err = p.Stop(ctx)
	}
	t.Logf("server output:\n%s", srvOut)
	if err != nil {
		t.Fatalf("server: %v", err)
	}
	CheckLines(t, srvOut, srv)
}

// BadFlags checks that an example's flag errors are errors, returned
// before any device is opened.
func BadFlags(t *testing.T, run Run) {
	t.Helper()
	for _, args := range [][]string{{"-role", "peer"}, {"-role", "both", "-d", "rxe1"}, {"extra"}} {
		if err := run(t.Context(), args, &bytes.Buffer{}); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
}
