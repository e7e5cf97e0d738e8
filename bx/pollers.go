package bx

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Polling pays only while every polling process has a core to itself. A
// parameter server's workers and servers on one small machine outnumber
// its cores: each polling endpoint's spinning thread then takes the CPU
// its peers and the kernel's rxe work need, and loses its core for whole
// time slices; sleeping on the CQ's events costs less. Measured on our 2
// vCPU guest (docs/perf.md, "Thirteenth session"): `goverbs ps bench`
// (3 processes) ran 2x the steps per second event-driven than polling,
// while a client and server pair (2 processes) is fastest polling.
//
// So the processes of a machine that may poll (an endpoint with
// Config.Spin > 0) register in a directory (the pollers registry, one
// file per process, each held under flock by its process: a process that
// dies leaves a file no one holds, which the next count removes), and an
// endpoint polls only while the registered processes are no more than
// the machine's CPUs (runtime.NumCPU). The count is refreshed at most
// every pollersTTL, by a poller about to spin, and so is GOMAXPROCS
// (procs): runtime.GOMAXPROCS takes the scheduler's lock, which every
// thread of the process contends for, and a poller asks on every turn.
const pollersTTL = 100 * time.Millisecond

var pollers struct {
	mu    sync.Mutex
	refs  int      // this process's endpoints that may poll
	f     *os.File // this process's file in dir, under flock(LOCK_SH)
	dir   string   // "" until registered (or when registering failed)
	count atomic.Int32
	procs atomic.Int32 // runtime.GOMAXPROCS at the last count
	next  atomic.Int64 // UnixNano of the next count
}

// pollersDir is the registry: in /dev/shm (memory, per container) when
// there is one, else the temporary directory; one per user.
func pollersDir() string {
	base := "/dev/shm"
	if st, err := os.Stat(base); err != nil || !st.IsDir() {
		base = os.TempDir()
	}
	if d := os.Getenv("GOVERBS_POLLERS_DIR"); d != "" {
		base = d
	}
	return filepath.Join(base, "goverbs-pollers-"+strconv.Itoa(os.Getuid()))
}

// registerPoller counts an endpoint that may poll; the first registers
// the process. A registry that cannot be used leaves the count at 1 (the
// endpoint polls as if alone) and says nothing: polling is a speed
// policy, not a function.
func registerPoller() {
	pollers.mu.Lock()
	defer pollers.mu.Unlock()
	pollers.refs++
	if pollers.refs > 1 {
		return
	}
	dir := pollersDir()
	if f, err := registerIn(dir); err == nil {
		pollers.f, pollers.dir = f, dir
	}
	countPollers(time.Now()) // 1 when registering failed
}

// registerIn creates the process's file in dir: under a temporary name,
// locked, then renamed, so that a count never sees it unlocked.
func registerIn(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	name := strconv.Itoa(os.Getpid())
	tmp := filepath.Join(dir, "."+name)
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("lock %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, err
	}
	return f, nil
}

// unregisterPoller undoes registerPoller; the last one removes the
// process's file.
func unregisterPoller() {
	pollers.mu.Lock()
	defer pollers.mu.Unlock()
	if pollers.refs--; pollers.refs > 0 || pollers.f == nil {
		return
	}
	os.Remove(filepath.Join(pollers.dir, strconv.Itoa(os.Getpid())))
	pollers.f.Close()
	pollers.f, pollers.dir = nil, ""
}

// machinePollers is the number of registered processes, this one
// included, counted at most pollersTTL ago.
func machinePollers(now time.Time) int {
	if now.UnixNano() >= pollers.next.Load() && pollers.mu.TryLock() {
		countPollers(now)
		pollers.mu.Unlock()
	}
	return int(pollers.count.Load())
}

// countPollers counts the files someone holds (pollers.mu held): a file
// that can be locked exclusively belongs to a process that is gone, and
// is removed.
func countPollers(now time.Time) {
	pollers.next.Store(now.Add(pollersTTL).UnixNano())
	pollers.procs.Store(int32(runtime.GOMAXPROCS(0)))
	if pollers.f == nil {
		pollers.count.Store(1)
		return
	}
	n, err := countIn(pollers.dir, os.Getpid())
	if err != nil {
		n = 1
	}
	pollers.count.Store(int32(n))
}

// countIn counts the live registrations in dir, self's included.
func countIn(dir string, self int) (int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, ent := range ents {
		name := ent.Name()
		if strings.HasPrefix(name, ".") {
			continue // being registered
		}
		if pid, err := strconv.Atoi(name); err == nil && pid == self {
			n++
			continue
		}
		path := filepath.Join(dir, name)
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		switch err := flock(fd, unix.LOCK_EX|unix.LOCK_NB); {
		case errors.Is(err, unix.EWOULDBLOCK):
			n++
		case err == nil:
			os.Remove(path) // its process is gone
		default:
			n++ // cannot tell: count it, polling less rather than more
		}
		unix.Close(fd)
	}
	return n, nil
}

// flock is flock(2), again when a signal interrupted it (the runtime's
// preemption signals reach every thread; without the retry a count
// missed a live process in a loaded run).
func flock(fd, how int) error {
	for {
		if err := unix.Flock(fd, how); err != unix.EINTR {
			return err
		}
	}
}

// spareCores reports whether the machine has a core for every process
// that may poll (the pollers registry).
func spareCores(now time.Time) bool {
	return machinePollers(now) <= runtime.NumCPU()
}

// spareProcs reports whether a poller leaves a P for the process's other
// goroutines (GOMAXPROCS > 1) and the machine has a core for every
// process that may poll: both as counted at most pollersTTL ago.
func spareProcs(now time.Time) bool {
	spare := spareCores(now) // first: it refreshes procs when due
	procs := pollers.procs.Load()
	if procs == 0 { // not counted yet (someone else is counting)
		procs = int32(runtime.GOMAXPROCS(0))
	}
	return procs > 1 && spare
}
