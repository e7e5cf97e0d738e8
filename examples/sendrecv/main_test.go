package main

import (
	"fmt"
	"testing"

	"github.com/goverbs/goverbs/examples/internal/extest"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestMain doubles as the example program for TestTwoProcesses' server.
func TestMain(m *testing.M) { extest.Main(m, example.Run) }

// clientWant is what the client must print: every message's echo.
func clientWant() []string {
	var want []string
	for _, m := range messages {
		want = append(want, fmt.Sprintf("client: sent %q, echo %q", m, m))
	}
	return want
}

// serverWant is what the server must print: every message.
func serverWant() []string {
	var want []string
	for _, m := range messages {
		want = append(want, fmt.Sprintf("server: received %q", m))
	}
	return want
}

// bothWant is what -role both must print, the client on device da.
func bothWant(da string) []string {
	want := []string{"server: listening on ", "client: " + da + " connected to QPN "}
	return append(append(want, serverWant()...), clientWant()...)
}

// TestBoth runs both roles in one process, as `go run ./examples/sendrecv`
// does: the server prints every message and the client every echo.
func TestBoth(t *testing.T) {
	da, db := rxetest.Pair(t)
	extest.Both(t, example.Run, da, db, bothWant(da))
}

// TestTwoProcesses runs the server as a second process (this test binary
// again) and the client here: the server exits after "bye" with status 0,
// having printed every message, and the client saw every echo.
func TestTwoProcesses(t *testing.T) {
	da, db := rxetest.Pair(t)
	extest.TwoProcesses(t, example.Run, da, db, true, clientWant(), serverWant())
}

// TestBadFlags: flag errors are errors, before any device is opened.
func TestBadFlags(t *testing.T) { extest.BadFlags(t, example.Run) }
