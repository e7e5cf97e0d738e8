package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/goverbs/goverbs/internal/vm"
)

const vmUsage = `Usage:
  goverbs vm [flags] [--] CMD [ARGS...]   run CMD as root in a throw-away qemu guest with rxe devices
  goverbs vm --nodes N [flags] -- CMD     N guests on a virtual L2 network; CMD runs on node 0
  goverbs vm --selftest [--nodes N]       prove rxe traffic crosses the (virtual) wire
  goverbs vm --setup                      only install dependencies and fill the cache
  go test -exec 'goverbs vm --' ./...     each test binary runs in its own guest

Inside a multi-node guest:
  goverbs vm exec NODE CMD [ARGS...]      run CMD on node NODE (0.., or nodeN), streaming its output
  goverbs vm link NODE up|down|loss PCT   cut, restore or make lossy NODE's link on the switch

One guest has rxe0 (v0, 10.99.0.1) and rxe1 (v1, 10.99.0.2) on a veth pair;
node I of a cluster has rxe0 on its NIC at 10.77.0.(I+1) (rxeD at
10.77.D.(I+1) with --devices D+1), host names node0...
Exit status: CMD's; 124 timeout or hung guest; 125 guest died (panic) or
setup failed; 2 bad usage. See docs/vm.md and docs/ci.md.

Flags:
`

// multiFlag collects repeated string flags.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

func runVM(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "exec":
			if len(args) < 3 {
				return &exitError{code: vm.ExitUsage, msg: "usage: goverbs vm exec NODE CMD [ARGS...]"}
			}
			cmd := args[2:]
			if cmd[0] == "--" {
				cmd = cmd[1:]
			}
			return vmExit(vm.Exec(args[1], cmd, stdout, stderr))
		case "link":
			if len(args) < 3 {
				return &exitError{code: vm.ExitUsage, msg: "usage: goverbs vm link NODE up|down|loss PCT"}
			}
			return vmExit(vm.Link(args[1], args[2:], stderr))
		}
	}
	o, argv, err := parseVMFlags(args, stderr)
	if err != nil {
		return err
	}
	o.Stdout, o.Stderr = stdout, stderr
	return vmExit(vm.Run(o, argv))
}

func vmExit(code int) error {
	if code == 0 {
		return nil
	}
	return &exitError{code: code}
}

func parseVMFlags(args []string, stderr io.Writer) (vm.Options, []string, error) {
	var o vm.Options
	fs := flag.NewFlagSet("goverbs vm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fullUsage := func() {
		fs.SetOutput(os.Stdout)
		fmt.Fprint(os.Stdout, vmUsage)
		fs.PrintDefaults()
	}
	fs.Usage = func() {} // -h prints the full usage, a bad flag a pointer to it (below)
	cpus := fs.String("cpus", envOr("GOVERBS_VM_CPUS", "auto"), "vCPUs per guest, or auto (up to 2 free host cores; 1 per node)")
	timeout := fs.String("timeout", "0", "stop CMD after this many seconds (or a duration like 5m); exit status 124")
	fs.StringVar(&o.Mem, "mem", "", "guest memory, qemu syntax (default 2G, or 1G per node; env GOVERBS_VM_MEM)")
	hugePages := fs.String("hugepages", "", "2 MiB huge pages each guest reserves, 0 for none like most machines (default 64; env GOVERBS_VM_HUGEPAGES)")
	mtu := fs.String("mtu", "", "MTU of the links rxe runs on: 1500 gives IB MTU 1024, 9000 (jumbo frames, as RoCE fabrics run) gives 4096 (default 1500; env GOVERBS_VM_MTU)")
	fs.StringVar(&o.Kernel, "kernel", os.Getenv("GOVERBS_VM_KERNEL"), "guest kernel: a linux-image .deb, a folder with boot/vmlinuz-V and lib/modules/V, a vmlinuz (modules from /lib/modules/V); default Debian's linux-image-amd64")
	fs.IntVar(&o.Devices, "devices", 0, "rxe devices per guest (default 2 in one guest, 1 per node)")
	fs.IntVar(&o.Nodes, "nodes", 1, "number of guests on a private virtual L2 network")
	fs.BoolVar(&o.Keep, "keep", false, "keep the run folder (console logs, job, exit code)")
	fs.BoolVar(&o.Verbose, "verbose", false, "print a timing line, switch counters and the guests' kernel consoles on stderr")
	fs.BoolVar(&o.Verbose, "v", false, "short for --verbose")
	var rw, loss, down multiFlag
	fs.Var(&rw, "rw", "share this host folder writable (repeatable; /tmp and $TMPDIR always are)")
	fs.Var(&loss, "loss", "NODE=PCT: drop PCT% of the frames on NODE's link (repeatable)")
	fs.Var(&down, "down", "NODE: start with NODE's link cut (a partition; repeatable)")
	fs.BoolVar(&o.Selftest, "selftest", false, "run the built-in traffic test instead of CMD")
	fs.BoolVar(&o.Setup, "setup", false, "only install dependencies and build the cache")
	fs.BoolVar(&o.Refresh, "refresh", false, "re-resolve Debian's linux-image-amd64 (after a kernel update)")
	fs.StringVar(&o.Prog, "prog", "goverbs vm", "name used in messages")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fullUsage()
			return o, nil, err
		}
		fmt.Fprintf(stderr, "see 'goverbs vm -h'\n")
		return o, nil, &exitError{code: vm.ExitUsage}
	}
	bad := func(format string, a ...any) error {
		return &exitError{code: vm.ExitUsage, msg: fmt.Sprintf(format, a...)}
	}
	if o.Nodes < 1 {
		return o, nil, bad("--nodes %d: at least 1 guest (at most %d)", o.Nodes, vm.MaxNodes)
	}
	if *cpus != "auto" {
		n, err := strconv.Atoi(*cpus)
		if err != nil || n < 1 || n > vmMaxCPUs {
			return o, nil, bad("--cpus wants a number 1..%d or auto, not %q", vmMaxCPUs, *cpus)
		}
		o.CPUs = n
	}
	if n, err := strconv.Atoi(*timeout); err == nil && n >= 0 && n <= vmMaxTimeout {
		o.Timeout = time.Duration(n) * time.Second
	} else if err == nil {
		// Whole seconds past vmMaxTimeout wrapped in time.Duration, to a
		// negative timeout (none on the host, a bad one in the guest).
		return o, nil, bad("--timeout %q: want 0..%d seconds (0: none)", *timeout, vmMaxTimeout)
	} else if d, err := time.ParseDuration(*timeout); err == nil && d >= time.Second && d <= vmMaxTimeout*time.Second {
		o.Timeout = d.Round(time.Second)
	} else {
		return o, nil, bad("--timeout wants whole seconds, not %q", *timeout)
	}
	if *hugePages != "" {
		n, err := vm.ParseHugePages(*hugePages)
		if err != nil {
			return o, nil, bad("--hugepages: %v", err)
		}
		o.HugePages = n
	}
	if *mtu != "" {
		n, err := vm.ParseMTU(*mtu)
		if err != nil {
			return o, nil, bad("--mtu: %v", err)
		}
		o.MTU = n
	}
	for _, r := range rw {
		o.RW = append(o.RW, r)
	}
	for _, l := range loss {
		n, p, ok := strings.Cut(l, "=")
		node, err1 := vm.ParseNode(n, 0)
		pct, err2 := strconv.ParseFloat(strings.TrimSuffix(p, "%"), 64)
		if !ok || err1 != nil || err2 != nil || !(pct >= 0 && pct <= 100) { // NaN too
			return o, nil, bad("--loss wants NODE=PCT (e.g. 2=5), not %q", l)
		}
		if o.Loss == nil {
			o.Loss = map[int]float64{}
		}
		o.Loss[node] = pct
	}
	for _, d := range down {
		node, err := vm.ParseNode(d, 0)
		if err != nil {
			return o, nil, bad("--down: %v", err)
		}
		if o.Down == nil {
			o.Down = map[int]bool{}
		}
		o.Down[node] = true
	}
	return o, fs.Args(), nil
}

// vmMaxCPUs is the most vCPUs a guest gets: qemu's pc machine's limit.
const vmMaxCPUs = 255

// vmMaxTimeout is the longest --timeout, in seconds: a year, far inside
// time.Duration and the guest's timeout(1).
const vmMaxTimeout = 365 * 24 * 3600

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
