package bx_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// startPoller runs this test binary as a process registered in the
// pollers registry dir (TestMain, GOVERBS_BX_POLLER) and waits until it
// is; it stays until killed (at the latest by the test's cleanup).
func startPoller(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GOVERBS_BX_POLLER="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("poller process: %q, %v", line, err)
	}
	return cmd
}

// countUntil counts the registry until it reports want, 5 times at most
// (50 ms apart), and logs a count that missed: the count is exact, a
// retry only keeps a transient miss (an interrupted flock, now retried)
// from failing the run without saying so.
func countUntil(t *testing.T, want int) (int, bool) {
	t.Helper()
	var n int
	var spare bool
	for i := range 5 {
		if n, spare = bx.MachinePollersForTest(); n == want {
			return n, spare
		}
		t.Logf("count %d: %d pollers, want %d", i+1, n, want)
		time.Sleep(50 * time.Millisecond)
	}
	return n, spare
}

// registryState says what the registry holds and which of cmds live,
// for a failure's message.
func registryState(reg string, cmds []*exec.Cmd) string {
	var names []string
	ents, err := os.ReadDir(reg)
	for _, e := range ents {
		names = append(names, e.Name())
	}
	var live []string
	for _, c := range cmds {
		live = append(live, fmt.Sprintf("%d:%v", c.Process.Pid, c.Process.Signal(syscall.Signal(0)) == nil))
	}
	return fmt.Sprintf("registry %v (%v), this process %d, others (pid:alive) %v", names, err, os.Getpid(), live)
}

// TestPollersRegistry: processes that may poll register in a directory;
// the count sees every live one (other processes and this one), forgets
// and removes the file of one that was killed, and drops this process's
// own registration when its last endpoint goes; the machine has no core
// to spare once the processes outnumber its CPUs.
func TestPollersRegistry(t *testing.T) {
	t.Setenv("GOVERBS_POLLERS_DIR", filepath.Join(t.TempDir(), "reg"))
	reg := bx.PollersDirForTest()
	self := filepath.Join(reg, strconv.Itoa(os.Getpid()))
	bx.RegisterEndpointPollerForTest()
	bx.RegisterEndpointPollerForTest() // a second endpoint: still one process
	if n, _ := bx.MachinePollersForTest(); n != 1 {
		t.Fatalf("registered alone: %d pollers, want 1", n)
	}
	others := runtime.NumCPU()
	var cmds []*exec.Cmd
	for range others {
		cmds = append(cmds, startPoller(t, reg))
	}
	if n, spare := countUntil(t, others+1); n != others+1 || spare {
		t.Fatalf("%d other processes registered: %d pollers (want %d), a core for each %v on %d CPUs; %s",
			others, n, others+1, spare, runtime.NumCPU(), registryState(reg, cmds))
	}
	// A killed process leaves its file unlocked: not counted, removed.
	victim := cmds[0]
	victim.Process.Kill()
	victim.Wait()
	file := filepath.Join(reg, strconv.Itoa(victim.Process.Pid))
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("the killed process's file: %v (it outlives the process until a count)", err)
	}
	if n, spare := countUntil(t, others); n != others || !spare {
		t.Errorf("after a kill: %d pollers (want %d), a core for each %v; %s", n, others, spare, registryState(reg, cmds[1:]))
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("the killed process's file after a count: %v, want it removed", err)
	}
	// This process leaves when its last endpoint does.
	bx.UnregisterEndpointPollerForTest()
	if _, err := os.Stat(self); err != nil {
		t.Errorf("one endpoint of two gone: this process's file: %v, want it kept", err)
	}
	bx.UnregisterEndpointPollerForTest()
	if _, err := os.Stat(self); !os.IsNotExist(err) {
		t.Errorf("last endpoint gone: this process's file: %v, want it removed", err)
	}
	if n, _ := bx.MachinePollersForTest(); n != 1 {
		t.Errorf("unregistered: %d pollers, want 1 (a process counts itself)", n)
	}
	if ents, _ := os.ReadDir(reg); len(ents) != others-1 {
		t.Errorf("the registry holds %d files, want the %d live others'", len(ents), others-1)
	}
}

// TestPollersUnusable: a registry that cannot be made leaves the count
// at 1 (the process polls as if alone), with no error to anyone.
func TestPollersUnusable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOVERBS_POLLERS_DIR", file) // a file: no directory can be made under it
	bx.RegisterEndpointPollerForTest()
	defer bx.UnregisterEndpointPollerForTest()
	if n, spare := bx.MachinePollersForTest(); n != 1 || !spare {
		t.Errorf("unusable registry: %d pollers, a core for each %v; want 1, true", n, spare)
	}
}

// TestPollersCrowded: a process's only endpoint polls while the machine's
// processes that may poll fit its CPUs, and sleeps on events once they
// outnumber them. A client whose echo server runs in a child process
// (2 processes) takes its responses by polling, with few event wake-ups;
// with as many more registered processes as CPUs, its Calls wait for
// events, about one wake-up each.
func TestPollersCrowded(t *testing.T) {
	if runtime.NumCPU() < 2 || runtime.GOMAXPROCS(0) < 2 {
		t.Skipf("%d CPUs, GOMAXPROCS %d: an endpoint never polls here", runtime.NumCPU(), runtime.GOMAXPROCS(0))
	}
	dir := filepath.Join(t.TempDir(), "reg")
	t.Setenv("GOVERBS_POLLERS_DIR", dir) // the child server inherits it
	da, db := rxetest.Pair(t)
	const addr = "10.99.0.2:18871"
	startChild(t, db, addr)
	cli, err := bx.New(bx.Config{Device: da, Token: token, Spin: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, wd := hang.For(t, "calls", 60*time.Second)
	defer wd.Stop()
	p, err := cli.Dial(ctx, addr)
	if err != nil {
		t.Fatal(hang.Cause(ctx, err))
	}
	const calls = 200
	run := func() uint64 {
		t.Helper()
		w0 := cli.Snapshot().Counters.Wakeups
		req := make([]byte, 64)
		for i := range calls {
			req[0] = byte(i)
			m, err := p.Call(ctx, 1, req)
			if err != nil {
				t.Fatal(hang.Cause(ctx, err))
			}
			if !bytes.Equal(m.Data(), req) {
				t.Fatalf("call %d: the response is not the request", i)
			}
			m.Release()
			wd.Progress()
		}
		return cli.Snapshot().Counters.Wakeups - w0
	}
	if n, spare := bx.MachinePollersForTest(); n != 2 || !spare {
		t.Fatalf("client and child server: %d pollers, a core for each %v; want 2, true", n, spare)
	}
	if w := run(); w > calls/4 {
		t.Errorf("2 pollers on %d CPUs: %d event wake-ups for %d calls, want few (it should poll)", runtime.NumCPU(), w, calls)
	}
	for range runtime.NumCPU() {
		startPoller(t, bx.PollersDirForTest())
	}
	if n, spare := bx.MachinePollersForTest(); spare {
		t.Fatalf("%d pollers on %d CPUs: a core for each", n, runtime.NumCPU())
	}
	if w := run(); w < calls/2 {
		t.Errorf("%d pollers on %d CPUs: %d event wake-ups for %d calls, want about one per call (it should sleep)",
			runtime.NumCPU()+2, runtime.NumCPU(), w, calls)
	}
}
