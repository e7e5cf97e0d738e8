// Package vm runs a command as root in throw-away qemu guests that have
// real, ACTIVE Soft-RoCE (rxe) devices: the implementation of `goverbs vm`
// (and of scripts/vm, a thin wrapper around it).
//
// One guest (the default) has two rxe devices on the two ends of a veth pair
// whose traffic really crosses the pair. With Nodes > 1 the guests are
// joined by a virtual L2 network (unix datagram sockets switched by this
// process: no host interface is touched) and each has its own rxe device on
// its own virtio NIC; the command runs on node 0 and reaches the others with
// `goverbs vm exec NODE CMD` (see Exec).
//
// The guests boot Debian's stock kernel (fetched with apt-get download and
// unpacked into a cache, never installed) or a kernel given with --kernel,
// and see the host's / read-only over 9p under a tmpfs overlay, so every
// host binary exists in them. The init scripts are embedded (guest/).
// See docs/vm.md.
package vm

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Exit statuses besides the command's own.
const (
	ExitUsage   = 2   // bad options or input
	ExitTimeout = 124 // --timeout expired, or a guest hung (no progress)
	ExitGuest   = 125 // a guest died without an exit code (panic, crash), or setup failed
)

// MaxNodes is the largest cluster Run boots.
const MaxNodes = 8

// DefaultHugePages is how many 2 MiB huge pages a guest reserves unless
// Options.HugePages or GOVERBS_VM_HUGEPAGES say otherwise.
const DefaultHugePages = 64

// NoHugePages as Options.HugePages boots guests without huge pages.
const NoHugePages = -1

// DefaultMTU is the guests' link MTU unless Options.MTU or GOVERBS_VM_MTU
// say otherwise: rxe then runs at IB MTU 1024. Jumbo frames (9000) give
// IB MTU 4096, as RoCE fabrics usually run.
const DefaultMTU = 1500

// MinMTU and MaxMTU bound Options.MTU: IPv6's minimum link MTU, and the
// largest a veth or virtio-net link (and the host's switch) carries.
const (
	MinMTU = 1280
	MaxMTU = 65535
)

// ParseMTU parses a link MTU as --mtu and GOVERBS_VM_MTU give it: "" is
// DefaultMTU.
func ParseMTU(s string) (int, error) {
	if s == "" {
		return DefaultMTU, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < MinMTU || n > MaxMTU {
		return 0, fmt.Errorf("MTU %q: want a number of bytes from %d to %d (9000 for jumbo frames)", s, MinMTU, MaxMTU)
	}
	return n, nil
}

// Options configure Run. The zero value (plus Stdout/Stderr) is one guest
// with defaults.
type Options struct {
	Prog      string          // name used in messages ("goverbs vm")
	Mem       string          // guest memory, qemu syntax; "" = 2G (1 guest) or 1G per node
	HugePages int             // 2 MiB huge pages per guest; 0 = GOVERBS_VM_HUGEPAGES or 64; NoHugePages = none
	MTU       int             // MTU of the links rxe runs on (veth, or each node's NIC); 0 = GOVERBS_VM_MTU or 1500
	CPUs      int             // vCPUs per guest; 0 = auto (slot logic)
	Timeout   time.Duration   // 0 = none; whole seconds
	Kernel    string          // "" = Debian's linux-image-amd64; or a .deb, a folder, a vmlinuz
	Devices   int             // rxe devices per guest; 0 = 2 (one guest) or 1 (cluster)
	Nodes     int             // guests; 0 or 1 = one
	Keep      bool            // keep the run folder
	Verbose   bool            // timing line, and the guests' consoles on stderr
	RW        []string        // extra writable host folders
	Loss      map[int]float64 // nodes whose link starts lossy (percent)
	Down      map[int]bool    // nodes whose link starts cut (partition)
	Selftest  bool            // run the embedded selftest instead of a command
	Setup     bool            // only install dependencies and build the cache
	Refresh   bool            // re-resolve the Debian kernel package
	Stdout    io.Writer
	Stderr    io.Writer
}

// runner is one Run.
type runner struct {
	Options
	cache   string
	t0      time.Time
	tSetup  time.Time
	tQemu   time.Time
	kernel  *kernel
	initrd  string
	accel   string
	dir     string // per-run folder
	nodes   []*node
	sw      *netSwitch
	clusDir string
}

func (o *Options) prog() string {
	if o.Prog == "" {
		return "goverbs vm"
	}
	return o.Prog
}

// Errorf-style failure with an exit status.
type failure struct {
	code int
	msg  string
}

func (f *failure) Error() string { return f.msg }

func fail(code int, format string, a ...any) error {
	return &failure{code: code, msg: fmt.Sprintf(format, a...)}
}

// Run runs argv as described by o and returns the exit status to use. It
// installs handlers for SIGINT, SIGTERM, SIGHUP and SIGQUIT for its
// duration: on one, it kills the guests, removes the run folder and returns
// 128+signal.
func Run(o Options, argv []string) int {
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	r := &runner{Options: o, t0: time.Now()}
	code, err := r.run(argv)
	if err != nil {
		var f *failure
		if errors.As(err, &f) {
			if f.msg != "" {
				fmt.Fprintf(r.Stderr, "%s: %s\n", r.prog(), f.msg)
			}
			return f.code
		}
		fmt.Fprintf(r.Stderr, "%s: %v\n", r.prog(), err)
		return ExitGuest
	}
	return code
}

// ParseHugePages parses a huge page count as --hugepages and
// GOVERBS_VM_HUGEPAGES give it: "" is DefaultHugePages, "0" NoHugePages.
func ParseHugePages(s string) (int, error) {
	if s == "" {
		return DefaultHugePages, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("huge pages: want a count of 2 MiB pages (0 for none), not %q", s)
	}
	if n == 0 {
		return NoHugePages, nil
	}
	return n, nil
}

// HostHasRDMA reports whether the host has an ACTIVE RDMA port.
func HostHasRDMA() bool {
	states, _ := filepath.Glob("/sys/class/infiniband/*/ports/*/state")
	for _, s := range states {
		if b, err := os.ReadFile(s); err == nil && strings.Contains(string(b), "ACTIVE") {
			return true
		}
	}
	return false
}

// memMiB reads qemu's -m size ("2G", "1536", "size=2G,maxmem=4G"; no
// suffix is MiB) in MiB; ok is false for what it does not know.
func memMiB(m string) (int, bool) {
	m, _, _ = strings.Cut(strings.TrimPrefix(m, "size="), ",")
	mult := 1.0
	if n := len(m); n > 0 {
		switch m[n-1] {
		case 'k', 'K':
			mult = 1.0 / 1024
		case 'm', 'M':
		case 'g', 'G':
			mult = 1024
		case 't', 'T':
			mult = 1024 * 1024
		default:
			n++
		}
		m = m[:n-1]
	}
	f, err := strconv.ParseFloat(m, 64)
	if err != nil || !(f > 0) || f*mult > 1<<40 {
		return 0, false
	}
	return int(f * mult), true
}

// Passthrough says whether argv should run on the host instead of in a
// guest: GOVERBS_VM=off, or auto (the default) with an ACTIVE RDMA port on
// the host. Only for a single guest: a cluster always boots.
func Passthrough(nodes int) (bool, error) {
	switch m := os.Getenv("GOVERBS_VM"); m {
	case "off", "host":
		return true, nil
	case "force", "on", "guest":
		return false, nil
	case "auto", "":
		return nodes <= 1 && HostHasRDMA(), nil
	default:
		return false, fmt.Errorf("GOVERBS_VM must be auto, force or off (is %q)", m)
	}
}

// hugePages is the count the guest's init2 writes to nr_hugepages.
func (r *runner) hugePages() int {
	switch r.HugePages {
	case 0:
		return DefaultHugePages
	case NoHugePages:
		return 0
	}
	return r.HugePages
}

func (r *runner) say(format string, a ...any) {
	if r.Verbose {
		fmt.Fprintf(r.Stderr, "%s: %s\n", r.prog(), fmt.Sprintf(format, a...))
	}
}

func (r *runner) run(argv []string) (int, error) {
	if r.Nodes <= 0 {
		r.Nodes = 1
	}
	if r.Nodes > MaxNodes {
		return 0, fail(ExitUsage, "--nodes %d: at most %d", r.Nodes, MaxNodes)
	}
	if r.Devices == 0 {
		r.Devices = 2
		if r.Nodes > 1 {
			r.Devices = 1
		}
	}
	if r.Nodes == 1 && (r.Devices < 1 || r.Devices > 2) {
		return 0, fail(ExitUsage, "--devices %d: a single guest has 1 or 2 rxe devices (use --nodes for more)", r.Devices)
	}
	if r.Nodes > 1 && (r.Devices < 1 || r.Devices > 4) {
		return 0, fail(ExitUsage, "--devices %d: 1 to 4 rxe devices (NICs) per node", r.Devices)
	}
	for n := range r.Loss {
		if n < 0 || n >= r.Nodes || r.Nodes == 1 {
			return 0, fail(ExitUsage, "--loss %d: no such node (loss needs --nodes)", n)
		}
	}
	for n := range r.Down {
		if n < 0 || n >= r.Nodes || r.Nodes == 1 {
			return 0, fail(ExitUsage, "--down %d: no such node (needs --nodes)", n)
		}
	}
	if r.Mem == "" {
		r.Mem = os.Getenv("GOVERBS_VM_MEM")
	}
	if r.Mem == "" {
		r.Mem = "2G"
		if r.Nodes > 1 {
			r.Mem = "1G"
		}
	}
	if r.HugePages == 0 {
		n, err := ParseHugePages(os.Getenv("GOVERBS_VM_HUGEPAGES"))
		if err != nil {
			return 0, fail(ExitUsage, "GOVERBS_VM_HUGEPAGES: %v", err)
		}
		r.HugePages = n
	}
	if r.MTU == 0 {
		n, err := ParseMTU(os.Getenv("GOVERBS_VM_MTU"))
		if err != nil {
			return 0, fail(ExitUsage, "GOVERBS_VM_MTU: %v", err)
		}
		r.MTU = n
	}
	if r.MTU < MinMTU || r.MTU > MaxMTU {
		return 0, fail(ExitUsage, "MTU %d: want %d to %d", r.MTU, MinMTU, MaxMTU)
	}
	if r.HugePages < NoHugePages {
		return 0, fail(ExitUsage, "huge pages %d: want a count, or NoHugePages", r.HugePages)
	}
	// The kernel reserves what it can and the guest is then left without
	// memory for the command (OOM kills, or a boot that never ends).
	if mb, ok := memMiB(r.Mem); ok && r.hugePages()*2 > mb/2 {
		return 0, fail(ExitUsage, "%d huge pages (%d MiB) in a guest of %s: at most half its memory, %d pages; lower --hugepages or raise --mem",
			r.hugePages(), 2*r.hugePages(), r.Mem, mb/4)
	}
	if r.Selftest {
		argv = []string{"/run/vm/selftest"}
	} else if !r.Setup && len(argv) == 0 {
		return 0, fail(ExitUsage, "no command given (see --help)")
	}
	if os.Getenv("GOVERBS_VM_GUEST") == "1" && r.Nodes > 1 {
		return 0, fail(ExitUsage, "--nodes inside a guest: no nested clusters (use goverbs vm exec to reach the other nodes)")
	}
	if !r.Selftest && !r.Setup {
		pass, err := Passthrough(r.Nodes)
		if err != nil {
			return 0, fail(ExitGuest, "%v", err)
		}
		if pass {
			return 0, execHost(argv)
		}
	}

	// Bad --rw folders before the setup and the wait for vCPUs.
	if _, err := r.writableShares(); err != nil {
		return 0, err
	}
	var err error
	if r.cache, err = cacheDir(); err != nil {
		return 0, fail(ExitGuest, "%v", err)
	}
	if err := r.setup(); err != nil {
		return 0, err
	}
	r.tSetup = time.Now()
	if r.Setup {
		fmt.Fprintf(r.Stderr, "%s: ready: kernel %s in %s\n", r.prog(), r.kernel.version, r.kernel.dir)
		return 0, nil
	}
	qemu, err := qemuPath()
	if err != nil {
		return 0, err
	}
	r.accel = accel()

	// vCPUs: share the host cores with concurrent runs (slot locks).
	want := r.CPUs
	if want == 0 {
		want = 2
		if r.Nodes > 1 {
			want = r.Nodes
		}
	} else if r.Nodes > 1 {
		want *= r.Nodes
	}
	slots := takeSlots(r.cache, want)
	defer slots.release()
	if r.CPUs == 0 {
		r.CPUs = 1
		if r.Nodes == 1 {
			r.CPUs = max(1, slots.n)
		}
	}

	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigc)
	defer r.cleanup()
	for attempt := 1; ; attempt++ {
		code, err := r.boot(argv, qemu, sigc)
		why := r.badClock()
		if why == "" || attempt == maxBoots {
			return code, err
		}
		// The guest found its clock broken before the command started
		// (init2's clock_check): nothing ran, so boot again.
		fmt.Fprintf(r.Stderr, "%s: %s (timer calibration gone wrong under load); booting again (%d of %d)\n",
			r.prog(), why, attempt+1, maxBoots)
		r.cleanup()
		r.nodes, r.sw, r.clusDir = nil, nil, ""
	}
}

// maxBoots bounds the boots of one run when guests find their clock broken.
const maxBoots = 3

// badClock returns what a guest said of its broken clock, or "".
func (r *runner) badClock() string {
	for _, nd := range r.nodes {
		if b, err := os.ReadFile(filepath.Join(nd.dir, "badclock")); err == nil {
			return fmt.Sprintf("%s's clock ran fast during boot: %s", nd.name(), strings.TrimSpace(string(b)))
		}
	}
	return ""
}

// boot prepares a run folder and the nodes, starts the guests and
// supervises them.
func (r *runner) boot(argv []string, qemu string, sigc chan os.Signal) (int, error) {
	// Per-run folder: one share per node (job, config, init2, exit code),
	// a cluster share all nodes see, and the switch's sockets.
	var err error
	base := os.Getenv("TMPDIR")
	if base == "" || len(base) > 60 { // unix socket paths are short
		base = "/tmp"
	}
	if r.dir, err = os.MkdirTemp(base, "goverbs-vm."); err != nil {
		return 0, fail(ExitGuest, "%v", err)
	}

	shares, err := r.writableShares()
	if err != nil {
		return 0, err
	}
	if r.Nodes > 1 {
		r.clusDir = filepath.Join(r.dir, "cluster")
		for i := 0; i < r.Nodes; i++ {
			if err := os.MkdirAll(filepath.Join(r.clusDir, "node"+strconv.Itoa(i)), 0o755); err != nil {
				return 0, fail(ExitGuest, "%v", err)
			}
		}
		r.sw, err = newSwitch(filepath.Join(r.dir, "net"), r.Nodes, r.Devices, r.clusDir)
		if err != nil {
			return 0, fail(ExitGuest, "virtual network: %v", err)
		}
		for n, p := range r.Loss {
			r.sw.setLoss(n, p)
		}
		for n, d := range r.Down {
			r.sw.setDown(n, d)
		}
		go r.sw.run()
	}
	self, _ := os.Executable()
	for i := 0; i < r.Nodes; i++ {
		nd := &node{idx: i, r: r, dir: filepath.Join(r.dir, "node"+strconv.Itoa(i)), exited: make(chan struct{})}
		if err := nd.prepare(argv, shares, self); err != nil {
			return 0, fail(ExitGuest, "%v", err)
		}
		r.nodes = append(r.nodes, nd)
	}

	r.tQemu = time.Now()
	for _, nd := range r.nodes {
		if err := nd.start(qemu, shares); err != nil {
			r.killAll()
			return 0, fail(ExitGuest, "starting qemu: %v", err)
		}
	}
	return r.supervise(sigc)
}

// supervise waits for node 0's guest to finish, enforcing the boot and
// host-side timeouts, reacting to signals and to other nodes dying.
func (r *runner) supervise(sigc chan os.Signal) (int, error) {
	bootTimeout := envSeconds("GOVERBS_VM_BOOT_TIMEOUT", 300)
	// And a bound on the whole boot: a guest stuck before its command
	// whose kernel keeps printing (RCU stall or hung-task warnings, every
	// minute or two) would otherwise reset the silence bound forever.
	bootMax := envSeconds("GOVERBS_VM_BOOT_MAX", 4*int(bootTimeout/time.Second))
	grace := envSeconds("GOVERBS_VM_KILL_GRACE", 30)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	n0 := r.nodes[0]
	var started time.Time
	// The boot timeout bounds a boot that makes no progress: it counts
	// from the last time a guest's console grew (each init stage prints a
	// line), so a slow boot on a loaded machine is not taken for a hung
	// one.
	lastGrowth, consoleSize := r.tQemu, int64(0)
	for {
		select {
		case s := <-sigc:
			r.killAll()
			r.waitAll()
			sig, _ := s.(syscall.Signal)
			fmt.Fprintf(r.Stderr, "%s: %v: guests stopped\n", r.prog(), s)
			return 128 + int(sig), nil
		case <-n0.exited:
			r.killAll()
			r.waitAll()
			return r.result(n0, started)
		case <-tick.C:
		}
		now := time.Now()
		for _, nd := range r.nodes[1:] {
			select {
			case <-nd.exited:
				if !nd.reported {
					nd.reported = true
					os.WriteFile(filepath.Join(r.clusDir, "dead."+strconv.Itoa(nd.idx)), nil, 0o644)
					if !nd.isReady() {
						r.killAll()
						r.waitAll()
						nd.consoleTail(fmt.Sprintf("node %d died while booting (crash, panic or harness error)", nd.idx))
						return ExitGuest, nil
					}
					nd.consoleTail(fmt.Sprintf("node %d died (crash, panic or harness error); node 0 goes on", nd.idx))
				}
			default:
			}
		}
		if started.IsZero() && n0.isStarted() {
			started = now
		}
		if started.IsZero() {
			if n := r.consoleBytes(); n != consoleSize {
				consoleSize, lastGrowth = n, now
			}
		}
		if started.IsZero() && (now.Sub(lastGrowth) > bootTimeout || now.Sub(r.tQemu) > bootMax) {
			r.killAll()
			r.waitAll()
			stuck := n0
			for _, nd := range r.nodes {
				if !nd.isReady() {
					stuck = nd
					break
				}
			}
			why := fmt.Sprintf("its console silent for %v", bootTimeout)
			if now.Sub(lastGrowth) <= bootTimeout {
				why = fmt.Sprintf("its console still printing after %v (GOVERBS_VM_BOOT_MAX)", bootMax)
			}
			stuck.consoleTail(fmt.Sprintf("guest hung: %s did not start the command, %s (%v since qemu started)",
				stuck.name(), why, now.Sub(r.tQemu).Round(time.Second)))
			return ExitTimeout, nil
		}
		if !started.IsZero() && r.Timeout > 0 && now.Sub(started) > r.Timeout+grace {
			r.killAll()
			r.waitAll()
			n0.consoleTail(fmt.Sprintf("timed out after %v (guest unresponsive, killed)", r.Timeout))
			return ExitTimeout, nil
		}
	}
}

// consoleBytes is the size of all guests' console logs.
func (r *runner) consoleBytes() int64 {
	var n int64
	for _, nd := range r.nodes {
		if st, err := os.Stat(filepath.Join(nd.dir, "console.log")); err == nil {
			n += st.Size()
		}
	}
	return n
}

func (r *runner) result(n0 *node, started time.Time) (int, error) {
	tEnd := time.Now()
	if r.Verbose {
		mtime := func(name string) time.Time {
			if st, err := os.Stat(filepath.Join(n0.dir, name)); err == nil {
				return st.ModTime()
			}
			return tEnd
		}
		tStarted, tRC := mtime("started"), mtime("rc")
		s := func(a, b time.Time) float64 { return b.Sub(a).Seconds() }
		fmt.Fprintf(r.Stderr, "%s: setup %.2fs, wait for vCPUs %.2fs, boot %.2fs (kernel %s, %s, %d node(s) x %d vCPUs), command %.2fs, shutdown %.2fs, total %.2fs\n",
			r.prog(), s(r.t0, r.tSetup), s(r.tSetup, r.tQemu), s(r.tQemu, tStarted), r.kernel.version, r.accel,
			r.Nodes, r.CPUs, s(tStarted, tRC), s(tRC, tEnd), s(r.t0, tEnd))
		if r.sw != nil {
			fmt.Fprint(r.Stderr, r.sw.stats())
		}
	}
	if b, err := os.ReadFile(filepath.Join(n0.dir, "rc")); err == nil {
		rc, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return ExitGuest, fail(ExitGuest, "bad exit code file: %q", b)
		}
		if exists(filepath.Join(n0.dir, "timedout")) {
			fmt.Fprintf(r.Stderr, "%s: timed out after %v\n", r.prog(), r.Timeout)
		}
		return rc, nil
	}
	n0.consoleTail("guest died without an exit code (crash, panic or harness error)")
	return ExitGuest, nil
}

func (r *runner) killAll() {
	for _, nd := range r.nodes {
		nd.kill()
	}
}

func (r *runner) waitAll() {
	for _, nd := range r.nodes {
		nd.wait()
	}
}

func (r *runner) cleanup() {
	r.killAll()
	r.waitAll()
	if r.sw != nil {
		r.sw.close()
	}
	if r.Keep {
		fmt.Fprintf(r.Stderr, "%s: kept %s\n", r.prog(), r.dir)
		return
	}
	os.RemoveAll(r.dir)
}

// writableShares: /tmp, $TMPDIR, GOVERBS_VM_RW and --rw folders, each its
// own 9p share mounted at the same path in the guest.
func (r *runner) writableShares() ([]string, error) {
	dirs := []string{"/tmp"}
	if t := os.Getenv("TMPDIR"); t != "" {
		if st, err := os.Stat(t); err == nil && st.IsDir() {
			dirs = append(dirs, t)
		}
	}
	var extra []string
	if e := os.Getenv("GOVERBS_VM_RW"); e != "" {
		extra = append(extra, strings.Split(e, ":")...)
	}
	extra = append(extra, r.RW...)
	for _, d := range extra {
		if d == "" {
			continue
		}
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			return nil, fail(ExitUsage, "--rw %s (or GOVERBS_VM_RW): no such folder: create it first", d)
		}
		dirs = append(dirs, d)
	}
	var out []string
	seen := map[string]bool{}
	for _, d := range dirs {
		if abs, err := filepath.EvalSymlinks(d); err == nil {
			d = abs
		}
		if d, _ = filepath.Abs(d); seen[d] {
			continue
		}
		seen[d] = true
		out = append(out, d)
	}
	return out, nil
}

// execHost replaces this process by argv (the host has RDMA, or
// GOVERBS_VM=off).
func execHost(argv []string) error {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		code := 127
		if errors.Is(err, os.ErrPermission) {
			code = 126
		}
		return fail(code, "%v", err)
	}
	err = syscall.Exec(path, argv, os.Environ())
	return fail(126, "exec %s: %v", argv[0], err)
}

func envSeconds(name string, def int) time.Duration {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return time.Duration(v) * time.Second
	}
	return time.Duration(def) * time.Second
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// slots are flock'ed files $CACHE/slot.I, one per host core: TCG guests
// degrade badly when their vCPU threads outnumber host cores (measured: two
// 2-vCPU guests at once took ~22 s each to boot, two 1-vCPU guests ~8 s).
// A run takes up to want free slots, or waits for one, at most
// GOVERBS_VM_SLOT_WAIT seconds (default 60; then it runs anyway).
type slotSet struct {
	n     int
	files []*os.File
}

func takeSlots(cache string, want int) *slotSet {
	s := &slotSet{}
	nslots := runtime.NumCPU()
	deadline := time.Now().Add(envSeconds("GOVERBS_VM_SLOT_WAIT", 60))
	for {
		for i := 0; i < nslots && s.n < want; i++ {
			f, err := os.OpenFile(filepath.Join(cache, fmt.Sprintf("slot.%d", i)), os.O_CREATE|os.O_WRONLY, 0o666)
			if err != nil {
				continue
			}
			if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
				f.Close()
				continue
			}
			s.files = append(s.files, f)
			s.n++
		}
		if s.n > 0 || time.Now().After(deadline) {
			return s
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (s *slotSet) release() {
	for _, f := range s.files {
		f.Close()
	}
}

// node is one guest.
type node struct {
	idx      int
	r        *runner
	dir      string
	cmd      *exec.Cmd
	exited   chan struct{}
	relays   sync.WaitGroup
	reported bool
}

func (nd *node) name() string {
	if nd.r.Nodes == 1 {
		return "the guest"
	}
	return fmt.Sprintf("node %d", nd.idx)
}

func (nd *node) consoleName() string {
	if nd.r.Nodes == 1 {
		return "the guest console"
	}
	return fmt.Sprintf("node %d's console", nd.idx)
}

func (nd *node) isStarted() bool { return exists(filepath.Join(nd.dir, "started")) }

func (nd *node) isReady() bool {
	if nd.r.Nodes == 1 || nd.idx == 0 {
		return nd.isStarted()
	}
	return exists(filepath.Join(nd.r.clusDir, "ready."+strconv.Itoa(nd.idx)))
}

func (nd *node) kill() {
	if nd.cmd != nil && nd.cmd.Process != nil {
		select {
		case <-nd.exited:
		default:
			nd.cmd.Process.Signal(syscall.SIGKILL)
		}
	}
}

func (nd *node) wait() {
	if nd.cmd != nil {
		<-nd.exited
	}
	nd.relays.Wait()
}

// consoleTail prints why the guest failed and the end of its console log.
func (nd *node) consoleTail(why string) {
	r := nd.r
	w := r.Stderr
	fmt.Fprintf(w, "%s: %s\n", r.prog(), why)
	log := filepath.Join(nd.dir, "console.log")
	b, _ := os.ReadFile(log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	n := 0
	for _, l := range lines {
		if n < 5 && (strings.Contains(l, "Kernel panic") || strings.Contains(l, "BUG:") || strings.Contains(l, "Oops") ||
			strings.Contains(l, "sysrq: Trigger") || strings.Contains(l, "FATAL")) {
			fmt.Fprintf(w, "%s: console: %s\n", r.prog(), l)
			n++
		}
	}
	fmt.Fprintf(w, "%s: last lines of %s (%s):\n", r.prog(), nd.consoleName(), log)
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
	if q, err := os.ReadFile(filepath.Join(nd.dir, "qemu.log")); err == nil && len(q) > 0 {
		code := -1
		if nd.cmd != nil && nd.cmd.ProcessState != nil {
			code = nd.cmd.ProcessState.ExitCode()
		}
		fmt.Fprintf(w, "%s: qemu said (exit status %d):\n", r.prog(), code)
		ql := strings.Split(strings.TrimRight(string(q), "\n"), "\n")
		if len(ql) > 10 {
			ql = ql[len(ql)-10:]
		}
		fmt.Fprintln(w, strings.Join(ql, "\n"))
	}
}
