package main

import (
	"testing"

	"github.com/goverbs/goverbs/examples/internal/extest"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestMain doubles as the example program for TestTwoProcesses' server.
func TestMain(m *testing.M) { extest.Main(m, example.Run) }

// clientWant is what the client must print: the server's greeting from its
// device, and the echo of the whole body (the client also compares it
// byte for byte, and fails otherwise).
func clientWant(srvDev string) []string {
	return []string{
		`client: GET /hello: "hello from ` + srvDev + ` over bx\n"`,
		"client: POST /echo: sent 100000 bytes (sha256 ",
	}
}

// TestBoth runs both roles in one process, as `go run ./examples/http`
// does; the server shuts down after the client.
func TestBoth(t *testing.T) {
	da, db := rxetest.Pair(t)
	extest.Both(t, example.Run, da, db, append(clientWant(db), "server: listening on ", "server: stopped"))
}

// TestTwoProcesses runs the server as a second process (this test binary
// again) and the client here; then interrupts the server (SIGINT, as
// Ctrl-C), which must shut down and exit with status 0.
func TestTwoProcesses(t *testing.T) {
	da, db := rxetest.Pair(t)
	extest.TwoProcesses(t, example.Run, da, db, false, clientWant(db), []string{"server: stopped"})
}

// TestBadFlags: flag errors are errors, before any device is opened.
func TestBadFlags(t *testing.T) { extest.BadFlags(t, example.Run) }
