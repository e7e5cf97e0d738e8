package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

func TestTopBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"top", "--json"},
		{"top", "--interval", "0s", "--once"},
		{"top", "--sort", "bogus"},
		{"top", "--pid", "x"},
		{"top", "extra"},
	} {
		r := goverbs(t, time.Minute, args...)
		if r.code != 1 {
			t.Errorf("%q: exit %d, want 1 (%s)", args, r.code, r.stderr)
		}
	}
}

// TestHistDelta: the interval's histogram is the current one minus the
// previous one, bucket by bucket; buckets the previous one lacks count whole.
func TestHistDelta(t *testing.T) {
	got := histDelta([]uint64{5, 3, 7}, []uint64{2, 3})
	if want := []uint64{3, 0, 7}; !slices.Equal(got, want) {
		t.Errorf("histDelta = %v, want %v", got, want)
	}
	if got := histDelta([]uint64{1}, nil); !slices.Equal(got, []uint64{1}) {
		t.Errorf("histDelta with no previous sample = %v", got)
	}
}

// (hist.Log2Quantile, which the report uses, is tested in internal/hist.)
func TestSparkline(t *testing.T) {
	h := make([]uint64, 40)
	h[10] = 100 // [1024, 2048) ns
	if s := sparkline(h); !strings.HasPrefix(s, "2^10 ") {
		t.Errorf("sparkline %q", s)
	}
}

// TestTopOnceJSON samples while N event-driven rc-pingpong iterations (-e)
// run between the two devices (every probe: --per-packet): each device
// shows N doorbells, at least N commands, as many retransmits as rxe's
// completer_retry_err, its QP N send and N receive completions, and as many
// completion events read as raised, with their latency in cq_events.
func TestTopOnceJSON(t *testing.T) {
	cli, srv := rxetest.Pair(t)
	if os.Geteuid() != 0 {
		t.Skip("goverbs top needs root")
	}
	host, _ := serverTarget(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(3*time.Minute)) // a hang bound: top --once runs 8 s
	defer cancel()
	// The sample must cover the whole pingpong (the test counts its
	// doorbells exactly): 8 s here, longer on a slower machine.
	interval := hang.Scale(8 * time.Second).Round(time.Second)
	top := exec.CommandContext(ctx, goverbsBin, "top", "--once", "--interval", interval.String(), "--json", "--per-packet")
	top.Env = append(os.Environ(), goverbsEnv...)
	var out bytes.Buffer
	top.Stdout = &out
	errPipe, err := top.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := top.Start(); err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	started := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(errPipe)
		once := false
		for sc.Scan() {
			stderr.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "sampling for") && !once {
				once = true
				close(started)
			}
		}
		if !once {
			close(started)
		}
	}()
	<-started
	const iters = 300
	port := 18760
	rc, rs := serverClient(t, 2*time.Minute, port,
		[]string{"rc-pingpong", "-e", "-d", srv, "-p", strconv.Itoa(port), "-n", strconv.Itoa(iters)},
		[]string{"rc-pingpong", "-e", "-d", cli, "-p", strconv.Itoa(port), "-n", strconv.Itoa(iters), host})
	if rs.code != 0 || rc.code != 0 {
		t.Fatalf("pingpong: server %d %s client %d %s", rs.code, rs.stderr, rc.code, rc.stderr)
	}
	if err := top.Wait(); err != nil {
		t.Fatalf("top: %v: %s", err, stderr.String())
	}
	var r struct {
		Devices []struct {
			Name                             string
			Doorbells, Commands, Retransmits uint64
			RetransmitsFrom                  string            `json:"retransmits_from"`
			HW                               map[string]uint64 `json:"hw_counters"`
			CQEventsRaised                   uint64            `json:"cq_events_raised"`
			CQEventsRead                     uint64            `json:"cq_events_read"`
		}
		CQEvents []struct {
			Device           string
			Count, Unmatched uint64
			P50US            float64  `json:"p50_us"`
			Hist             []uint64 `json:"hist_log2_ns"`
		} `json:"cq_events"`
		QPs []struct {
			Device          string
			SendCompletions uint64 `json:"send_completions"`
			RecvCompletions uint64 `json:"recv_completions"`
		}
		Commands []struct {
			Name  string
			Count uint64
		}
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	for _, dev := range []string{cli, srv} {
		found := false
		for _, d := range r.Devices {
			if d.Name != dev {
				continue
			}
			found = true
			t.Logf("%+v", d)
			// rxe's retransmit timer can fire spuriously, so retransmits
			// need not be 0; they must be what rxe counts itself, less at
			// most one: rxe counts completer_retry_err when its completer
			// decides to retry, the probe the requester's retry pass that
			// follows, and a retry decided as the pingpong closes its QP
			// has no pass (seen once: hw 1, probe 0, at the end of a run).
			if hw := d.HW["completer_retry_err"]; d.Doorbells != iters || d.Commands < iters || d.RetransmitsFrom != "probe" || d.Retransmits > hw || hw-d.Retransmits > 1 {
				t.Errorf("%s: %+v, want %d doorbells, >= %d commands, retransmits from the probe = hw completer_retry_err (or one less)", dev, d, iters, iters)
			}
			// -e: up to one event per completion, two completions per
			// iteration (the send and the receive share the CQ; none when
			// a completion was already there after arming), each raised
			// one read. (Run R raised 301 for 300 iterations.)
			if d.CQEventsRaised == 0 || d.CQEventsRaised > 2*iters || d.CQEventsRead != d.CQEventsRaised {
				t.Errorf("%s: %d completion events raised, %d read: want 1..%d, all read", dev, d.CQEventsRaised, d.CQEventsRead, 2*iters)
			}
			var n uint64
			for _, e := range r.CQEvents {
				if e.Device != dev {
					continue
				}
				t.Logf("%+v", e)
				n += e.Count
				var h uint64
				for _, v := range e.Hist {
					h += v
				}
				if h != e.Count || e.Unmatched != 0 || e.P50US <= 0 {
					t.Errorf("%s: cq_events %+v: want the histogram to hold the count, none unmatched, p50 > 0", dev, e)
				}
			}
			if n != d.CQEventsRead {
				t.Errorf("%s: cq_events count %d, device cq_events_read %d", dev, n, d.CQEventsRead)
			}
		}
		if !found {
			t.Errorf("no device %s in %s", dev, out.String())
		}
		var send, recv uint64
		for _, q := range r.QPs {
			if q.Device == dev {
				send += q.SendCompletions
				recv += q.RecvCompletions
			}
		}
		if send != iters || recv != iters {
			t.Errorf("%s: %d send, %d recv completions, want %d", dev, send, recv, iters)
		}
	}
}

// TestTopTmux runs the live `goverbs top` in a detached tmux session (a
// real terminal: raw-mode keys, ANSI redraws) while event-driven
// rc-pingpong runs between the two devices, and reads the screen with
// `tmux capture-pane -p` every second: the headers and both device rows
// are there, the devices' doorbell and completion event rates are non-zero
// while the workload runs, the screen changes from one refresh to the
// next, and the q key quits. GOVERBS_TOP_CAPTURE=FILE saves a screen taken
// while the workload ran (docs/observability.md shows one).
func TestTopTmux(t *testing.T) {
	cli, srv := rxetest.Pair(t)
	if os.Geteuid() != 0 {
		t.Skip("goverbs top needs root")
	}
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Skip("no tmux")
	}
	// The server's socket: not on the guest's 9p /tmp.
	dir := t.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		dir = "/dev/shm"
	}
	sock := filepath.Join(dir, fmt.Sprintf("goverbs-top-test-%d.sock", os.Getpid()))
	tm := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(30*time.Second))
		defer cancel()
		b, err := exec.CommandContext(ctx, tmux, append([]string{"-S", sock}, args...)...).CombinedOutput()
		return string(b), err
	}
	var cmdline []string
	for _, a := range append(append([]string{"env"}, goverbsEnv...), goverbsBin, "top", "--interval", "1s", "-n", "6") {
		cmdline = append(cmdline, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
	}
	if out, err := tm("new-session", "-d", "-s", "gvtop", "-x", "170", "-y", "50", strings.Join(cmdline, " ")); err != nil {
		t.Fatalf("tmux new-session: %v: %s", err, out)
	}
	t.Cleanup(func() {
		tm("kill-server")
		os.Remove(sock)
	})
	capture := func() string {
		out, err := tm("capture-pane", "-p", "-t", "gvtop")
		if err != nil {
			t.Fatalf("tmux capture-pane: %v: %s", err, out)
		}
		return out
	}
	limit := hang.Scale(60 * time.Second)
	deadline := time.Now().Add(limit)
	for !strings.Contains(capture(), "goverbs top - ") {
		if time.Now().After(deadline) {
			t.Fatalf("no goverbs top screen after %v (%s): %q", limit, hang.How(), capture())
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The workload: event-driven rc-pingpong until we stop it.
	host, _ := serverTarget(t, srv)
	port := 18761
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var exited []chan struct{}
	pp := func(args ...string) {
		cmd := exec.CommandContext(ctx, goverbsBin, append([]string{"rc-pingpong", "-e", "-p", strconv.Itoa(port), "-n", "1000000"}, args...)...)
		cmd.Env = append(os.Environ(), goverbsEnv...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		exited = append(exited, done)
	}
	pp("-d", srv)
	waitListen(t, port, exited[0])
	pp("-d", cli, host)

	type devRow struct{ doorbells, cqev float64 }
	var screens []string
	var rows []map[string]devRow
	// At least 8 screens, and on until both rows showed traffic and the
	// screen changed, or 60 s (scaled: a slow machine takes longer to get
	// the pingpong going) passed.
	busyRow := func(m map[string]devRow, dev string) bool { return m[dev].doorbells > 0 && m[dev].cqev > 0 }
	seen := func() bool {
		b := map[string]bool{}
		changed := false
		for i, m := range rows {
			b[cli] = b[cli] || busyRow(m, cli)
			b[srv] = b[srv] || busyRow(m, srv)
			changed = changed || i > 0 && screens[i] != screens[i-1]
		}
		return b[cli] && b[srv] && changed
	}
	for end := time.Now().Add(hang.Scale(60 * time.Second)); len(rows) < 8 || !seen() && time.Now().Before(end); {
		time.Sleep(1100 * time.Millisecond)
		s := capture()
		screens = append(screens, s)
		m := map[string]devRow{}
		for _, line := range strings.Split(s, "\n") {
			f := strings.Fields(line)
			// DEVICE DOORBELL/s CMDS/s TX pkt/s RX pkt/s CQEV/s RETRANS ...
			if len(f) == 11 && (f[0] == cli || f[0] == srv) {
				db, err1 := strconv.ParseFloat(f[1], 64)
				ev, err2 := strconv.ParseFloat(f[5], 64)
				if err1 == nil && err2 == nil {
					m[f[0]] = devRow{db, ev}
				}
			}
		}
		rows = append(rows, m)
	}
	cancel()
	for _, done := range exited {
		<-done
	}
	last := screens[len(screens)-1]
	t.Logf("last screen:\n%s", last)
	for _, want := range []string{"goverbs top - ", "keys: s sort, q quit", "DEVICE", "DOORBELL/s", "CQEV/s", "QPN", "COMMAND", "write POST_SEND", "CQ EVENTS (raise -> read)", "completion channel read", "need --per-packet"} {
		if !strings.Contains(last, want) {
			t.Errorf("screen lacks %q", want)
		}
	}
	busy := map[string]bool{}
	changed := false
	for i, m := range rows {
		for _, dev := range []string{cli, srv} {
			if _, ok := m[dev]; !ok {
				t.Errorf("screen %d has no %s row:\n%s", i, dev, screens[i])
				continue
			}
			if busyRow(m, dev) {
				busy[dev] = true
			}
		}
		if i > 0 && screens[i] != screens[i-1] {
			changed = true
		}
	}
	for _, dev := range []string{cli, srv} {
		if !busy[dev] {
			t.Errorf("%s: no screen shows doorbells and completion events per second while rc-pingpong -e ran: %v", dev, rows)
		}
	}
	if !changed {
		t.Errorf("the screen never changed")
	}
	if f := os.Getenv("GOVERBS_TOP_CAPTURE"); f != "" {
		// The busiest screen: most completion events per second.
		best, bestRate := last, -1.0
		for i, m := range rows {
			if r := m[cli].cqev + m[srv].cqev; r > bestRate {
				best, bestRate = screens[i], r
			}
		}
		if err := os.WriteFile(f, []byte(best), 0o644); err != nil {
			t.Error(err)
		}
	}
	// q quits: the session ends with its only window.
	if out, err := tm("send-keys", "-t", "gvtop", "q"); err != nil {
		t.Fatalf("tmux send-keys: %v: %s", err, out)
	}
	for deadline := time.Now().Add(hang.Scale(20 * time.Second)); ; time.Sleep(100 * time.Millisecond) {
		if _, err := tm("has-session", "-t", "gvtop"); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("goverbs top still running %v after q (%s):\n%s", hang.Scale(20*time.Second), hang.How(), capture())
		}
	}
}

// TestTopDroppedLine: when probe maps filled up, the view says so on a
// line of its own, with the total and the count per map; with nothing
// dropped there is no such line.
func TestTopDroppedLine(t *testing.T) {
	o := topOptions{sort: "rate", rows: 15}
	var buf bytes.Buffer
	r := &topReport{Dropped: map[string]uint64{"gv_qps": 12, "gv_cmds": 3, "gv_fds": 0}}
	r.render(&buf, o, false)
	if want := "probe maps full, 15 updates dropped: gv_cmds 3, gv_qps 12 (counts are low)\n"; !strings.Contains(buf.String(), want) {
		t.Errorf("view with drops:\n%s\nwant a line %q", buf.String(), want)
	}
	for _, d := range []map[string]uint64{nil, {"gv_qps": 0}} {
		buf.Reset()
		(&topReport{Dropped: d}).render(&buf, o, false)
		if strings.Contains(buf.String(), "dropped") {
			t.Errorf("view with drops %v:\n%s", d, buf.String())
		}
	}
}
