// Command goverbs is a small RDMA toolbox on the goverbs driver: a pure-Go,
// cgo-free verbs implementation that talks to the kernel's uverbs ABI
// directly.
//
//	goverbs devices [-v] [-d DEV]     list devices (ibv_devices, ibv_devinfo -v)
//	goverbs rc-pingpong [flags] [HOST] ibv_rc_pingpong, wire compatible
//	goverbs ud-pingpong [flags] [HOST] ibv_ud_pingpong, wire compatible
//	goverbs srq-pingpong [flags] [HOST] ibv_srq_pingpong, wire compatible
//	goverbs perf TEST [flags] [HOST]  perftest's ib_TEST (send_lat, write_bw, ...)
//	goverbs rping|udaddy|ucmatose|mckey [flags]  rdma-core's rdma_cm tools, wire compatible
//	goverbs vm [flags] -- CMD...       run CMD in qemu guests with rxe devices
//	goverbs ps serve|bench|report ...  parameter server over ByteExpress or TCP
//	goverbs top [--once --json]        live eBPF view of uverbs commands, doorbells, rxe QPs
//	goverbs version
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/goverbs/goverbs/internal/cli"
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

// ExitCode makes exitError a cli.ExitCoder.
func (e *exitError) ExitCode() int { return e.code }

// givenFlags is the names of the flags on the command line (after
// fs.Parse): a value given explicitly, even the default's, is checked as
// given.
func givenFlags(fs *flag.FlagSet) map[string]bool {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	return given
}

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
	for _, c := range commands {
		if c.name == name {
			return cli.Exit("goverbs "+name, c.run(args[1:], stdout, stderr), stderr)
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
	if fs.NArg() > 0 {
		return usageError("unexpected argument %q", fs.Arg(0))
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

// parseGetopt is cli.ParseGetopt: getopt_long's command line, as the
// rdma-core tools take it.
func parseGetopt(fs *flag.FlagSet, args []string) ([]string, error) {
	return cli.ParseGetopt(fs, args)
}
