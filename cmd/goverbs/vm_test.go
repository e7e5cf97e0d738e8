package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
)

// `goverbs vm` tests. Those that boot guests run on a host with qemu (not
// inside a guest, not with -short, not with GOVERBS_VM_TEST=0); the
// bad-input ones run everywhere.

func needGuests(t *testing.T) {
	t.Helper()
	switch {
	case os.Getenv("GOVERBS_VM_GUEST") == "1":
		t.Skip("no guests inside a guest")
	case testing.Short():
		t.Skip("boots qemu guests (-short)")
	case os.Getenv("GOVERBS_VM_TEST") == "0":
		t.Skip("GOVERBS_VM_TEST=0")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64")
	}
}

// vmEnv makes `goverbs vm` boot a guest even where the host has RDMA.
var vmEnv = []string{"GOVERBS_VM=force"}

func TestVMBadInput(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		args []string
		code int
		want string
	}{
		{nil, []string{"vm"}, 2, "no command"},
		{nil, []string{"vm", "--cpus", "x", "true"}, 2, "--cpus"},
		{nil, []string{"vm", "--timeout", "abc", "true"}, 2, "--timeout"},
		{nil, []string{"vm", "--loss", "1", "true"}, 2, "NODE=PCT"},
		{nil, []string{"vm", "--nodes", "2", "--loss", "1=nan", "true"}, 2, "NODE=PCT"},
		{nil, []string{"vm", "--loss", "1=5", "true"}, 2, "needs --nodes"},
		{nil, []string{"vm", "--devices", "3", "true"}, 2, "--devices 3"},
		{nil, []string{"vm", "--nodes", "99", "true"}, 2, "at most"},
		{nil, []string{"vm", "--nodes", "0", "true"}, 2, "--nodes 0: at least 1"},
		{nil, []string{"vm", "--hugepages", "-1", "true"}, 2, "--hugepages: huge pages: want a count"},
		{nil, []string{"vm", "--hugepages", "many", "true"}, 2, "--hugepages"},
		{nil, []string{"vm", "--hugepages", "1000", "true"}, 2, "1000 huge pages (2000 MiB) in a guest of 2G: at most half its memory, 512 pages"},
		{[]string{"GOVERBS_VM_MEM=1G"}, []string{"vm", "--nodes", "2", "--hugepages", "257", "true"}, 2, "at most half its memory, 256 pages"},
		{[]string{"GOVERBS_VM_HUGEPAGES=x"}, []string{"vm", "true"}, 2, "GOVERBS_VM_HUGEPAGES"},
		{nil, []string{"vm", "--mtu", "100", "true"}, 2, "--mtu: MTU \"100\": want a number of bytes from 1280 to 65535"},
		{nil, []string{"vm", "--mtu", "jumbo", "true"}, 2, "--mtu"},
		{[]string{"GOVERBS_VM_MTU=70000"}, []string{"vm", "true"}, 2, "GOVERBS_VM_MTU"},
		{nil, []string{"vm", "--nosuchflag", "true"}, 2, "not defined"},
		{nil, []string{"vm", "--rw", "/nonexistent/out", "true"}, 2, "--rw /nonexistent/out (or GOVERBS_VM_RW): no such folder"},
		{nil, []string{"vm", "--kernel", "/nonexistent/vmlinuz", "true"}, 2, "--kernel wants"},
		{[]string{"GOVERBS_VM_QEMU=/nonexistent/qemu-system-x86_64"}, []string{"vm", "true"}, 125, "qemu not found"},
		{[]string{"GOVERBS_VM=bogus"}, []string{"vm", "true"}, 125, "GOVERBS_VM must be"},
		{nil, []string{"vm", "exec", "1", "true"}, 2, "only works inside a multi-node guest"},
		{nil, []string{"vm", "link", "1", "down"}, 2, "only works inside a multi-node guest"},
	} {
		env := append(append([]string{}, vmEnv...), tc.env...)
		r := runCmd(t, 2*time.Minute, goverbsBin, append(env, goverbsEnv...), tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("goverbs %q (%q): exit %d (want %d), stderr %q (want %q)", tc.args, tc.env, r.code, tc.code, r.stderr, tc.want)
		}
	}
}

func vmRun(t *testing.T, timeout time.Duration, env []string, args ...string) result {
	t.Helper()
	env = append(append(append([]string{}, vmEnv...), goverbsEnv...), env...)
	t0 := time.Now()
	r := runCmd(t, timeout, goverbsBin, env, append([]string{"vm"}, args...)...)
	t.Logf("goverbs vm %q: exit %d in %v", args, r.code, time.Since(t0).Round(time.Millisecond))
	return r
}

func TestVMSingle(t *testing.T) {
	needGuests(t)
	t.Parallel()
	r := vmRun(t, 5*time.Minute, nil, "--", "bash", "-c",
		`echo "out $GOVERBS_VM_GUEST $(hostname) $(cat /sys/class/infiniband/rxe*/ports/1/state | grep -c ACTIVE)"; echo err >&2; exit 7`)
	if r.code != 7 || r.stdout != "out 1 goverbs-vm 2\n" || r.stderr != "err\n" {
		t.Fatalf("exit %d (want 7), stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// --hugepages and GOVERBS_VM_HUGEPAGES set the guest's nr_hugepages (64
// unless told; 0 boots a guest like most machines); the flag wins.
func TestVMHugePages(t *testing.T) {
	needGuests(t)
	t.Parallel()
	for _, tc := range []struct {
		env  string
		args []string
		want string
	}{
		{"GOVERBS_VM_HUGEPAGES=", nil, "64"},
		{"GOVERBS_VM_HUGEPAGES=0", nil, "0"},
		{"GOVERBS_VM_HUGEPAGES=0", []string{"--hugepages", "8"}, "8"},
	} {
		args := append(append([]string{}, tc.args...), "--", "bash", "-c", `echo "$(</proc/sys/vm/nr_hugepages) $(grep -c ' hugetlbfs ' /proc/mounts)"`)
		r := vmRun(t, 5*time.Minute, []string{tc.env}, args...)
		if r.code != 0 || r.stdout != tc.want+" 1\n" {
			t.Errorf("%s goverbs vm %q: exit %d, nr_hugepages and hugetlbfs mounts %q, want %q\n%s", tc.env, tc.args, r.code, r.stdout, tc.want+" 1", r.stderr)
		}
	}
}

// --mtu and GOVERBS_VM_MTU set the MTU of the links rxe runs on (1500
// unless told; the flag wins) and rxe follows: IB MTU 1024 at 1500, 4096 at
// 9000. At 9000, an 8 KiB ibv_rc_pingpong with path MTU 4096 crosses the
// veth (4 KiB packets, which a 1500 link could not carry), and in a
// cluster each node's NIC has the MTU.
func TestVMMTU(t *testing.T) {
	needGuests(t)
	t.Parallel()
	show := `echo "$(</sys/class/net/v0/mtu) $(</sys/class/net/v1/mtu) $(ibv_devinfo -d rxe0 | awk '/active_mtu/ {print $2}')"`
	pp := `; ibv_rc_pingpong -d rxe1 -g 1 -m 4096 -s 8192 -n 20 -p 18515 >/dev/null 2>&1 & ` +
		`for i in $(seq 200); do ss -Hltn 'sport = :18515' | grep -q . && break; sleep 0.05; done; ` +
		`timeout 60 ibv_rc_pingpong -d rxe0 -g 1 -m 4096 -s 8192 -n 20 -p 18515 10.99.0.2 | grep -c 'iters in'; wait`
	for _, tc := range []struct {
		env  string
		args []string
		cmd  string
		want string
	}{
		{"GOVERBS_VM_MTU=", nil, show, "1500 1500 1024\n"},
		{"GOVERBS_VM_MTU=1500", []string{"--mtu", "9000"}, show + pp, "9000 9000 4096\n1\n"},
	} {
		args := append(append([]string{}, tc.args...), "--", "bash", "-c", tc.cmd)
		r := vmRun(t, 5*time.Minute, []string{tc.env}, args...)
		if r.code != 0 || r.stdout != tc.want {
			t.Errorf("%s goverbs vm %q: exit %d, veth MTUs, active_mtu and pingpong %q, want %q\n%s", tc.env, tc.args, r.code, r.stdout, tc.want, r.stderr)
		}
	}
	r := vmRun(t, 5*time.Minute, nil, "--nodes", "2", "--mtu", "9000", "--", "bash", "-c",
		`for n in 0 1; do goverbs vm exec $n bash -c 'echo "$(</sys/class/net/$(</sys/class/infiniband/rxe0/parent)/mtu) $(ibv_devinfo -d rxe0 | awk "/active_mtu/ {print \$2}")"'; done`)
	if r.code != 0 || r.stdout != "9000 4096\n9000 4096\n" {
		t.Errorf("goverbs vm --nodes 2 --mtu 9000: exit %d, rxe0's NIC MTU and active_mtu per node %q, want 9000 4096 twice\n%s", r.code, r.stdout, r.stderr)
	}
}

func TestVMSelftest(t *testing.T) {
	needGuests(t)
	t.Parallel()
	r := vmRun(t, 5*time.Minute, nil, "--selftest")
	if r.code != 0 || !strings.Contains(r.stdout, "selftest: PASS") {
		t.Fatalf("exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

// A guest that panics: 125 and the panic in the console tail.
func TestVMPanic(t *testing.T) {
	needGuests(t)
	t.Parallel()
	r := vmRun(t, 5*time.Minute, nil, "--", "sh", "-c", "echo c >/proc/sysrq-trigger; sleep 60")
	if r.code != 125 || !strings.Contains(r.stderr, "Kernel panic") || !strings.Contains(r.stderr, "guest died") {
		t.Fatalf("exit %d (want 125)\n%s", r.code, r.stderr)
	}
}

// Hangs: 124, distinct from a panic, with the console tail.
func TestVMHang(t *testing.T) {
	needGuests(t)
	t.Parallel()
	// The guest does not boot in time.
	r := vmRun(t, 5*time.Minute, []string{"GOVERBS_VM_BOOT_TIMEOUT=1"}, "true")
	if r.code != 124 || !strings.Contains(r.stderr, "guest hung") || !strings.Contains(r.stderr, "console") {
		t.Errorf("boot hang: exit %d (want 124)\n%s", r.code, r.stderr)
	}
	// A guest whose clock runs fast (here: told the host started an hour
	// from now) stops before the command; the host boots again, three
	// times in all, then gives up with 125 and says why.
	// (A folder of this run's: two test runs at once share /tmp.)
	ran := filepath.Join(t.TempDir(), "badclock-ran") // $TMPDIR or /tmp: writable in the guest
	r = vmRun(t, 5*time.Minute, []string{"GOVERBS_VM_TEST_BADCLOCK=1"}, "--", "touch", ran)
	if r.code != 125 || strings.Count(r.stderr, "clock ran fast during boot") != 2 || !strings.Contains(r.stderr, "booting again (3 of 3)") {
		t.Errorf("bad clock: exit %d (want 125 after 3 boots)\n%s", r.code, r.stderr)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("the command ran in a guest whose clock was broken")
	}
	// The command outlives --timeout: the guest stops it.
	r = vmRun(t, 5*time.Minute, nil, "--timeout", "2", "--", "sleep", "100")
	if r.code != 124 || !strings.Contains(r.stderr, "timed out after 2s") {
		t.Errorf("--timeout: exit %d (want 124)\n%s", r.code, r.stderr)
	}
	// The guest itself stops responding (a real-time spin on its only
	// vCPU starves the guest's timeout): the host watchdog kills it.
	r = vmRun(t, 5*time.Minute, []string{"GOVERBS_VM_KILL_GRACE=3"}, "--cpus", "1", "--timeout", "2", "--", "sh", "-c",
		`echo -1 >/proc/sys/kernel/sched_rt_runtime_us; exec chrt -f 99 sh -c 'while :; do :; done'`)
	if r.code != 124 || !strings.Contains(r.stderr, "guest unresponsive") {
		t.Errorf("unresponsive guest: exit %d (want 124)\n%s", r.code, r.stderr)
	}
}

// Ctrl-C: the guests die with us, nothing is left running, the run folder
// is gone.
func TestVMInterrupt(t *testing.T) {
	needGuests(t)
	t.Parallel()
	tmp, err := os.MkdirTemp("", "vmint")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command(goverbsBin, "vm", "--nodes", "2", "--", "sleep", "1000")
	cmd.Env = append(append(append(os.Environ(), vmEnv...), goverbsEnv...), "TMPDIR="+tmp)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(hang.Scale(4 * time.Minute))
	for {
		if m, _ := filepath.Glob(filepath.Join(tmp, "goverbs-vm.*", "node0", "started")); len(m) > 0 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("guest did not start")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := procsMentioning(tmp); n != 2 {
		t.Errorf("%d qemu processes running, want 2", n)
	}
	cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(hang.Scale(30 * time.Second)):
		cmd.Process.Kill()
		t.Fatalf("goverbs vm did not exit %v after SIGINT (%s)", hang.Scale(30*time.Second), hang.How())
	}
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Errorf("exit %d after SIGINT, want 130; stderr %q", code, stderr.String())
	}
	if n := procsMentioning(tmp); n != 0 {
		t.Errorf("%d processes still running", n)
	}
	if m, _ := filepath.Glob(filepath.Join(tmp, "goverbs-vm.*")); len(m) > 0 {
		t.Errorf("run folder left behind: %v", m)
	}
}

// procsMentioning counts processes whose command line contains s.
func procsMentioning(s string) int {
	n := 0
	ds, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, d := range ds {
		b, err := os.ReadFile(d)
		if err == nil && strings.Contains(string(b), s) && strings.Contains(string(b), "qemu") {
			n++
		}
	}
	return n
}

// A 3-node cluster: rc-pingpong node0 -> node2, with NIC counters proving
// the traffic crossed the virtual network (and skipped node 1).
func TestVMCluster(t *testing.T) {
	needGuests(t)
	t.Parallel()
	r := vmRun(t, 8*time.Minute, nil, "--nodes", "3", "--verbose", "--selftest")
	t.Logf("\n%s", r.stdout)
	if r.code != 0 || !strings.Contains(r.stdout, "selftest: PASS") {
		t.Fatalf("exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	m := regexp.MustCompile(`node0 (\S+) tx \+(\d+) B, node2 (\S+) rx \+(\d+) B`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("no counters in\n%s", r.stdout)
	}
	if tx, _ := strconv.Atoi(m[2]); tx < 200*4096 {
		t.Errorf("node0 sent %d bytes", tx)
	}
	if !strings.Contains(r.stderr, "3 node(s)") {
		t.Errorf("no timing line: %s", r.stderr)
	}
}

// exec between nodes, partition and loss on a node's link.
func TestVMClusterFaults(t *testing.T) {
	needGuests(t)
	t.Parallel()
	script := `set -u
gv=$GOVERBS_VM_BIN
reach() { timeout 3 bash -c 'exec 3<>/dev/tcp/10.77.0.2/9' 2>&1 | grep -q refused; } # RST = reachable
$gv vm exec node1 sh -c 'echo "on $(hostname) node $GOVERBS_VM_NODE"; echo e >&2; exit 3'; echo "exec rc $?"
reach && echo "reachable"
$gv vm link 1 down && { reach && echo "down but reachable" || echo "partitioned"; }
$gv vm link 1 up && reach && echo "reachable again"
$gv vm link 1 loss 5 && echo "loss set"
SELFTEST_ITERS=100 SELFTEST_LINGER=10s bash /run/vm/selftest
`
	r := vmRun(t, 8*time.Minute, nil, "--nodes", "2", "--", "bash", "-c", script)
	t.Logf("\n%s\n%s", r.stdout, r.stderr)
	for _, want := range []string{"on node1 node 1\nexec rc 3\n", "reachable\npartitioned\nreachable again\nloss set\n", "selftest: PASS"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	if r.code != 0 || !strings.Contains(r.stderr, "e\n") {
		t.Errorf("exit %d, stderr %q", r.code, r.stderr)
	}
	if !regexp.MustCompile(`node 1: .*dropped [1-9]`).MatchString(r.stdout) {
		t.Errorf("5%% loss on node 1 dropped nothing")
	}
}

// The product promise: a module outside this repo, importing goverbs/qp,
// runs `goverbs vm -- ibv_devinfo`, `goverbs vm -- go test ./...` and
// `go test -exec 'goverbs vm --' ./...`.
func TestVMScratchModule(t *testing.T) {
	needGuests(t)
	t.Parallel()
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "goverbs-scratch") // under /tmp: shared with the guest
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	files := map[string]string{
		"go.mod": "module example.com/scratch\n\ngo 1.26\n\nrequire github.com/goverbs/goverbs v0.0.0\n\nreplace github.com/goverbs/goverbs => " + repo + "\n",
		"scratch_test.go": `package scratch

import (
	"testing"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

func TestQP(t *testing.T) {
	devs, err := uverbs.ListWithoutGIDs()
	if err != nil || len(devs) == 0 {
		t.Fatalf("no RDMA devices: %v", err)
	}
	ctx, err := uverbs.Open(devs[0].Name)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	c, err := cq.Create(ctx, 16)
	if err != nil {
		t.Fatal(err)
	}
	q, err := qp.Create(pd, qp.Config{Type: qp.RC, SendCQ: c, RecvCQ: c, MaxSendWR: 4, MaxRecvWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: QP %d", devs[0].Name, q.QPN())
	q.Close()
}
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"GOFLAGS=-mod=mod", "CGO_ENABLED=0"}
	run := func(timeout time.Duration, bin string, args ...string) result {
		t.Helper()
		t0 := time.Now()
		r := runIn(t, dir, timeout, bin, append(append(append([]string{}, env...), vmEnv...), goverbsEnv...), args...)
		t.Logf("%s %q: exit %d in %v", filepath.Base(bin), args, r.code, time.Since(t0).Round(time.Millisecond))
		return r
	}
	// Resolve dependencies and warm the build cache on the host (the guest
	// has no network; it reads the host's module and build caches).
	if r := run(5*time.Minute, gotool, "test", "-count=1", "-run", "^$", "./..."); r.code != 0 {
		t.Fatalf("host go test: %s%s", r.stdout, r.stderr)
	}
	if r := run(5*time.Minute, goverbsBin, "vm", "--", "ibv_devinfo", "-l"); r.code != 0 || !strings.Contains(r.stdout, "rxe0") {
		t.Errorf("goverbs vm -- ibv_devinfo: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := run(10*time.Minute, goverbsBin, "vm", "--", gotool, "test", "-count=1", "-v", "./..."); r.code != 0 || !strings.Contains(r.stdout, "--- PASS: TestQP") {
		t.Errorf("goverbs vm -- go test: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := run(10*time.Minute, gotool, "test", "-count=1", "-v", "-exec", goverbsBin+" vm --", "./..."); r.code != 0 || !strings.Contains(r.stdout, "--- PASS: TestQP") {
		t.Errorf("go test -exec 'goverbs vm --': exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func runIn(t *testing.T, dir string, timeout time.Duration, bin string, env []string, args ...string) result {
	t.Helper()
	return runCmd(t, timeout, "sh", env, append([]string{"-c", `cd "$0" && exec "$@"`, dir, bin}, args...)...)
}
