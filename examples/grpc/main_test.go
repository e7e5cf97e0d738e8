package main

import (
	"testing"

	"github.com/goverbs/goverbs/examples/internal/extest"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestMain doubles as the example program for TestTwoProcesses' server.
func TestMain(m *testing.M) { extest.Main(m, example.Run) }

// clientWant is what the client must print: the watch reached SERVING
// (which the server sets only after its warm-up), Check agrees, and an
// unknown service is NotFound.
var clientWant = []string{
	"client: watch example.Backend: SERVING",
	"client: check example.Backend: SERVING",
	"client: check example.Unknown: NotFound",
}

// TestBoth runs both roles in one process, as `go run ./examples/grpc`
// does; the server stops gracefully after the client.
func TestBoth(t *testing.T) {
	da, db := rxetest.Pair(t)
	extest.Both(t, example.Run, da, db, append(clientWant, "server: example.Backend is SERVING", "server: stopped"))
}

// TestTwoProcesses runs the server as a second process (this test binary
// again) and the client here; then interrupts the server (SIGINT, as
// Ctrl-C), which must stop gracefully and exit with status 0.
func TestTwoProcesses(t *testing.T) {
	da, db := rxetest.Pair(t)
	extest.TwoProcesses(t, example.Run, da, db, false, clientWant, []string{"server: example.Backend is SERVING", "server: stopped"})
}

// TestBadFlags: flag errors are errors, before any device is opened.
func TestBadFlags(t *testing.T) { extest.BadFlags(t, example.Run) }
