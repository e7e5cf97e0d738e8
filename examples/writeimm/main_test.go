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

// serverWant is what the server must print: each record with its offset
// as the immediate, then the whole buffer, which only the client's writes
// could have filled.
func serverWant() []string {
	var want []string
	off := 0
	for _, r := range records {
		want = append(want, fmt.Sprintf("server: write of %d bytes, immediate %d: %q", len(r), off, r))
		off += len(r)
	}
	return append(want, fmt.Sprintf("server: empty write, immediate %d: done; buffer: %q", off, strings.Join(records, "")))
}

// clientWant is what the client must print: every record and its offset.
func clientWant() []string {
	var want []string
	off := 0
	for _, r := range records {
		want = append(want, fmt.Sprintf("client: wrote %q at offset %d", r, off))
		off += len(r)
	}
	return want
}

// TestBoth runs both roles in one process, as `go run ./examples/writeimm`
// does.
func TestBoth(t *testing.T) {
	da, db := rxetest.Pair(t)
	extest.Both(t, example.Run, da, db, append(serverWant(), "client: "+da+" connected to QPN ", "client: done after "))
}

// TestTwoProcesses runs the server as a second process (this test binary
// again) and the client here: the server exits with status 0 after the
// client's last write, having printed every record and its buffer.
func TestTwoProcesses(t *testing.T) {
	da, db := rxetest.Pair(t)
	extest.TwoProcesses(t, example.Run, da, db, true, clientWant(), serverWant())
}

// TestBadFlags: flag errors are errors, before any device is opened.
func TestBadFlags(t *testing.T) { extest.BadFlags(t, example.Run) }
