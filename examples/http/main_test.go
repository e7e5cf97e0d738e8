package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/goverbs/goverbs/examples/internal/extest"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestMain doubles as the example program for TestTwoProcesses' server.
func TestMain(m *testing.M) { extest.Main(m, run) }

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
	ctx, wd := hang.For(t, "", time.Minute) // a hang bound (no progress), not a speed bound
	var out bytes.Buffer
	err := run(ctx, []string{"-role", "both", "-d", db + "," + da, "-addr", extest.ListenIP(db) + ":0"}, wd.Writer(&out))
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(hang.Cause(ctx, err))
	}
	extest.CheckLines(t, out.String(), append(clientWant(db), "server: listening on ", "server: stopped"))
}

// TestTwoProcesses runs the server as a second process (this test binary
// again) and the client here; then interrupts the server (SIGINT, as
// Ctrl-C), which must shut down and exit with status 0.
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
	extest.CheckLines(t, out.String(), clientWant(db))
	srvOut, err := srv.Stop(ctx)
	t.Logf("server output:\n%s", srvOut)
	if err != nil {
		t.Fatalf("server: %v", err)
	}
	extest.CheckLines(t, srvOut, []string{"server: stopped"})
}

// TestBadFlags: flag errors are errors, before any device is opened.
func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-role", "peer"}, {"-role", "both", "-d", "rxe1"}, {"extra"}} {
		if err := run(t.Context(), args, &bytes.Buffer{}); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
}
