package rxetest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
)

// RunChecked runs m's tests and returns the code for os.Exit. When they
// pass on a machine with RDMA devices, it fails the run if they left a
// kernel object behind (the per-device pd, cq, qp, mr, ctx and cm_id
// counts of `rdma resource show` differ from those before) or a file
// descriptor open. GOVERBS_DEBUG_FDS=1 lists the descriptors.
func RunChecked(m *testing.M) int {
	before, haveRdma := Resources()
	fdsBefore := OpenFDs()
	code := m.Run()
	if code == 0 && haveRdma {
		if after, _ := Resources(); after != before {
			fmt.Fprintf(os.Stderr, "kernel objects leaked:\nbefore: %s\nafter:  %s\n", before, after)
			code = 1
		}
		if n := OpenFDs(); n > fdsBefore {
			fmt.Fprintf(os.Stderr, "file descriptors leaked: %d before, %d after\n", fdsBefore, n)
			code = 1
		}
	}
	return code
}

// Resources returns what `rdma resource show` prints (a line per device
// with its pd, cq, qp, mr, ctx and cm_id counts, less the device's index),
// or false when there is
// no rdma tool or no device.
func Resources() (string, bool) {
	out, err := exec.Command("rdma", "resource", "show").Output()
	if err != nil || len(out) == 0 {
		return "", false
	}
	// Without the device index ("1: rxe1: pd 1 ..."): a device deleted
	// and added back (RemoveDevice) has a new one.
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for i, l := range lines {
		if k := strings.Index(l, ": "); k > 0 && strings.Trim(l[:k], "0123456789") == "" {
			lines[i] = l[k+2:]
		}
	}
	return strings.Join(lines, "\n"), true
}

// OpenFDs returns how many file descriptors the process has open.
func OpenFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	if os.Getenv("GOVERBS_DEBUG_FDS") != "" {
		for _, e := range ents {
			l, _ := os.Readlink("/proc/self/fd/" + e.Name())
			fmt.Fprintln(os.Stderr, e.Name(), l)
		}
	}
	return len(ents)
}

// cmIDLines returns the lines of `rdma resource show cm_id`.
func cmIDLines() ([]string, error) {
	out, err := exec.Command("rdma", "resource", "show", "cm_id").Output()
	return strings.Split(string(out), "\n"), err
}

// CMIDTable is what `rdma resource show cm_id` prints (its errors too),
// for a failure's message.
func CMIDTable() string {
	out, _ := exec.Command("rdma", "resource", "show", "cm_id").CombinedOutput()
	return string(out)
}

// CMIDs counts the kernel's rdma_cm IDs (`rdma resource show cm_id`), or
// returns -1 when the tool cannot tell.
func CMIDs() int {
	lines, err := cmIDLines()
	if err != nil {
		return -1
	}
	n := 0
	for _, l := range lines {
		if strings.Contains(l, "cm-idn") || strings.HasPrefix(strings.TrimSpace(l), "link ") {
			n++
		}
	}
	return n
}

// CheckCMIDs makes the test fail unless the cm_id count is back at its
// start count when the test ends (after every Cleanup registered later,
// the Close of what it made among them), and returns that count. Where
// the count cannot be read it returns -1 and checks nothing, or fails
// under GOVERBS_RXE=required.
func CheckCMIDs(t testing.TB) int {
	t.Helper()
	before := CMIDs()
	if before < 0 {
		if Required() {
			t.Fatal("cannot count cm_ids: `rdma resource show cm_id` failed")
		}
		return -1
	}
	t.Logf("%d cm_ids at the start", before)
	t.Cleanup(func() {
		// DESTROY_ID is synchronous; poll only to print what is left.
		deadline := time.Now().Add(hang.Scale(5 * time.Second))
		for {
			after := CMIDs()
			if after == before {
				t.Logf("%d cm_ids at the end", after)
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("cm_id count %d at the start, %d at the end:\n%s", before, after, CMIDTable())
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	return before
}

// WaitCMListen waits until `rdma resource show cm_id` shows a listener
// whose line matches, and reports true; or false as soon as done is
// closed (the server exited). After 30 s (scaled by hang.Scale) it fails
// the test, naming the listener it waited for as what.
func WaitCMListen(t testing.TB, what string, matches func(line string) bool, done <-chan struct{}) bool {
	t.Helper()
	wait := hang.Scale(30 * time.Second)
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		lines, _ := cmIDLines()
		for _, l := range lines {
			if strings.Contains(l, "LISTEN") && matches(l) {
				return true
			}
		}
		select {
		case <-done:
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("no rdma_cm listener on %s after %v", what, wait)
	return false
}
