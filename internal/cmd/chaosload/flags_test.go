package main

import (
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/cli"
	"github.com/goverbs/goverbs/internal/clitest"
	"github.com/goverbs/goverbs/qp"
)

// TestChaosFlagsRejected: each command line is refused at once, exit
// status 1, with a message naming the command, the flag and its value,
// before an endpoint is opened (no RDMA device is needed) or a process
// touched. Before the checks each was taken as given: the command went
// on to bx.New (whose message, if any, named no flag), to a run that did
// nothing (no workers, no time), to a panic (NewTicker of a rate past
// 1e9, a --big-size below the 12-byte header), to retrying every id until
// --give-up (a payload above the max message, a --peer without a port),
// or silently ignored the value (a negative --report-every or --rate, a
// --payload below the header raised to it, operands). A command that took
// the bad value would wait (serve for signals, drive for a peer): one
// that has not returned within the hang bound is a failure, not a hang.
func TestChaosFlagsRejected(t *testing.T) {
	for i, tc := range []struct {
		args []string
		want string
	}{
		// serve: its own flags and the endpoint's (chaosFlags).
		{[]string{"serve", "extra"}, `serve: unexpected arguments ["extra"]`},
		{[]string{"serve", "--stall", "0s"}, "serve: --stall 0s"},
		{[]string{"serve", "--stall", "-1s"}, "serve: --stall -1s"},
		{[]string{"serve", "--listen", "10.99.0.2"}, `serve: --listen "10.99.0.2"`},
		{[]string{"serve", "--device", ""}, `serve: --device ""`},
		{[]string{"serve", "--credits", "2"}, "serve: --credits 2"},
		{[]string{"serve", "--credits", "-1"}, "serve: --credits -1"},
		{[]string{"serve", "--credits", "1048577"}, "serve: --credits 1048577"},
		{[]string{"serve", "--max-peers", "0"}, "serve: --max-peers 0"},
		{[]string{"serve", "--max-peers", "65537"}, "serve: --max-peers 65537"},
		{[]string{"serve", "--lanes", "5"}, "serve: --lanes 5"},
		{[]string{"serve", "--lanes", "-1"}, "serve: --lanes -1"},
		{[]string{"serve", "--memory-limit", "-1"}, "serve: --memory-limit -1"},
		{[]string{"serve", "--memory-limit", "1000"}, "serve: --memory-limit 1000"},
		{[]string{"serve", "--memory-limit", "1099511627776"}, "serve: --memory-limit 1099511627776"},
		{[]string{"serve", "--max-message", "-1"}, "serve: --max-message -1"},
		{[]string{"serve", "--max-message", "100"}, "serve: --max-message 100"},
		{[]string{"serve", "--max-message", "4194304", "--memory-limit", "2097152"}, "serve: --max-message 4194304"},
		{[]string{"serve", "--peer-timeout", "-1s"}, "serve: --peer-timeout -1s"},
		{[]string{"serve", "--memory-limit", "1048576", "--max-message", "65536"}, "serve: --max-peers 4 with 64 credits: the receive buffers bx posts (2097152 bytes"},
		{[]string{"stats", "--max-peers", "65536", "--memory-limit", "137438953472"}, "stats: --max-peers 65536 with 64 credits and 2 lanes: 12582912 handler calls queued"},
		{[]string{"drive", "--max-peers", "64", "--credits", "4096"}, "drive: --max-peers 64 with 4096 credits: the receive buffers bx posts (2147483648 bytes"},
		// drive.
		{[]string{"drive", "extra"}, `drive: unexpected arguments ["extra"]`},
		{[]string{"drive", "--peer", "10.99.0.2"}, `drive: --peer "10.99.0.2"`},
		{[]string{"drive", "--duration", "0s"}, "drive: --duration 0s"},
		{[]string{"drive", "--duration", "-5s"}, "drive: --duration -5s"},
		{[]string{"drive", "--duration", "100000h"}, "drive: --duration 100000h0m0s"},
		{[]string{"drive", "--concurrency", "0"}, "drive: --concurrency 0"},
		{[]string{"drive", "--concurrency", "-1"}, "drive: --concurrency -1"},
		{[]string{"drive", "--concurrency", "100000000"}, "drive: --concurrency 100000000"},
		{[]string{"drive", "--rate", "NaN"}, "drive: --rate NaN"},
		{[]string{"drive", "--rate", "-1"}, "drive: --rate -1"},
		{[]string{"drive", "--rate", "+Inf"}, "drive: --rate +Inf"},
		{[]string{"drive", "--rate", "2e9"}, "drive: --rate 2e+09"},
		{[]string{"drive", "--rate", "1e-300"}, "drive: --rate 1e-300"},
		{[]string{"drive", "--payload", "11"}, "drive: --payload 11"},
		{[]string{"drive", "--payload", "-1"}, "drive: --payload -1"},
		{[]string{"drive", "--payload", "4194305"}, "drive: --payload 4194305"},
		{[]string{"drive", "--payload", "70000", "--max-message", "65536"}, "drive: --payload 70000"},
		{[]string{"drive", "--big-every", "-1"}, "drive: --big-every -1"},
		{[]string{"drive", "--big-every", "1", "--big-size", "8"}, "drive: --big-size 8"},
		{[]string{"drive", "--big-every", "1", "--big-size", "-1"}, "drive: --big-size -1"},
		{[]string{"drive", "--big-every", "2", "--big-size", "5000000"}, "drive: --big-size 5000000"},
		{[]string{"drive", "--big-every", "1", "--big-size", "300000", "--max-message", "262144"}, "drive: --big-size 300000"},
		{[]string{"drive", "--call-timeout", "0s"}, "drive: --call-timeout 0s"},
		{[]string{"drive", "--give-up", "-1s"}, "drive: --give-up -1s"},
		{[]string{"drive", "--give-up", "2562047h"}, "drive: --give-up 2562047h0m0s"},
		{[]string{"drive", "--report-every", "-1m"}, "drive: --report-every -1m0s"},
		{[]string{"drive", "--max-rss", "-1"}, "drive: --max-rss -1"},
		{[]string{"drive", "--lanes", "9"}, "drive: --lanes 9"},
		{[]string{"drive", "--device", ""}, `drive: --device ""`},
		// verify and stats.
		{[]string{"verify"}, `verify: --journal ""`},
		{[]string{"verify", "--journal", "j", "extra"}, `verify: unexpected arguments ["extra"]`},
		{[]string{"verify", "--journal", "j", "--max-peers", "0"}, "verify: --max-peers 0"},
		{[]string{"verify", "--journal", "j", "--peer", ":"}, `verify: --peer ":"`},
		{[]string{"stats", "extra"}, `stats: unexpected arguments ["extra"]`},
		{[]string{"stats", "--server-lanes", "0"}, "stats: --server-lanes 0"},
		{[]string{"stats", "--server-lanes", "5"}, "stats: --server-lanes 5"},
		{[]string{"stats", "--max-rss", "-1"}, "stats: --max-rss -1"},
		{[]string{"stats", "--credits", "1"}, "stats: --credits 1"},
		{[]string{"stats", "--peer", "nohost"}, `stats: --peer "nohost"`},
		// break: a pid past PID_MAX_LIMIT names no process.
		{[]string{"break", "--pid", "99999999999"}, "break: --pid 99999999999"},
		{[]string{"break", "--pid", "4194305"}, "break: --pid 4194305"},
	} {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			code, msg, stdout := chaosQuickRun(t, tc.args)
			if code != 1 || !strings.Contains(msg, tc.want) {
				t.Errorf("chaosload %q: exit %d (want 1), message %q (want it to name %q)", tc.args, code, msg, tc.want)
			}
			if stdout != "" {
				t.Errorf("chaosload %q printed %q", tc.args, stdout)
			}
		})
	}
}

// chaosQuickRun is runChaosLoad(args) that must return within the hang
// bound (30 s, scaled by hang.Scale); it returns the exit status and
// message cli.Exit makes of its error, and its stdout. A panic is
// reported as a failure.
func chaosQuickRun(t *testing.T, args []string) (code int, msg, stdout string) {
	t.Helper()
	code, stdout, msg = clitest.Run(t, 30*time.Second, "chaosload", args, func(args []string, stdout, msg io.Writer) int {
		return cli.Exit("chaosload", runChaosLoad(args, stdout, io.Discard), msg)
	})
	return code, msg, stdout
}

// TestChaosFlagsValid: the command lines scripts/chaos, scripts/ps-cluster
// and docs/reliability.md run (with the values their variables take:
// CHAOS_SCALE 3, the soak's 10m) pass the checks and parse to what they
// say; the defaults pass too.
func TestChaosFlagsValid(t *testing.T) {
	drv := func(peer string, dur time.Duration, conc int, mod func(*chaosDriveOpts)) chaosDriveOpts {
		o := chaosDriveOpts{peer: peer, duration: dur, conc: conc, payload: 64, bigSize: 256 << 10,
			callTimeout: 10 * time.Second, giveUp: 60 * time.Second, maxRSS: 512 << 10}
		if mod != nil {
			mod(&o)
		}
		return o
	}
	const peer = "10.99.0.2:18901"
	std := []string{"--device", "rxe0", "--peer", peer, "--max-rss", "524288", "--call-timeout", "30s", "--give-up", "180s"}
	scaled := func(o *chaosDriveOpts) { o.callTimeout, o.giveUp = 30*time.Second, 180*time.Second }
	mem := []string{"--memory-limit", "2097152", "--max-message", "262144", "--max-peers", "2"}
	for _, tc := range []struct {
		args []string
		want chaosDriveOpts
		cfg  bx.Config // Device, MaxPeers, MemoryLimit, MaxMessage checked
	}{
		{nil, drv("10.99.0.2:18900", 20*time.Second, 8, nil), bx.Config{Device: "rxe0", MaxPeers: 4}},
		{slices.Concat(std, []string{"--duration", "6s", "--concurrency", "8"}), drv(peer, 6*time.Second, 8, scaled), bx.Config{Device: "rxe0", MaxPeers: 4}},
		{slices.Concat(std, []string{"--duration", "30s", "--concurrency", "24", "--big-every", "1", "--big-size", "98304"}, mem),
			drv(peer, 30*time.Second, 24, func(o *chaosDriveOpts) { scaled(o); o.bigEvery, o.bigSize = 1, 98304 }),
			bx.Config{Device: "rxe0", MaxPeers: 2, MemoryLimit: 2 << 20, MaxMessage: 256 << 10}},
		{slices.Concat(std, []string{"--duration", "10m", "--concurrency", "8", "--report-every", "1m"}),
			drv(peer, 10*time.Minute, 8, func(o *chaosDriveOpts) { scaled(o); o.every = time.Minute }), bx.Config{Device: "rxe0", MaxPeers: 4}},
		{[]string{"--device", "rxe0", "--peer", peer, "--duration", "15s", "--concurrency", "8", "--journal", "/tmp/chaos/worker-kill/killed.journal"},
			drv(peer, 15*time.Second, 8, func(o *chaosDriveOpts) { o.journal = "/tmp/chaos/worker-kill/killed.journal" }), bx.Config{Device: "rxe0", MaxPeers: 4}},
		{[]string{"--device=rxe0", "--peer=10.99.0.2:18900", "--duration=30s", "--concurrency=8", "--rate=1000"},
			drv("10.99.0.2:18900", 30*time.Second, 8, func(o *chaosDriveOpts) { o.rate = 1000 }), bx.Config{Device: "rxe0", MaxPeers: 4}},
	} {
		o, ef, err := chaosDriveFlags(tc.args, io.Discard)
		if err != nil {
			t.Errorf("drive %q: %v", tc.args, err)
			continue
		}
		c := ef.config()
		if o != tc.want || c.Device != tc.cfg.Device || c.MaxPeers != tc.cfg.MaxPeers || c.MemoryLimit != tc.cfg.MemoryLimit || c.MaxMessage != tc.cfg.MaxMessage {
			t.Errorf("drive %q:\n%+v %+v\nwant\n%+v %+v", tc.args, o, c, tc.want, tc.cfg)
		}
	}
	for _, tc := range []struct {
		args    []string
		listen  string
		credits int
	}{
		{nil, "10.99.0.2:18900", 0},
		{[]string{"--device", "rxe1", "--listen", peer}, peer, 0},
		{[]string{"--device", "rxe1", "--listen", peer, "--credits", "8", "--stall", "3s"}, peer, 8},
		{slices.Concat([]string{"--device", "rxe1", "--listen", peer}, mem), peer, 0},
	} {
		if o, ef, err := chaosServeFlags(tc.args, io.Discard); err != nil {
			t.Errorf("serve %q: %v", tc.args, err)
		} else if c := ef.config(); o.listen != tc.listen || o.stall != 3*time.Second || c.Device != "rxe1" || c.Credits != tc.credits {
			t.Errorf("serve %q: %+v %+v", tc.args, o, c)
		}
	}
	for _, args := range [][]string{
		{"--device", "rxe0", "--peer", peer, "--journal", "/tmp/chaos/worker-kill/killed.journal"},
		{"--peer", "10.99.0.2:18900", "--journal", "F"},
	} {
		if o, _, err := chaosVerifyFlags(args, io.Discard); err != nil || o.journal != args[len(args)-1] {
			t.Errorf("verify %q: %+v %v", args, o, err)
		}
	}
	for _, args := range [][]string{
		{"--check", "--device", "rxe0", "--peer", peer, "--server-lanes", "2", "--max-rss", "524288"},
		{"--check", "--peer", "10.99.0.2:18900"},
		nil,
	} {
		if o, _, err := chaosStatsFlags(args, io.Discard); err != nil || o.check != (args != nil) || o.srvLanes != 2 || o.maxRSS != 512<<10 {
			t.Errorf("stats %q: %+v %v", args, o, err)
		}
	}
	for _, tc := range []struct {
		args []string
		pid  int
		st   qp.State
	}{
		{[]string{"--pid", "4242"}, 4242, qp.Err},
		{[]string{"--pid", "4194304", "--state", "sqd"}, 4194304, qp.SQD},
	} {
		if o, err := chaosBreakFlags(tc.args, io.Discard); err != nil || o.pid != tc.pid || o.st != tc.st {
			t.Errorf("break %q: %+v %v", tc.args, o, err)
		}
	}
}
