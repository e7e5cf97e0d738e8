package vm

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ClusterDir is where a cluster guest sees the share all nodes have.
const ClusterDir = "/run/vm/cluster"

// inCluster checks that we run inside a `goverbs vm --nodes N` guest.
func inCluster() (self, nodes int, err error) {
	if os.Getenv("GOVERBS_VM_GUEST") != "1" || !exists(ClusterDir) {
		return 0, 0, errors.New("only works inside a multi-node guest (goverbs vm --nodes N -- CMD)")
	}
	self, err1 := strconv.Atoi(os.Getenv("GOVERBS_VM_NODE"))
	nodes, err2 := strconv.Atoi(os.Getenv("GOVERBS_VM_NODES"))
	if err1 != nil || err2 != nil {
		return 0, 0, errors.New("GOVERBS_VM_NODE/GOVERBS_VM_NODES not set: not inside a goverbs vm cluster guest?")
	}
	return self, nodes, nil
}

// ParseNode accepts "2" or "node2".
func ParseNode(s string, nodes int) (int, error) {
	n, err := strconv.Atoi(strings.TrimPrefix(s, "node"))
	if err != nil || n < 0 || (nodes > 0 && n >= nodes) {
		return 0, fmt.Errorf("no node %q (nodes are 0..%d, or node0..node%d)", s, nodes-1, nodes-1)
	}
	return n, nil
}

// Exec runs argv on another node of the cluster, from inside a guest, with
// this process's environment and working directory, and streams its
// stdout and stderr here. It returns the command's exit status, 125 if the
// node died, 2 for bad use. The remote command runs to its end even if this
// client is killed.
func Exec(nodeArg string, argv []string, stdout, stderr io.Writer) int {
	self, nodes, err := inCluster()
	if err != nil {
		fmt.Fprintf(stderr, "goverbs vm exec: %v\n", err)
		return ExitUsage
	}
	n, err := ParseNode(nodeArg, nodes)
	if err != nil {
		fmt.Fprintf(stderr, "goverbs vm exec: %v\n", err)
		return ExitUsage
	}
	if len(argv) == 0 {
		fmt.Fprintf(stderr, "goverbs vm exec: no command\n")
		return ExitUsage
	}
	if n == self {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
		if err := cmd.Run(); err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return ee.ExitCode()
			}
			fmt.Fprintf(stderr, "goverbs vm exec: %v\n", err)
			return 127
		}
		return 0
	}
	q := filepath.Join(ClusterDir, "node"+strconv.Itoa(n))
	id := filepath.Join(q, fmt.Sprintf("from%d-%d-%d", self, os.Getpid(), time.Now().UnixNano()))
	if err := os.WriteFile(id+".tmp", jobScript("goverbs vm exec", argv), 0o644); err != nil {
		fmt.Fprintf(stderr, "goverbs vm exec: %v\n", err)
		return ExitGuest
	}
	if err := os.Rename(id+".tmp", id+".job"); err != nil {
		fmt.Fprintf(stderr, "goverbs vm exec: %v\n", err)
		return ExitGuest
	}
	var offOut, offErr int64
	drain := func(name string, off *int64, w io.Writer) {
		f, err := os.Open(name)
		if err != nil {
			return
		}
		defer f.Close()
		if _, err := f.Seek(*off, io.SeekStart); err != nil {
			return
		}
		m, _ := io.Copy(w, f)
		*off += m
	}
	dead := filepath.Join(ClusterDir, "dead."+strconv.Itoa(n))
	wait := 5 * time.Millisecond
	for {
		drain(id+".out", &offOut, stdout)
		drain(id+".err", &offErr, stderr)
		if b, err := os.ReadFile(id + ".rc"); err == nil {
			drain(id+".out", &offOut, stdout)
			drain(id+".err", &offErr, stderr)
			for _, s := range []string{".run", ".out", ".err", ".rc"} {
				os.Remove(id + s)
			}
			rc, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				return ExitGuest
			}
			return rc
		}
		if exists(dead) {
			fmt.Fprintf(stderr, "goverbs vm exec: node %d died\n", n)
			return ExitGuest
		}
		time.Sleep(wait)
		if wait < 50*time.Millisecond {
			wait += 5 * time.Millisecond
		}
	}
}

// Link changes node n's link on the virtual switch from inside a guest:
// "up" (also clears loss), "down" (partition the node), "loss PCT"
// (drop that share of frames in each direction). It returns once the
// switch applied it.
func Link(nodeArg string, args []string, stderr io.Writer) int {
	_, nodes, err := inCluster()
	if err != nil {
		fmt.Fprintf(stderr, "goverbs vm link: %v\n", err)
		return ExitUsage
	}
	n, err := ParseNode(nodeArg, nodes)
	if err != nil {
		fmt.Fprintf(stderr, "goverbs vm link: %v\n", err)
		return ExitUsage
	}
	base := filepath.Join(ClusterDir, "link."+strconv.Itoa(n))
	os.Remove(base + ".done")
	if err := os.WriteFile(base+".tmp0", []byte(strings.Join(args, " ")+"\n"), 0o644); err != nil {
		fmt.Fprintf(stderr, "goverbs vm link: %v\n", err)
		return ExitGuest
	}
	os.Rename(base+".tmp0", base+".req")
	for t := 0; t < 500; t++ {
		if b, err := os.ReadFile(base + ".done"); err == nil {
			os.Remove(base + ".done")
			if s := strings.TrimSpace(string(b)); s != "ok" {
				fmt.Fprintf(stderr, "goverbs vm link: %s\n", s)
				return ExitUsage
			}
			return 0
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Fprintf(stderr, "goverbs vm link: the host switch did not answer in 10 s\n")
	return ExitGuest
}
