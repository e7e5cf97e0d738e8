// Package buildcheck holds tests of the module as a whole: goverbs uses no
// cgo anywhere, and its command builds into a static binary.
package buildcheck

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// goTool finds the go command: on PATH, under $GOROOT, or /usr/local/go (a
// guest may run the tests with a PATH that lacks it).
func goTool(t *testing.T) string {
	t.Helper()
	if os.Getenv("GOVERBS_VM_GUEST") == "1" {
		// The guest sees the host's files over 9p, where the linker cannot
		// mmap its output; scripts/test runs these checks on the host.
		t.Skip("build checks run on the host, not in the rxe guest")
	}
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	for _, p := range []string{filepath.Join(os.Getenv("GOROOT"), "bin", "go"), "/usr/local/go/bin/go"} {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	t.Skip("no go tool on PATH, in $GOROOT/bin or /usr/local/go/bin")
	return ""
}

// moduleRoot is two levels up from this package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !strings.Contains(string(b), "module github.com/goverbs/goverbs") {
		t.Fatalf("module root not at %s: %v", root, err)
	}
	return root
}

func goCmd(t *testing.T, env []string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(goTool(t), args...)
	cmd.Dir = moduleRoot(t)
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

// TestNoCgo fails if any package of the module has cgo files. It lists with
// CGO_ENABLED=1 so that files behind the cgo build tag are seen too.
func TestNoCgo(t *testing.T) {
	cmd := goCmd(t, []string{"CGO_ENABLED=1"}, "list", "-e", "-f", "{{.ImportPath}} {{.CgoFiles}} {{.Error}}", "./...")
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go list: %v\n%s", err, msg)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, " ", 2)
		if len(f) != 2 {
			continue
		}
		n++
		if !strings.HasPrefix(f[1], "[] ") {
			t.Errorf("package %s uses cgo: CgoFiles %s", f[0], f[1])
		}
	}
	if n == 0 {
		t.Fatalf("go list printed no packages:\n%s", out)
	}
	t.Logf("%d packages, none with cgo files", n)
}

// TestStaticBinary builds cmd/goverbs without cgo and checks that the result
// is statically linked: no program interpreter and no shared libraries.
func TestStaticBinary(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("ELF check is for linux")
	}
	root := moduleRoot(t)
	if _, err := os.Stat(filepath.Join(root, "cmd/goverbs")); err != nil {
		t.Skipf("./cmd/goverbs does not exist yet (%v): nothing to build", err)
	}
	if testing.Short() {
		t.Skip("-short: skipping the build of cmd/goverbs")
	}
	bin := filepath.Join(t.TempDir(), "goverbs")
	cmd := goCmd(t, []string{"CGO_ENABLED=0"}, "build", "-o", bin, "./cmd/goverbs")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build ./cmd/goverbs: %v\n%s", err, out)
	}
	checkStatic(t, bin)
}

func checkStatic(t *testing.T, bin string) {
	t.Helper()
	problems, err := dynamicParts(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s is not static: %s", bin, p)
	}
}

// dynamicParts lists what makes an ELF file dynamically linked.
func dynamicParts(bin string) ([]string, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var problems []string
	for _, p := range f.Progs {
		switch p.Type {
		case elf.PT_INTERP:
			problems = append(problems, "PT_INTERP program header (needs a dynamic loader)")
		case elf.PT_DYNAMIC:
			problems = append(problems, "PT_DYNAMIC program header")
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return nil, fmt.Errorf("%s: reading DT_NEEDED: %w", bin, err)
	}
	for _, l := range libs {
		problems = append(problems, "DT_NEEDED "+l)
	}
	return problems, nil
}

// TestDynamicPartsPassesStatic builds a command of the module that exists
// today (the generator) without cgo: the check must find nothing in it.
func TestDynamicPartsPassesStatic(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping a build")
	}
	bin := filepath.Join(t.TempDir(), "mkztypes")
	cmd := goCmd(t, []string{"CGO_ENABLED=0"}, "build", "-o", bin, "./ioctl/internal/mkztypes")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	checkStatic(t, bin)
}

// TestDynamicPartsDetects makes sure the check is not blind: a system binary
// linked against libc must show PT_INTERP and DT_NEEDED.
func TestDynamicPartsDetects(t *testing.T) {
	for _, p := range []string{"/bin/sh", "/usr/bin/env", "/bin/ls"} {
		problems, err := dynamicParts(p)
		if err != nil || len(problems) == 0 {
			continue
		}
		var interp, needed bool
		for _, pr := range problems {
			interp = interp || strings.HasPrefix(pr, "PT_INTERP")
			needed = needed || strings.HasPrefix(pr, "DT_NEEDED")
		}
		if !interp || !needed {
			t.Errorf("%s: found %v, want both PT_INTERP and DT_NEEDED", p, problems)
		}
		return
	}
	t.Skip("no dynamically linked system binary to try the check on")
}
