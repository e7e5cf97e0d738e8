package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"reflect"
	"testing"
)

func TestParseGetopt(t *testing.T) {
	for _, tc := range []struct {
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
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
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
		if *n != tc.n || *e != tc.e || *c != tc.c || *d != tc.device || !reflect.DeepEqual(ops, tc.operands) {
			t.Errorf("%q: n %d e %v c %v d %q operands %q, want %d %v %v %q %q",
				tc.args, *n, *e, *c, *d, ops, tc.n, tc.e, tc.c, tc.device, tc.operands)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	_, err := ParseGetopt(fs, []string{"--bogus"})
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 1 || ee.Msg != "" {
		t.Errorf("bad flag: %#v, want an ExitError of status 1 and no message", err)
	}
	if _, err := ParseGetopt(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
}

func TestExit(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		out    string
	}{
		{nil, 0, ""},
		{flag.ErrHelp, 0, ""},
		{&ExitError{Code: 1}, 1, ""},
		{fmt.Errorf("serve: %w", &ExitError{Code: 3, Msg: "invariants violated"}), 3, "prog: invariants violated\n"},
		{errors.New("boom"), 1, "prog: boom\n"},
	} {
		var b bytes.Buffer
		if st := Exit("prog", tc.err, &b); st != tc.status || b.String() != tc.out {
			t.Errorf("Exit(%v) = %d, %q; want %d, %q", tc.err, st, b.String(), tc.status, tc.out)
		}
	}
}
