package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/examples/internal/extest"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestMain doubles as the example program for TestTwoProcesses' server.
func TestMain(m *testing.M) { extest.Main(m, run) }

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

// TestBoth runs both roles in one process, as `go run ./examples/writeimm`
// does.
func TestBoth(t *testing.T) {
	da, db := rxetest.Pair(t)
	ctx, wd := hang.For(t, "", time.Minute) // a hang bound (no progress), not a speed bound
	var out bytes.Buffer
	err := run(ctx, []string{"-role", "both", "-d", db + "," + da, "-addr", extest.ListenIP(db) + ":0"}, wd.Writer(&out))
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(hang.Cause(ctx, err))
	}
	extest.CheckLines(t, out.String(), append(serverWant(), "client: "+da+" connected to QPN ", "client: done after "))
}

// TestTwoProcesses runs the server as a second process (this test binary
// again) and the client here: the server exits with status 0 after the
// client's last write, having printed every record and its buffer.
func TestTwoProcesses(t *testing.T) {
	da, db := rxetest.Pair(t)
	ctx, wd := hang.For(t, "", time.Minute) // a hang bound (no progress), not a speed bound
	srv := extest.Start(t, wd, "-role", "server", "-d", db, "-addr", extest.ListenIP(db)+":0")
	addr, err := srv.Addr(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = run(ctx, []string{"-role", "client", "-d", da, "-addr", addr}, wd.Writer(&out))
	t.Logf("client output:\n%s", out.String())
	if err != nil {
		t.Fatal(hang.Cause(ctx, err))
	}
	srvOut, err := srv.Wait(ctx)
	t.Logf("server output:\n%s", srvOut)
	if err != nil {
		t.Fatalf("server: %v", err)
	}
	var cli []string
	off := 0
	for _, r := range records {
		cli = append(cli, fmt.Sprintf("client: wrote %q at offset %d", r, off))
		off += len(r)
	}
	extest.CheckLines(t, out.String(), cli)
	extest.CheckLines(t, srvOut, serverWant())
}

// TestBadFlags: flag errors are errors, before any device is opened.
func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-role", "peer"}, {"-role", "both", "-d", "rxe1"}, {"extra"}} {
		if err := run(t.Context(), args, &bytes.Buffer{}); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
}
