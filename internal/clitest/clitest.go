// Package clitest is test support for the commands' tests (cmd/goverbs,
// internal/cmd/...).
package clitest

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
)

// Run runs a command in the test's process: run is its main without the
// exit (args without the program name, its exit status), name the
// program's, in failures. The run must return within bound (scaled by
// hang.Scale): a bad value is refused in milliseconds, so a run still
// going after the bound took the value. Run returns the exit status and
// what was written to stdout and stderr; code is -1 (and the test has
// failed) when run did not return within the bound or panicked.
func Run(t testing.TB, bound time.Duration, name string, args []string, run func(args []string, stdout, stderr io.Writer) int) (code int, stdout, stderr string) {
	t.Helper()
	bound = hang.Scale(bound)
	type res struct {
		code           int
		stdout, stderr string
		panic          any
	}
	done := make(chan res, 1)
	go func() {
		var out, errb bytes.Buffer
		defer func() {
			if p := recover(); p != nil {
				done <- res{code: -1, stdout: out.String(), stderr: errb.String(), panic: p}
			}
		}()
		code := run(args, &out, &errb)
		done <- res{code: code, stdout: out.String(), stderr: errb.String()}
	}()
	select {
	case r := <-done:
		if r.panic != nil {
			t.Errorf("%s %q panicked: %v", name, args, r.panic)
		}
		return r.code, r.stdout, r.stderr
	case <-time.After(bound):
		t.Errorf("%s %q: still running after %v (the bad value was accepted)", name, args, bound)
		return -1, "", ""
	}
}
