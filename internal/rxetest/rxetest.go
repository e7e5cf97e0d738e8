// Package rxetest finds real RDMA devices for tests and skips, or fails,
// when there are none.
//
// With GOVERBS_RXE=required (scripts/test sets it inside the guest) a test
// that would skip for want of a device fails instead, so a broken harness
// cannot pass silently.
package rxetest

import (
	"io"
	"os"
	"strings"
	"testing"

	"github.com/goverbs/goverbs/uverbs"
)

// Required reports whether device tests must not skip.
func Required() bool { return os.Getenv("GOVERBS_RXE") == "required" }

func skip(t testing.TB, why string) {
	t.Helper()
	if Required() {
		t.Fatalf("GOVERBS_RXE=required but %s", why)
	}
	t.Skipf("no RDMA device: %s (run through scripts/vm, or set GOVERBS_RXE=required to make this a failure)", why)
}

// Active returns the names of the devices with an ACTIVE port 1.
func Active(t testing.TB) []string {
	t.Helper()
	devs, err := uverbs.ListWithoutGIDs()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range devs {
		if p := d.Port(1); p != nil && p.State == "ACTIVE" {
			names = append(names, d.Name)
		}
	}
	return names
}

// Pair returns two ACTIVE devices (rxe0 and rxe1 in the guest), or skips.
func Pair(t testing.TB) (string, string) {
	t.Helper()
	names := Active(t)
	if len(names) < 2 {
		skip(t, "need two ACTIVE RDMA devices, have "+itoa(len(names)))
	}
	return names[0], names[1]
}

// One returns an ACTIVE device, or skips.
func One(t testing.TB) string {
	t.Helper()
	names := Active(t)
	if len(names) == 0 {
		skip(t, "need an ACTIVE RDMA device")
	}
	return names[0]
}

// Open opens a device and closes it when the test ends.
func Open(t testing.TB, name string) *uverbs.Context {
	t.Helper()
	c, err := uverbs.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close %s: %v", name, err)
		}
	})
	return c
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return "many"
}

// Example runs a godoc Example function that needs the guest's devices
// (rxe0 and rxe1, the names the examples use) and returns what it printed.
// Such examples have no "Output:" comment, since go test would run them on
// machines without devices too; a test calls them through Example instead
// and checks their output. It skips without the devices.
func Example(t *testing.T, f func()) string {
	t.Helper()
	names := Active(t)
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
	}
	if !have["rxe0"] || !have["rxe1"] {
		skip(t, "the examples use rxe0 and rxe1, have "+strings.Join(names, ", "))
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(r)
		r.Close()
		out <- string(b)
	}()
	stdout := os.Stdout
	os.Stdout = w
	defer func() { os.Stdout = stdout }()
	f()
	os.Stdout = stdout
	w.Close()
	return <-out
}

// ExampleCase is an Example function and a string its output must hold
// ("" for an example that must print nothing).
type ExampleCase struct {
	Name string
	F    func()
	Want string
}

// RunExamples runs each case through Example and checks its output.
func RunExamples(t *testing.T, cases []ExampleCase) {
	t.Helper()
	for _, c := range cases {
		out := Example(t, c.F)
		if c.Want == "" && out != "" || !strings.Contains(out, c.Want) {
			t.Errorf("%s printed %q, want %q in it", c.Name, out, c.Want)
		}
		t.Logf("%s: %s", c.Name, out)
	}
}
