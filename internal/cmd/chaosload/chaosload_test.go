package main

import (
	"strings"
	"testing"
)

// TestChaosLedger: the server's ledger applies an id once, counts a retried
// attempt as de-duplicated and the same attempt delivered twice as a
// transport duplicate.
func TestChaosLedger(t *testing.T) {
	l := &chaosLedger{ids: map[uint64]*chaosEntry{}}
	if !l.apply(7, 0) {
		t.Fatal("first delivery not applied")
	}
	if l.apply(7, 1) {
		t.Fatal("retry applied again")
	}
	if l.apply(7, 1) {
		t.Fatal("duplicate applied again")
	}
	l.apply(8, 70) // attempts beyond the bitmap are not tracked
	l.apply(8, 70)
	if l.applied != 2 || l.deliveries != 5 || l.retryDups != 3 || l.transportDups != 1 {
		t.Fatalf("applied %d deliveries %d retry dups %d transport dups %d, want 2 5 3 1",
			l.applied, l.deliveries, l.retryDups, l.transportDups)
	}
}

func TestChaosServerViolations(t *testing.T) {
	idle := chaosProc{Goroutines: 5, FDs: 10, Eager: 256, RDMA: map[string]int{"qp": 0, "cq": 1}}
	ok := &chaosServerStats{Peers: 1, Idle: idle,
		Proc: chaosProc{Goroutines: 10, FDs: 11, Eager: 257, RSSKiB: 20000, RDMA: map[string]int{"qp": 2, "cq": 1}}}
	if v := chaosServerViolations(ok, 2, 512<<10); len(v) != 0 {
		t.Fatalf("idle server with one peer: %v", v)
	}
	bad := *ok
	bad.TransportDups = 1
	bad.Proc.RDMA = map[string]int{"qp": 4}
	bad.Proc.Large = 1
	bad.Proc.FDs = 13
	v := strings.Join(chaosServerViolations(&bad, 2, 512<<10), "\n")
	for _, want := range []string{"delivered twice", "4 QPs", "large", "fds"} {
		if !strings.Contains(v, want) {
			t.Errorf("violations %q lack %q", v, want)
		}
	}
	if v := chaosLeaks("driver", idle, chaosProc{Goroutines: 9, FDs: 10, Eager: 255, RDMA: map[string]int{"qp": 2, "cq": 1}}, 0); len(v) != 3 {
		t.Errorf("driver leaks: %v, want goroutines, buffers and QPs", v)
	}
}

// TestBreakFlags: `chaosload break` refuses a missing or bad pid and an
// unknown state, naming what was wrong, before it touches any process.
func TestBreakFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--pid 0"},
		{[]string{"--pid", "-3"}, "--pid -3"},
		{[]string{"--pid", "1", "--state", "rts"}, `--state "rts"`},
		{[]string{"--pid", "1", "extra"}, "unexpected arguments"},
	} {
		var out, errb strings.Builder
		err := runChaosLoad(append([]string{"break"}, c.args...), &out, &errb)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("break %q: %v, want an error naming %s", c.args, err, c.want)
		}
		if out.Len() != 0 {
			t.Errorf("break %q printed %q", c.args, out.String())
		}
	}
}
