package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/qp"
)

// TestBreakOtherProcess: `chaosload break` reaches into another process:
// a child (this test binary again) holds one RC QP in INIT; modifyQPsOf moves it
// to ERR from here, and the child, querying the kernel, finds it in ERR.
// The other handles the child holds (its PD, its CQ) are not QPs: exactly
// one modify succeeds.
func TestBreakOtherProcess(t *testing.T) {
	if os.Getenv("CHAOSLOAD_BREAK_CHILD") != "" {
		breakChild(t)
		return
	}
	dev := rxetest.One(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestBreakOtherProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "CHAOSLOAD_BREAK_CHILD="+dev)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	defer close(done)
	go func() { // a hang bound: the child must not outlive a failed test
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			cmd.Process.Kill()
		}
	}()
	defer cmd.Wait()
	defer stdin.Close()
	lines := bufio.NewScanner(out)
	expect := func(prefix string) string {
		for lines.Scan() {
			if s, ok := strings.CutPrefix(lines.Text(), prefix); ok {
				return s
			}
		}
		t.Fatalf("the child ended before printing %q", prefix)
		return ""
	}
	if st := expect("child: qp state "); st != "INIT" {
		t.Fatalf("before the break the child's QP is in %s, want INIT", st)
	}
	n, err := modifyQPsOf(cmd.Process.Pid, qp.Err)
	if err != nil {
		t.Fatalf("break: %v", err)
	}
	if n != 1 {
		t.Errorf("break moved %d QPs, want the child's one", n)
	}
	fmt.Fprintln(stdin, "look")
	if st := expect("child: qp state "); st != "ERR" {
		t.Errorf("after the break the child's QP is in %s, want ERR", st)
	}
	// A bad pid is an error that names it, not a panic.
	if _, err := modifyQPsOf(1<<30, qp.Err); err == nil || !strings.Contains(err.Error(), strconv.Itoa(1<<30)) {
		t.Errorf("break of a process that does not exist: %v", err)
	}
}

// breakChild is the child: one RC QP in INIT; it prints the QP's state
// as the kernel reports it, then again after a line on stdin.
func breakChild(t *testing.T) {
	ctx := rxetest.Open(t, os.Getenv("CHAOSLOAD_BREAK_CHILD"))
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	c, err := cq.Create(ctx, 8)
	if err != nil {
		t.Fatal(err)
	}
	q, err := qp.Create(pd, qp.Config{Type: qp.RC, SendCQ: c, RecvCQ: c, MaxSendWR: 4, MaxRecvWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	// RESET cannot go to ERR (the kernel's transition table): INIT can.
	if err := q.Init(1, 0); err != nil {
		t.Fatal(err)
	}
	show := func() {
		a, err := q.Query()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("child: qp state %v\n", a.State)
	}
	show()
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	show()
}
