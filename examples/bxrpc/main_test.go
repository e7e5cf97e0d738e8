package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/goverbs/goverbs/examples/internal/extest"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestMain doubles as the example program for TestTwoProcesses' server.
func TestMain(m *testing.M) { extest.Main(m, example.Run) }

// clientWant is what the client must print: every call's response, which
// only the server's handler upper-cases, and the handler's error.
func clientWant() []string {
	var want []string
	for _, r := range requests {
		want = append(want, fmt.Sprintf("client: call %q -> %q", r, strings.ToUpper(r)))
	}
	return append(want, `client: call "" -> remote error "empty request"`)
}

// TestBoth runs both roles in one process, as `go run ./examples/bxrpc`
// does.
func TestBoth(t *testing.T) {
	da, db := rxetest.Pair(t)
	extest.Both(t, example.Run, da, db, append(clientWant(), "server: listening on ", "server: stopping"))
}

// TestTwoProcesses runs the server as a second process (this test binary
// again) and the client here; then interrupts the server (SIGINT, as
// Ctrl-C), which must close its endpoint and exit with status 0.
func TestTwoProcesses(t *testing.T) {
	da, db := rxetest.Pair(t)
	extest.TwoProcesses(t, example.Run, da, db, false, clientWant(), []string{"server: stopping"})
}

// TestBadFlags: flag errors are errors, before any device is opened.
func TestBadFlags(t *testing.T) { extest.BadFlags(t, example.Run) }
