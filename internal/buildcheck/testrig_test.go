package buildcheck

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// testTools are the module's test-only commands: scripts/chaos builds
// internal/cmd/chaosload, the load it drives while it injects faults.
const testTools = "github.com/goverbs/goverbs/internal/cmd/"

// TestShippedDepsLackTestRig: the packages cmd/goverbs links (go list
// -deps) hold none of the test tools, and none of cmd/goverbs's own files
// is chaos load code (it was the hidden "goverbs chaos-load" command).
func TestShippedDepsLackTestRig(t *testing.T) {
	out, err := goCmd(t, []string{"CGO_ENABLED=0"}, "list", "-deps", "-f", "{{.ImportPath}}", "./cmd/goverbs").Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/goverbs: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 || deps[len(deps)-1] != "github.com/goverbs/goverbs/cmd/goverbs" {
		t.Fatalf("go list -deps ./cmd/goverbs printed %d packages, not ending with cmd/goverbs", len(deps))
	}
	for _, d := range deps {
		if strings.HasPrefix(d, testTools) {
			t.Errorf("cmd/goverbs depends on the test tool %s", d)
		}
	}
	out, err = goCmd(t, nil, "list", "-f", "{{.Name}} {{.GoFiles}}", "./cmd/goverbs", "./internal/cmd/chaosload").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[1], "main ") || !strings.Contains(lines[1], "chaosload.go") {
		t.Fatalf("go list: %q, want cmd/goverbs and the chaosload command", lines)
	}
	if strings.Contains(lines[0], "chaos") {
		t.Errorf("cmd/goverbs has chaos load files: %s", lines[0])
	}
	t.Logf("cmd/goverbs: %d packages, none under %s", len(deps), testTools)
}

// TestShippedBinaryLacksTestRig builds cmd/goverbs without cgo, as it
// ships: "chaos-load" is an unknown command and no symbol of the binary is
// chaos load code.
func TestShippedBinaryLacksTestRig(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the build of cmd/goverbs")
	}
	bin := filepath.Join(t.TempDir(), "goverbs")
	if out, err := goCmd(t, []string{"CGO_ENABLED=0"}, "build", "-o", bin, "./cmd/goverbs").CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build ./cmd/goverbs: %v\n%s", err, out)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "chaos-load", "serve")
	cmd.Stderr = &stderr
	if err := cmd.Run(); cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 1 ||
		!strings.Contains(stderr.String(), `unknown command "chaos-load"`) {
		t.Errorf("goverbs chaos-load serve: %v, stderr %q; want exit 1, unknown command", err, stderr.String())
	}
	syms, err := goCmd(t, nil, "tool", "nm", bin).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	n := 0
	for _, l := range strings.Split(string(syms), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && strings.HasPrefix(f[len(f)-1], "main.") {
			n++
			if strings.Contains(strings.ToLower(f[len(f)-1]), "chaos") {
				t.Errorf("goverbs links %s", f[len(f)-1])
			}
		}
	}
	if n == 0 {
		t.Fatalf("go tool nm listed no main.* symbols in %s", bin)
	}
}

// TestShippedDepsLackGRPC: goverbs as users build it links no gRPC; the
// grpc_* benchmarks (cmd/goverbs/perf_grpc.go) come in with -tags
// goverbs_grpc only (scripts/vm and scripts/bench-bx --grpc build so).
// GOFLAGS is cleared: what is checked is the plain build.
func TestShippedDepsLackGRPC(t *testing.T) {
	count := func(tags ...string) (all, grpc int) {
		args := append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, tags...)
		out, err := goCmd(t, []string{"CGO_ENABLED=0", "GOFLAGS="}, append(args, "./cmd/goverbs")...).Output()
		if err != nil {
			t.Fatalf("go list -deps %v ./cmd/goverbs: %v", tags, err)
		}
		for _, d := range strings.Fields(string(out)) {
			if strings.Contains(d, ".") {
				all++
			}
			if strings.HasPrefix(d, "google.golang.org/grpc") {
				grpc++
			}
		}
		return all, grpc
	}
	all, grpc := count()
	if grpc != 0 {
		t.Errorf("go build ./cmd/goverbs links %d gRPC packages", grpc)
	}
	allTag, grpcTag := count("-tags", "goverbs_grpc")
	if grpcTag == 0 {
		t.Errorf("with -tags goverbs_grpc, cmd/goverbs links no gRPC: the tag no longer selects perf_grpc.go")
	}
	t.Logf("cmd/goverbs links %d non-standard packages, %d with -tags goverbs_grpc (%d of them gRPC)", all, allTag, grpcTag)
}
