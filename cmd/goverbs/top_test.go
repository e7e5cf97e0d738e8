package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

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

func TestHistQuantile(t *testing.T) {
	h := make([]uint64, 40)
	h[10] = 100 // [1024, 2048) ns
	if q := histQuantile(h, 0.5); q < 1024 || q >= 2048 {
		t.Errorf("p50 %v", q)
	}
	if q := histQuantile(make([]uint64, 40), 0.5); q != 0 {
		t.Errorf("empty p50 %v", q)
	}
	if s := sparkline(h); !strings.HasPrefix(s, "2^10 ") {
		t.Errorf("sparkline %q", s)
	}
}

// TestTopOnceJSON samples while N rc-pingpong iterations run between the
// two devices: each device shows N doorbells, at least N commands, as many
// retransmits as rxe's completer_retry_err, and its QP N send and N receive
// completions.
func TestTopOnceJSON(t *testing.T) {
	cli, srv := rxetest.Pair(t)
	if os.Geteuid() != 0 {
		t.Skip("goverbs top needs root")
	}
	host, _ := serverTarget(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	top := exec.CommandContext(ctx, goverbsBin, "top", "--once", "--interval", "8s", "--json")
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
	done := make(chan struct{})
	var rs result
	go func() {
		defer close(done)
		rs = goverbs(t, 2*time.Minute, "rc-pingpong", "-d", srv, "-p", strconv.Itoa(port), "-n", strconv.Itoa(iters))
	}()
	waitListen(t, port, done)
	rc := goverbs(t, 2*time.Minute, "rc-pingpong", "-d", cli, "-p", strconv.Itoa(port), "-n", strconv.Itoa(iters), host)
	<-done
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
		}
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
			// need not be 0; they must be what rxe counts itself.
			if d.Doorbells != iters || d.Commands < iters || d.RetransmitsFrom != "probe" || d.Retransmits != d.HW["completer_retry_err"] {
				t.Errorf("%s: %+v, want %d doorbells, >= %d commands, retransmits from the probe = hw completer_retry_err", dev, d, iters, iters)
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
