package main

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/goverbs/goverbs/examples/internal/extest"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestMain doubles as the example program for TestTwoProcesses' server.
func TestMain(m *testing.M) { extest.Main(m, run) }

// TestBoth runs both roles in one process, as `go run ./examples/sendrecv`
// does: the server prints every message and the client every echo.
func TestBoth(t *testing.T) {
	da, db := rxetest.Pair(t)
	ctx, wd := hang.For(t, "", time.Minute) // a hang bound (no progress), not a speed bound
	var out bytes.Buffer
	err := run(ctx, []string{"-role", "both", "-d", db + "," + da, "-addr", extest.ListenIP(db) + ":0"}, wd.Writer(&out))
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(hang.Cause(ctx, err))
	}
	want := []string{"server: listening on ", "client: " + da + " connected to QPN "}
	for _, m := range messages {
		want = append(want, fmt.Sprintf("server: received %q", m), fmt.Sprintf("client: sent %q, echo %q", m, m))
	}
	extest.CheckLines(t, out.String(), want)
}

// TestTwoProcesses runs the server as a second process (this test binary
// again) and the client here: the server exits after "bye" with status 0,
// having printed every message, and the client saw every echo.
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
	var cli, srvWant []string
	for _, m := range messages {
		cli = append(cli, fmt.Sprintf("client: sent %q, echo %q", m, m))
		srvWant = append(srvWant, fmt.Sprintf("server: received %q", m))
	}
	extest.CheckLines(t, out.String(), cli)
	extest.CheckLines(t, srvOut, srvWant)
}

// TestBadFlags: flag errors are errors, before any device is opened.
func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-role", "peer"}, {"-role", "both", "-d", "rxe1"}, {"extra"}} {
		if err := run(t.Context(), args, &bytes.Buffer{}); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
}
