package cli

import (
	"errors"
	"flag"
	"slices"
	"strings"
	"testing"
)

// getoptCases are command lines as rdma-core's tools take them, with the
// flags -n/--iters (int), -e and -c (bool), -d/--device (string) defined.
var getoptCases = []struct {
	args     []string
	n        int
	e, c     bool
	device   string
	operands []string
}{
	{[]string{"10.0.0.2", "-n", "10"}, 10, false, false, "", []string{"10.0.0.2"}},
	{[]string{"-ce", "-n10", "host"}, 10, true, true, "", []string{"host"}},
	{[]string{"--device=rxe0", "--iters", "7"}, 7, false, false, "rxe0", nil},
	{[]string{"-iters", "3", "-d", "rxe1", "--", "-x"}, 3, false, false, "rxe1", []string{"-x"}},
}

func TestParseGetopt(t *testing.T) {
	for _, tc := range getoptCases {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(new(strings.Builder))
		n := fs.Int("n", 0, "")
		fs.IntVar(n, "iters", 0, "")
		e := fs.Bool("e", false, "")
		c := fs.Bool("c", false, "")
		d := fs.String("d", "", "")
		fs.StringVar(d, "device", "", "")
		ops, err := ParseGetopt(fs, tc.args)
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if *n != tc.n || *e != tc.e || *c != tc.c || *d != tc.device || !slices.Equal(ops, tc.operands) {
			t.Errorf("%q: n %d e %v c %v d %q operands %q, want %d %v %v %q %q",
				tc.args, *n, *e, *c, *d, ops, tc.n, tc.e, tc.c, tc.device, tc.operands)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	_, err := ParseGetopt(fs, []string{"--bogus"})
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 1 || ee.Msg != "" {
		t.Errorf("bad flag: %#v, want an ExitError of status 1 and no message", err)
	}
	if _, err := ParseGetopt(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
}

// TestExit: the status and the message of each kind of error a command
// returns.
func TestExit(t *testing.T) {
	check := func(err error, status int, out string) {
		t.Helper()
		var b strings.Builder
		if st := Exit("prog", err, &b); st != status || b.String() != out {
			t.Errorf("Exit(%v) = %d, %q; want %d, %q", err, st, b.String(), status, out)
		}
	}
	check(nil, 0, "")
	check(flag.ErrHelp, 0, "")
	check(&ExitError{Code: 1}, 1, "") // flag printed the message already
	check(errors.Join(errors.New("serve"), &ExitError{Code: 3, Msg: "invariants violated"}), 3, "prog: invariants violated\n")
	check(errors.New("boom"), 1, "prog: boom\n")
}
