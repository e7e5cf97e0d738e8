package probe

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/uverbs"
)

// attach attaches every probe or skips when this process may not load BPF
// programs at all.
func attach(t *testing.T, opts Options) *Probes {
	t.Helper()
	p, err := Attach(opts)
	if err != nil {
		if os.Geteuid() != 0 && !rxetest.Required() {
			t.Skipf("not root: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if err := p.Close(); err != nil {
			t.Errorf("second close: %v", err)
		}
	})
	for _, s := range p.Status() {
		t.Logf("%-16s attached=%v via=%q %s", s.Name, s.Attached, s.Via, s.Reason)
		if noTracing && s.Via == "fentry/fexit" {
			t.Errorf("%s attached with fentry/fexit while they are off", s.Name)
		}
	}
	return p
}

// kprobesOnly makes the test's Attach use kprobes, not fentry/fexit.
func kprobesOnly(t *testing.T) {
	noTracing = true
	t.Cleanup(func() { noTracing = false })
}

// TestAttachDegrades runs anywhere: on a kernel without kprobes or without
// rdma_rxe (the development host) the rxe probes and cq-events are
// reported with a reason and the syscall tracepoint probes still attach;
// with ib_uverbs' BTF the command probes hang off ib_uverbs_write and
// ib_uverbs_ioctl, not every system call.
func TestAttachDegrades(t *testing.T) {
	p := attach(t, Options{PerPacket: true})
	for _, name := range []string{"uverbs-commands"} {
		if !p.Attached(name) {
			t.Errorf("%s not attached", name)
		}
	}
	for _, s := range p.Status() {
		if !s.Attached && s.Reason == "" {
			t.Errorf("%s: not attached and no reason", s.Name)
		}
	}
	rxe := kprobesSupported() == nil
	if _, err := os.Stat("/sys/kernel/btf/rdma_rxe"); err != nil {
		rxe = false
	}
	uv := kprobesSupported() == nil
	if _, err := os.Stat("/sys/kernel/btf/ib_uverbs"); err != nil {
		uv = false
	}
	for _, s := range p.Status() {
		if strings.HasPrefix(s.Name, "rxe-") && s.Attached != rxe {
			t.Errorf("%s: attached=%v, but kprobes+rdma_rxe BTF present=%v (%s)", s.Name, s.Attached, rxe, s.Reason)
		}
		if s.Name == "cq-events" && s.Attached != uv {
			t.Errorf("%s: attached=%v, but kprobes+ib_uverbs BTF present=%v (%s)", s.Name, s.Attached, uv, s.Reason)
		}
		if s.Name == "uverbs-commands" && (s.Via == "raw tracepoints") == uv {
			t.Errorf("%s: via %s, but kprobes+ib_uverbs BTF present=%v (%s)", s.Name, s.Via, uv, s.Reason)
		}
		if s.Attached && s.Via == "" {
			t.Errorf("%s: attached, but via nothing", s.Name)
		}
	}
	if got, want := len(p.Status()), len(Names()); got != want {
		t.Errorf("%d probes reported, Names has %d", got, want)
	}
	if _, err := p.Snapshot(); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if _, err := p.Snapshot(); !errors.Is(err, ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Fatalf("Snapshot after Close: %v, want ErrClosed", err)
	}
}

// TestSkip: a skipped probe is reported as such, and so are the
// per-packet probes when Options.PerPacket is not set.
func TestSkip(t *testing.T) {
	p := attach(t, Options{Skip: []string{"rxe-rnr"}})
	perPacket := map[string]bool{"rxe-packets": true, "rxe-retransmits": true, "rxe-completions": true}
	for _, s := range p.Status() {
		if s.Name == "rxe-rnr" && (s.Attached || !strings.Contains(s.Reason, "skipped")) {
			t.Errorf("%+v", s)
		}
		if perPacket[s.Name] && (s.Attached || !strings.Contains(s.Reason, "PerPacket")) {
			t.Errorf("per-packet probe without Options.PerPacket: %+v", s)
		}
	}
}

// TestOwnCommands counts this process's own uverbs commands: a query per
// open context, through the pid filter.
func TestOwnCommands(t *testing.T) {
	dev := rxetest.One(t)
	p := attach(t, Options{PIDs: []int{os.Getpid()}})
	ctx, err := uverbs.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	for range n {
		if _, err := ctx.QueryPort(1); err != nil {
			t.Fatal(err)
		}
	}
	if err := ctx.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var total uint64
	for _, c := range s.Commands {
		t.Logf("%+v", c)
		if c.PID != os.Getpid() {
			t.Errorf("pid filter let %d through: %+v", c.PID, c)
		}
		if c.Device != dev {
			t.Errorf("device %q, want %s: %+v", c.Device, dev, c)
		}
		var h uint64
		for _, b := range c.Hist {
			h += b
		}
		if h != c.Count {
			t.Errorf("histogram holds %d, count %d", h, c.Count)
		}
		total += c.Count
	}
	if total < n {
		t.Errorf("%d uverbs commands counted, want at least %d", total, n)
	}
}

var (
	binOnce string
	binErr  error
)

// goverbsBin is the goverbs binary: scripts/vm's copy in the guest
// (GOVERBS_VM_BIN), else one built with go build.
func goverbsBin(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("GOVERBS_VM_BIN"); b != "" {
		return b
	}
	if binOnce == "" && binErr == nil {
		dir := os.TempDir()
		if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
			dir = "/dev/shm" // the linker cannot mmap its output on 9p
		}
		out := filepath.Join(dir, fmt.Sprintf("goverbs-probe-test-%d", os.Getpid()))
		cmd := exec.Command("go", "build", "-o", out, "github.com/goverbs/goverbs/cmd/goverbs")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v: %s", err, b)
		} else {
			binOnce = out
		}
	}
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binOnce
}

// side is one rc-pingpong process.
type side struct {
	dev    string
	pid    int
	qpn    uint32
	stderr bytes.Buffer
	stdout bytes.Buffer
	err    error
}

var qpnRE = regexp.MustCompile(`local address:.*QPN 0x([0-9a-f]+)`)

// pingpong runs `goverbs rc-pingpong -n iters` between two devices.
func pingpong(t *testing.T, iters int, port int, extra ...string) (cli, srv *side) {
	t.Helper()
	return pingpongWith(t, iters, port, extra, nil)
}

// pingpongWith runs `goverbs rc-pingpong -n iters ARGS...` between two
// devices, with env added to the environment.
func pingpongWith(t *testing.T, iters int, port int, args, env []string) (cli, srv *side) {
	t.Helper()
	a, b := rxetest.Pair(t)
	bin := goverbsBin(t)
	ctx := rxetest.Open(t, b)
	g, err := ctx.DefaultGID(1)
	if err != nil || g.GID.To4() == nil {
		t.Skipf("%s: no IPv4 RoCE v2 GID (%v)", b, err)
	}
	host := g.GID.To4().String()
	cctx, cancel := context.WithTimeout(context.Background(), hang.Scale(3*time.Minute)) // a hang bound
	defer cancel()
	run := func(s *side, a ...string) *exec.Cmd {
		cmd := exec.CommandContext(cctx, bin, a...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stdout, cmd.Stderr = &s.stdout, &s.stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		s.pid = cmd.Process.Pid
		return cmd
	}
	n := strconv.Itoa(iters)
	p := strconv.Itoa(port)
	srv, cli = &side{dev: b}, &side{dev: a}
	common := append([]string{"rc-pingpong", "-p", p, "-n", n, "-s", "64"}, args...)
	sc := run(srv, append(slices.Clone(common), "-d", b)...)
	if !waitListen(port, hang.Scale(2*time.Minute)) { // a hang bound: a loaded machine starts the server late
		sc.Wait()
		t.Fatalf("server never listened: %s", srv.stderr.String())
	}
	cc := run(cli, append(slices.Clone(common), "-d", a, host)...)
	cli.err, srv.err = cc.Wait(), sc.Wait()
	for _, s := range []*side{cli, srv} {
		if s.err != nil {
			t.Fatalf("%s: %v: %s", s.dev, s.err, s.stderr.String())
		}
		m := qpnRE.FindStringSubmatch(s.stdout.String() + s.stderr.String())
		if m == nil {
			t.Fatalf("no QPN in %q %q", s.stdout.String(), s.stderr.String())
		}
		q, _ := strconv.ParseUint(m[1], 16, 32)
		s.qpn = uint32(q)
	}
	return cli, srv
}

func waitListen(port int, d time.Duration) bool {
	hexPort := fmt.Sprintf(":%04X ", port)
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			b, _ := os.ReadFile(f)
			sc := bufio.NewScanner(bytes.NewReader(b))
			for sc.Scan() {
				fs := strings.Fields(sc.Text())
				if len(fs) > 3 && strings.HasSuffix(fs[1]+" ", hexPort) && fs[3] == "0A" {
					return true
				}
			}
		}
	}
	return false
}

func findQP(s *Snapshot, dev string, qpn uint32) QP {
	for _, q := range s.QPs {
		if q.Device == dev && q.QPN == qpn {
			return q
		}
	}
	return QP{Device: dev, QPN: qpn}
}

func hwDelta(before, after map[string]uint64) map[string]uint64 {
	d := map[string]uint64{}
	for k, v := range after {
		d[k] = v - before[k]
	}
	return d
}

// TestPingpongCounts: during N rc-pingpong iterations the probes count, per
// side, N doorbells (one POST_SEND write per PostSend batch: the workload
// posts one send per iteration), N send and N receive completions on its
// QP, and as many packets as rxe's own hw_counters.
func TestPingpongCounts(t *testing.T) { testPingpongCounts(t, 18830) }

// TestPingpongCountsKprobes is TestPingpongCounts with the programs
// attached as kprobes, the way kernels without BPF trampolines get them.
func TestPingpongCountsKprobes(t *testing.T) {
	kprobesOnly(t)
	testPingpongCounts(t, 18834)
}

func testPingpongCounts(t *testing.T, port int) {
	a, b := rxetest.Pair(t)
	p := attach(t, Options{PerPacket: true})
	for _, name := range []string{"uverbs-commands", "rxe-packets", "rxe-completions"} {
		if !p.Attached(name) {
			t.Fatalf("%s not attached", name)
		}
	}
	hw0 := map[string]map[string]uint64{a: HWCounters(a, 1), b: HWCounters(b, 1)}
	const iters = 500
	cli, srv := pingpong(t, iters, port)
	s, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]uint64{}
	for _, c := range s.Commands {
		seen[c.PID] += c.Count
	}
	t.Logf("uverbs commands per pid: %v", seen)
	for _, sd := range []*side{cli, srv} {
		var doorbells, cmds uint64
		for _, c := range s.Commands {
			if c.PID != sd.pid {
				continue
			}
			cmds += c.Count
			if c.Doorbell() {
				doorbells += c.Count
				if c.Device != sd.dev {
					t.Errorf("doorbell on %q, want %s", c.Device, sd.dev)
				}
			}
		}
		t.Logf("%s pid %d qpn %#x: %d uverbs commands, %d doorbells", sd.dev, sd.pid, sd.qpn, cmds, doorbells)
		if doorbells != iters {
			t.Errorf("%s: %d doorbells, want %d (one PostSend batch per iteration)", sd.dev, doorbells, iters)
		}
		q := findQP(s, sd.dev, sd.qpn)
		t.Logf("%+v", q)
		if q.SendCompletions != iters || q.RecvCompletions != iters {
			t.Errorf("%s qp %#x: %d send, %d recv completions, want %d each", sd.dev, sd.qpn, q.SendCompletions, q.RecvCompletions, iters)
		}
	}
	for _, dev := range []string{a, b} {
		hw := hwDelta(hw0[dev], HWCounters(dev, 1))
		var sent, recv uint64
		for _, q := range s.QPs {
			if q.Device == dev {
				sent += q.SentPkts
				recv += q.RecvPkts
			}
		}
		t.Logf("%s: probes sent %d recv %d; hw_counters sent_pkts %d rcvd_pkts %d", dev, sent, recv, hw["sent_pkts"], hw["rcvd_pkts"])
		if sent != hw["sent_pkts"] || recv != hw["rcvd_pkts"] {
			t.Errorf("%s: probes sent %d recv %d packets, hw_counters say %d and %d", dev, sent, recv, hw["sent_pkts"], hw["rcvd_pkts"])
		}
	}
}

// TestRetransmitsUnderLoss: with 5% netem loss on the client's link the
// retransmit counter rises and matches rxe's completer_retry_err, and with
// 4-packet messages the per-QP sequence NAKs received rise with rxe's
// rcvd_seq_err (RNR NAKs: as many as rcvd_rnr_err, none here).
func TestRetransmitsUnderLoss(t *testing.T) {
	a, b := rxetest.Pair(t)
	p := attach(t, Options{PerPacket: true})
	if !p.Attached("rxe-retransmits") {
		t.Fatal("rxe-retransmits not attached")
	}
	tc, err := exec.LookPath("tc")
	if err != nil {
		t.Skip("no tc for netem")
	}
	var nets []string
	for _, dev := range []string{a, b} {
		m, _ := filepath.Glob(filepath.Join("/sys/class/infiniband", dev, "device/net/*"))
		if len(m) == 0 {
			// rxe has no parent device; its netdev is in "parent".
			bb, err := os.ReadFile(filepath.Join("/sys/class/infiniband", dev, "parent"))
			if err != nil {
				t.Skipf("%s: netdev unknown: %v", dev, err)
			}
			nets = append(nets, strings.TrimSpace(string(bb)))
		} else {
			nets = append(nets, filepath.Base(m[0]))
		}
	}
	for _, nd := range nets {
		if out, err := exec.Command(tc, "qdisc", "add", "dev", nd, "root", "netem", "loss", "5%").CombinedOutput(); err != nil {
			t.Skipf("netem on %s: %v: %s", nd, err, out)
		}
		t.Cleanup(func() { exec.Command(tc, "qdisc", "del", "dev", nd, "root").Run() })
	}
	hw0 := map[string]map[string]uint64{a: HWCounters(a, 1), b: HWCounters(b, 1)}
	// small: each lost packet costs a retransmit timeout. --linger: the
	// last send whose ACK is lost is still answered (else, at retry count
	// 7, infinite on rxe, its sender would wait forever).
	cli, srv := pingpong(t, 150, 18831, "--linger", "2s")
	// 4 KiB messages are 4 packets at rxe's 1 KiB MTU: a lost packet
	// followed by the next one makes the responder NAK a PSN sequence
	// error, which the sender's completer receives.
	pingpong(t, 60, 18836, "--linger", "2s", "-s", "4096")
	s, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var total, totalNaks uint64
	for _, sd := range []*side{cli, srv} {
		hw := hwDelta(hw0[sd.dev], HWCounters(sd.dev, 1))
		var retr, rto, seqNaks, rnrNaks uint64
		for _, q := range s.QPs {
			if q.Device == sd.dev {
				retr += q.Retransmits
				rto += q.Timeouts
				seqNaks += q.SeqNaks
				rnrNaks += q.RNRNaks
			}
		}
		t.Logf("%s: probes seq NAKs %d, RNR NAKs %d received", sd.dev, seqNaks, rnrNaks)
		// rxe counts rcvd_seq_err when it acts on a sequence NAK (one
		// that moves the completer on); the probe sees every one queued.
		if seqNaks < hw["rcvd_seq_err"] || (hw["rcvd_seq_err"] > 0 && seqNaks == 0) {
			t.Errorf("%s: probes count %d sequence NAKs received, hw_counters rcvd_seq_err %d", sd.dev, seqNaks, hw["rcvd_seq_err"])
		}
		if rnrNaks != hw["rcvd_rnr_err"] {
			t.Errorf("%s: probes count %d RNR NAKs received, hw_counters rcvd_rnr_err %d", sd.dev, rnrNaks, hw["rcvd_rnr_err"])
		}
		totalNaks += hw["rcvd_seq_err"]
		q := findQP(s, sd.dev, sd.qpn)
		t.Logf("%s: probes retransmits %d (qp %#x: %+v), timeouts %d; hw_counters completer_retry_err %d rcvd_seq_err %d rcvd_rnr_err %d out_of_seq_request %d",
			sd.dev, retr, sd.qpn, q, rto, hw["completer_retry_err"], hw["rcvd_seq_err"], hw["rcvd_rnr_err"], hw["out_of_seq_request"])
		if retr != hw["completer_retry_err"] {
			t.Errorf("%s: probes count %d retransmits, hw_counters completer_retry_err %d", sd.dev, retr, hw["completer_retry_err"])
		}
		total += retr
	}
	if total == 0 {
		t.Errorf("no retransmits under 5%% loss")
	}
	if totalNaks == 0 {
		t.Errorf("no sequence NAKs under 5%% loss with 4-packet messages (rcvd_seq_err 0 on both devices)")
	}
}

var (
	wakeupsRE  = regexp.MustCompile(`(?m)^goverbs rc-pingpong: -e: (\d+) CQ arms, (\d+) event wakeups, (\d+) sleeps$`)
	chEventsRE = regexp.MustCompile(`(?m)^goverbs rc-pingpong: -e: (\d+) completion events read from the channel$`)
)

// TestCQEvents: during N event-driven rc-pingpong iterations (-e: arm the
// CQ, sleep on the completion channel) the cq-events probe counts, per
// process, exactly the events the process read from its channel
// (GOVERBS_PINGPONG_DEBUG=1 prints its own counts), all paired with their
// raise on the process's device, each with a positive latency under 2 s;
// and per device as many events raised as read.
func TestCQEvents(t *testing.T) { testCQEvents(t, 18832) }

// TestCQEventsKprobes is TestCQEvents with kprobes and kretprobes.
func TestCQEventsKprobes(t *testing.T) {
	kprobesOnly(t)
	testCQEvents(t, 18835)
}

func testCQEvents(t *testing.T, port int) {
	rxetest.Pair(t)
	p := attach(t, Options{})
	if !p.Attached("cq-events") {
		t.Fatal("cq-events not attached")
	}
	s0, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	const iters = 300
	cli, srv := pingpongWith(t, iters, port, []string{"-e"}, []string{"GOVERBS_PINGPONG_DEBUG=1"})
	s, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, sd := range []*side{cli, srv} {
		m := wakeupsRE.FindStringSubmatch(sd.stderr.String())
		e := chEventsRE.FindStringSubmatch(sd.stderr.String())
		if m == nil || e == nil {
			t.Fatalf("%s: no -e counts on stderr: %s", sd.dev, sd.stderr.String())
		}
		arms, _ := strconv.ParseUint(m[1], 10, 64)
		wakeups, _ := strconv.ParseUint(m[2], 10, 64)
		read, _ := strconv.ParseUint(e[1], 10, 64)
		var got CQEvents
		got.Hist = make([]uint64, numBuckets)
		for _, ev := range s.CQEvents {
			if ev.PID != sd.pid {
				continue
			}
			t.Logf("%s pid %d: %d events read, %d unmatched, mean %.1f us, log2(ns) histogram %v",
				ev.Device, ev.PID, ev.Count, ev.Unmatched, float64(ev.TotalNS)/float64(max(ev.Count, 1))/1e3, ev.Hist)
			if ev.Device != sd.dev && ev.Count > 0 {
				t.Errorf("pid %d: %d events on %q, want %s", sd.pid, ev.Count, ev.Device, sd.dev)
			}
			got.Count += ev.Count
			got.Unmatched += ev.Unmatched
			got.TotalNS += ev.TotalNS
			for i, v := range ev.Hist {
				got.Hist[i] += v
			}
		}
		raised := s.EventsRaised[sd.dev] - s0.EventsRaised[sd.dev]
		t.Logf("%s: process: %d arms, %d wakeups, %d events read; probe: %d read (%d unmatched), %d raised on %s",
			sd.dev, arms, wakeups, read, got.Count+got.Unmatched, got.Unmatched, raised, sd.dev)
		if got.Count+got.Unmatched != read {
			t.Errorf("%s: probe saw %d events read, the process read %d", sd.dev, got.Count+got.Unmatched, read)
		}
		if got.Unmatched != 0 {
			t.Errorf("%s: %d events read could not be paired with their raise", sd.dev, got.Unmatched)
		}
		if read < wakeups || read > arms || read == 0 {
			t.Errorf("%s: %d events read, want between the %d wakeups and the %d arms, and some", sd.dev, read, wakeups, arms)
		}
		// The ping-pong's CQ reads its channel itself (cq.Options.Events):
		// an event is read only by a Wait that sleeps. The arm of the last
		// Wait that found a completion by polling instead can raise one
		// event that no Wait reads (rdma-core's ibv_rc_pingpong -e leaves
		// one the same way); the kernel frees it with the CQ. So one
		// event per CQ may stay unread, never more, and none may be read
		// that was not raised.
		if raised < read || raised > read+1 {
			t.Errorf("%s: %d events raised, %d read: want the same, or one more raised (the last arm's)", sd.dev, raised, read)
		}
		var inHist uint64
		for i, v := range got.Hist {
			inHist += v
			if v > 0 && (i < 6 || i > 30) {
				t.Errorf("%s: %d events read [2^%d, 2^%d) ns after they were raised: want 64 ns .. 2 s", sd.dev, v, i, i+1)
			}
		}
		if inHist != got.Count {
			t.Errorf("%s: histogram holds %d, count %d", sd.dev, inHist, got.Count)
		}
		if mean := float64(got.TotalNS) / float64(max(got.Count, 1)); got.Count > 0 && (mean < 64 || mean > 2e9) {
			t.Errorf("%s: mean latency %.0f ns", sd.dev, mean)
		}
	}
}

// TestFetchAddEncoding: the fetch-and-add the cq-events handler numbers
// events with marshals as BPF_ATOMIC|BPF_DW|BPF_STX with imm
// BPF_ADD|BPF_FETCH (with a plain add every event got number 2).
func TestFetchAddEncoding(t *testing.T) {
	ins := fetchAdd64(asm.R0, asm.R1, 0)
	var b bytes.Buffer
	if _, err := ins.Marshal(&b, binary.LittleEndian); err != nil {
		t.Fatal(err)
	}
	raw := b.Bytes()
	if raw[0] != 0xdb || raw[1] != 0x10 || binary.LittleEndian.Uint32(raw[4:]) != 0x01 {
		t.Fatalf("fetch-add marshals as % x, want db 10 00 00 01 00 00 00", raw)
	}
}

// TestProbeCost (opt-in: GOVERBS_PROBE_COST=1, in the guest) measures what
// the probes cost: with BPF run-time statistics on, it runs N busy-polling
// and N event-driven (-e) rc-pingpong iterations and logs, per program,
// how often it ran per iteration and its mean run time (docs/perf.md,
// "Probe overhead"). It checks that the rxe probes ran for every packet
// (4 per iteration: each side's send and ACK) and the cq-events handler
// only with -e.
func TestProbeCost(t *testing.T) {
	if os.Getenv("GOVERBS_PROBE_COST") != "1" {
		t.Skip("set GOVERBS_PROBE_COST=1")
	}
	rxetest.Pair(t)
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		t.Fatalf("BPF_STATS_RUN_TIME: %v", err)
	}
	defer stats.Close()
	p := attach(t, Options{PerPacket: true})
	const iters = 2000
	for i, mode := range [][]string{nil, {"-e"}} {
		type run struct {
			n  uint64
			rt time.Duration
		}
		read := func() map[string]run {
			m := map[string]run{}
			for _, pr := range p.progs {
				info, err := pr.Info()
				if err != nil {
					t.Fatal(err)
				}
				s, err := pr.Stats()
				if err != nil {
					t.Fatal(err)
				}
				m[info.Name] = run{s.RunCount, s.Runtime}
			}
			return m
		}
		before := read()
		t0 := time.Now()
		pingpongWith(t, iters, 18840+i, mode, nil)
		t.Logf("rc-pingpong %v -n %d: %v", mode, iters, time.Since(t0).Round(time.Millisecond))
		after := read()
		names := slices.Sorted(maps.Keys(after))
		for _, name := range names {
			n, rt := after[name].n-before[name].n, after[name].rt-before[name].rt
			per := time.Duration(0)
			if n > 0 {
				per = rt / time.Duration(n)
			}
			t.Logf("  %-16s %7d runs, %6.2f per iteration, %v per run", name, n, float64(n)/iters, per)
		}
		if n := after["gv_rxe_xmit"].n - before["gv_rxe_xmit"].n; p.Attached("rxe-packets") && n < 4*iters {
			t.Errorf("%v: rxe_xmit_packet probe ran %d times for %d iterations, want >= %d", mode, n, iters, 4*iters)
		}
		if n := after["gv_comp_event"].n - before["gv_comp_event"].n; p.Attached("cq-events") && (n == 0) != (mode == nil) {
			t.Errorf("%v: the completion event handler probe ran %d times", mode, n)
		}
	}
}

// TestAttachBadPIDs: a pid no process can have is refused before anything
// is loaded (as a uint32 key, -1 filtered out every process); no root or
// device needed.
func TestAttachBadPIDs(t *testing.T) {
	for _, pid := range []int{-1, 0, 1<<22 + 1} {
		p, err := Attach(Options{PIDs: []int{os.Getpid(), pid}})
		if err == nil {
			p.Close()
			t.Errorf("Attach with pid %d succeeded", pid)
			continue
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("pid %d outside", pid)) {
			t.Errorf("Attach with pid %d: %v; want it named", pid, err)
		}
	}
}

// TestAttachBadOptions: a probe name Names does not list in Options.Skip
// (a misspelling left the probe attached) and more pids than the filter
// map holds (the 1025th Put failed with E2BIG, the limit unnamed) are
// refused with an error naming them, before anything is loaded; no root
// or device needed.
func TestAttachBadOptions(t *testing.T) {
	many := make([]int, maxPIDs+1)
	for i := range many {
		many[i] = i + 1
	}
	dup := make([]int, 2*maxPIDs) // duplicates count once
	for i := range dup {
		dup[i] = i%maxPIDs + 1
	}
	for _, c := range []struct {
		name string
		opts Options
		want string // in the error; "" when Attach may succeed
	}{
		{"misspelt skip", Options{Skip: []string{"rxe-rnr", "rxe-rnrr"}}, `Options.Skip: no probe "rxe-rnrr"`},
		{"empty skip", Options{Skip: []string{""}}, `Options.Skip: no probe ""`},
		{"too many pids", Options{PIDs: many}, fmt.Sprintf("%d distinct pids, at most %d", maxPIDs+1, maxPIDs)},
		{"duplicate pids", Options{PIDs: dup}, ""},
	} {
		p, err := Attach(c.opts)
		if err == nil {
			p.Close()
		}
		switch {
		case c.want == "" && err != nil && strings.Contains(err.Error(), "Options."):
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: Attach: %v; want an error with %q", c.name, err, c.want)
		}
	}
}

// TestCommandOrder: Snapshot's Commands are in one order whatever order
// the map gave them: commands of one process that differ only in device
// (with fentry every fd is -1), in kind (write GET_CONTEXT and ioctl
// DEVICE/INVOKE_WRITE are both 0/0/0) or in the extended flag compared
// equal, so that rows swapped between two Snapshots.
func TestCommandOrder(t *testing.T) {
	want := []Command{
		{PID: 7, FD: -1, Device: "rxe0", Kind: "ioctl"},
		{PID: 7, FD: -1, Device: "rxe0", Kind: "write"},
		{PID: 7, FD: -1, Device: "rxe0", Kind: "write", Cmd: 0x12},
		{PID: 7, FD: -1, Device: "rxe0", Kind: "write", Cmd: 0x80000012},
		{PID: 7, FD: -1, Device: "rxe1", Kind: "ioctl"},
		{PID: 7, FD: -1, Device: "rxe1", Kind: "ioctl", Object: 3, Method: 1},
		{PID: 8, FD: 3, Device: "rxe0", Kind: "write", Cmd: postSendCmd},
	}
	for i := range want {
		for j := range want {
			if got := compareCommands(want[i], want[j]); (got < 0) != (i < j) || (got == 0) != (i == j) {
				t.Errorf("compare(%+v, %+v) = %d", want[i], want[j], got)
			}
		}
	}
	for seed := range 20 {
		got := slices.Clone(want)
		for i := range got { // a fixed shuffle per seed
			j := (i*7 + seed*13) % len(got)
			got[i], got[j] = got[j], got[i]
		}
		slices.SortFunc(got, compareCommands)
		if !slices.EqualFunc(got, want, func(a, b Command) bool {
			return a.Device == b.Device && a.Kind == b.Kind && a.Cmd == b.Cmd && a.PID == b.PID && a.Object == b.Object
		}) {
			t.Fatalf("seed %d: sorted %+v", seed, got)
		}
	}
}

// TestHWCountersBadInput: a device name with a path in it read another
// directory's files as counters (../../../tmp/x/ports/1/hw_counters);
// it, an empty name and a port below 1 give nil.
func TestHWCountersBadInput(t *testing.T) {
	dir := t.TempDir()
	hw := filepath.Join(dir, "ports", "1", "hw_counters")
	if err := os.MkdirAll(hw, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hw, "sent_pkts"), []byte("5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dev  string
		port int
	}{{"../../.." + dir, 1}, {"", 1}, {"..", 1}, {".", 1}, {"rxe0", 0}, {"rxe0", -1}} {
		if m := HWCounters(c.dev, c.port); m != nil {
			t.Errorf("HWCounters(%q, %d) = %v, want nil", c.dev, c.port, m)
		}
	}
}
