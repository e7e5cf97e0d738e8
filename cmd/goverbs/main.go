// Command goverbs is a small RDMA toolbox on the goverbs driver: a pure-Go,
// cgo-free verbs implementation that talks to the kernel's uverbs ABI
// directly.
//
//	goverbs devices [-v] [-d DEV]     list devices (ibv_devices, ibv_devinfo -v)
//	goverbs rc-pingpong [flags] [HOST] ibv_rc_pingpong, wire compatible
//	goverbs ud-pingpong [flags] [HOST] ibv_ud_pingpong, wire compatible
//	goverbs srq-pingpong [flags] [HOST] ibv_srq_pingpong, wire compatible
//	goverbs perf TEST [flags] [HOST]  perftest's ib_TEST (send_lat, write_bw, ...)
//	goverbs vm [flags] -- CMD...       run CMD in qemu guests with rxe devices
//	goverbs ps serve|bench|report ...  parameter server over ByteExpress or TCP
//	goverbs top [--once --json]        live eBPF view of uverbs commands, doorbells, rxe QPs
//	goverbs version
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
)

// version is set with -ldflags "-X main.version=..."; otherwise the module
// version from the build info is used.
var version = ""

// exitError carries an exit status; main prints its message (if any).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// usageError is a bad command line: exit status 1, like rc_pingpong.
func usageError(format string, a ...any) error {
	return &exitError{code: 1, msg: fmt.Sprintf(format, a...)}
}

type command struct {
	name, summary string
	run           func(args []string, stdout, stderr io.Writer) error
}

var commands []command

func init() {
	commands = []command{
		{"devices", "list RDMA devices, ports and GIDs (like ibv_devices, ibv_devinfo -v)", runDevices},
		{"rc-pingpong", "RC SEND ping-pong, wire compatible with rdma-core's ibv_rc_pingpong", runPingpong},
		{"ud-pingpong", "UD SEND ping-pong, wire compatible with rdma-core's ibv_ud_pingpong", runUDPingpong},
		{"srq-pingpong", "RC SEND ping-pong over many QPs and one SRQ, wire compatible with ibv_srq_pingpong", runSRQPingpong},
		{"vm", "run a command as root in throw-away qemu guests with rxe devices (docs/vm.md)", runVM},
		{"rping", "RDMA ping over rdma_cm (RDMA READ and WRITE), wire compatible with rdma-core's rping", runRping},
		{"udaddy", "UD datagrams over rdma_cm (SIDR), wire compatible with rdma-core's udaddy", runUdaddy},
		{"ucmatose", "RC SENDs both ways over rdma_cm, wire compatible with rdma-core's ucmatose (cmatose)", runUcmatose},
		{"mckey", "UD multicast over rdma_cm (join, send, leave), wire compatible with rdma-core's mckey", runMckey},
		{"perf", "perftest-like latency and bandwidth tests (send_lat, write_lat, read_bw, ...)", runPerf},
		{"ps", "parameter server over ByteExpress (rdma) or TCP: serve, bench, report", runPS},
		{"top", "live view of uverbs commands, doorbells, rxe QPs and retransmits (eBPF probes)", runTop},
		{"version", "print the version", runVersion},
	}
}

func mainUsage(w io.Writer) {
	fmt.Fprintf(w, "Usage: goverbs COMMAND [flags] [args]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'goverbs COMMAND -h' for a command's flags.\n")
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		mainUsage(stderr)
		return 1
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help", "help":
		mainUsage(stdout)
		return 0
	case "-version", "--version":
		name = "version"
	}
	for _, c := range append(commands, hiddenCommands...) {
		if c.name == name {
			err := c.run(args[1:], stdout, stderr)
			if err == nil {
				return 0
			}
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			var ee *exitError
			if errors.As(err, &ee) {
				if ee.msg != "" {
					fmt.Fprintf(stderr, "goverbs %s: %s\n", name, ee.msg)
				}
				return ee.code
			}
			fmt.Fprintf(stderr, "goverbs %s: %v\n", name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "goverbs: unknown command %q\n\n", name)
	mainUsage(stderr)
	return 1
}

func runVersion(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("goverbs version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	v := version
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		var rev, dirty string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					dirty = "+dirty"
				}
			}
		}
		if rev != "" {
			if len(rev) > 12 {
				rev = rev[:12]
			}
			v += " (" + rev + dirty + ")"
		}
	}
	if v == "" {
		v = "(devel)"
	}
	fmt.Fprintf(stdout, "goverbs %s %s %s/%s\n", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}

// parseGetopt parses args the way getopt_long does for the rdma-core tools,
// with Go's flag package doing the value parsing: flags and operands may be
// mixed ("goverbs rc-pingpong 10.0.0.2 -n 10"), short options may be
// clustered or take their value attached ("-ce", "-p18515", "-n10"), long
// options take "--name=value" or "--name value". A single-dash word that
// names a defined long flag ("-iters 10") is taken as that flag, as Go
// users would expect. It returns the operands.
func parseGetopt(fs *flag.FlagSet, args []string) ([]string, error) {
	var flags, operands []string
	needsValue := func(f *flag.Flag) bool {
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			return false
		}
		return true
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			operands = append(operands, args[i+1:]...)
			i = len(args)
		case a == "-" || !strings.HasPrefix(a, "-"):
			operands = append(operands, a)
		default:
			name := strings.TrimLeft(a, "-")
			name, _, hasValue := strings.Cut(name, "=")
			f := fs.Lookup(name)
			if strings.HasPrefix(a, "--") || (f != nil && len(name) > 1) || len(a) == 2 {
				flags = append(flags, a)
				if f != nil && needsValue(f) && !hasValue && i+1 < len(args) {
					i++
					flags = append(flags, args[i])
				}
				continue
			}
			// A cluster of short options: -ce, -p18515, -n10.
			cl := a[1:]
			for j := 0; j < len(cl); j++ {
				sf := fs.Lookup(cl[j : j+1])
				if sf == nil || !needsValue(sf) {
					flags = append(flags, "-"+cl[j:j+1]) // an unknown one makes Parse fail
					continue
				}
				if j+1 < len(cl) {
					flags = append(flags, "-"+cl[j:j+1], cl[j+1:])
				} else {
					flags = append(flags, "-"+cl[j:j+1])
					if i+1 < len(args) {
						i++
						flags = append(flags, args[i])
					}
				}
				break
			}
		}
	}
	if err := fs.Parse(flags); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, &exitError{code: 1} // flag already printed the error and usage
	}
	return append(operands, fs.Args()...), nil
}
