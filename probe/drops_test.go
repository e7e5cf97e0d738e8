package probe

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/internal/rxetest"
)

// withMapSizes makes the test's Attach create the named maps with these
// sizes.
func withMapSizes(t *testing.T, sizes map[string]uint32) {
	mapSizes = sizes
	t.Cleanup(func() { mapSizes = nil })
}

// dropObject is the first of the made-up ioctl objects TestCommandsMapFull
// issues: no uverbs object has such an id, so the kernel refuses each call
// (counted all the same).
const dropObject = 0x0f00

// verbsIoctl issues RDMA_VERBS_IOCTL on fd with a struct
// ib_uverbs_ioctl_hdr naming object obj, method 1 and no attributes: the
// command "ioctl obj/1" to the uverbs-commands probe.
func verbsIoctl(fd int, obj uint16) {
	var hdr [24]byte
	binary.LittleEndian.PutUint16(hdr[0:], uint16(len(hdr))) // length
	binary.LittleEndian.PutUint16(hdr[2:], obj)              // object_id
	binary.LittleEndian.PutUint16(hdr[4:], 1)                // method_id
	unix.Syscall(unix.SYS_IOCTL, uintptr(fd), rdmaVerbsIoctl, uintptr(unsafe.Pointer(&hdr[0])))
}

// TestCommandsMapFull: with gv_cmds made 2 entries, n distinct commands
// of this process fill it and the rest are reported as dropped
// (Snapshot.Dropped["gv_cmds"]: each either counted or dropped); with the
// default size the same commands are all counted and nothing is dropped.
// It runs wherever the uverbs-commands probe attaches: on the raw
// tracepoints (the development host as root) any fd will do, on
// ib_uverbs_ioctl (the guest) it takes a uverbs device's fd.
func TestCommandsMapFull(t *testing.T) {
	const n = 8
	f, err := os.Open(os.DevNull)
	if uv, _ := filepath.Glob("/dev/infiniband/uverbs*"); len(uv) > 0 {
		f, err = os.OpenFile(uv[0], os.O_RDWR, 0)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	skip := slices.DeleteFunc(Names(), func(name string) bool { return name == "uverbs-commands" })
	run := func(sizes map[string]uint32) *Snapshot {
		withMapSizes(t, sizes)
		p := attach(t, Options{PIDs: []int{os.Getpid()}, Skip: skip})
		defer p.Close()
		if !p.Attached("uverbs-commands") {
			t.Fatal("uverbs-commands not attached")
		}
		for _, st := range p.Status() {
			if st.Name == "uverbs-commands" && st.Via != "raw tracepoints" && f.Name() == os.DevNull {
				t.Skipf("uverbs-commands on %s needs a uverbs device, none in /dev/infiniband", st.Via)
			}
		}
		for i := range n {
			verbsIoctl(int(f.Fd()), dropObject+uint16(i))
		}
		s, err := p.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// ours is how many of the n commands s counted.
	ours := func(s *Snapshot) uint64 {
		var c uint64
		for _, cmd := range s.Commands {
			if cmd.Kind == "ioctl" && cmd.Object >= dropObject && cmd.Object < dropObject+n {
				c += cmd.Count
			}
		}
		return c
	}

	s := run(map[string]uint32{mapCmds: 2})
	t.Logf("gv_cmds of 2: %d of %d commands counted, dropped %v", ours(s), n, s.Dropped)
	if len(s.Commands) > 2 {
		t.Errorf("%d commands in a gv_cmds of 2 entries: the size was not applied", len(s.Commands))
	}
	if d := s.Dropped[mapCmds]; d < n-2 || ours(s)+d < n {
		t.Errorf("gv_cmds of 2: %d counted, %d dropped, want at least %d dropped and %d in all", ours(s), d, n-2, n)
	}

	s = run(nil)
	t.Logf("default gv_cmds: %d of %d commands counted, dropped %v", ours(s), n, s.Dropped)
	if len(s.Dropped) != 0 || ours(s) != n {
		t.Errorf("default sizes: %d of %d commands counted, dropped %v; want all, none", ours(s), n, s.Dropped)
	}
}

// TestQPMapFull: with gv_qps made 1 entry, an rc-pingpong (two QPs, one
// per side) fills it, and the packets and completions of the other QP are
// reported as dropped (Snapshot.Dropped["gv_qps"]); with the default size
// the same workload drops nothing and both QPs have every completion.
func TestQPMapFull(t *testing.T) {
	rxetest.Pair(t)
	const iters = 50
	run := func(sizes map[string]uint32, port int) (*Snapshot, *side, *side) {
		withMapSizes(t, sizes)
		p := attach(t, Options{PerPacket: true, Skip: []string{"uverbs-commands", "cq-events"}})
		defer p.Close()
		if !p.Attached("rxe-completions") {
			t.Fatal("rxe-completions not attached")
		}
		cli, srv := pingpong(t, iters, port)
		s, err := p.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		return s, cli, srv
	}

	s, _, _ := run(map[string]uint32{mapQPs: 1}, 18844)
	t.Logf("gv_qps of 1: %d QPs, dropped %v", len(s.QPs), s.Dropped)
	if len(s.QPs) > 1 {
		t.Errorf("%d QPs in a gv_qps of 1 entry: the size was not applied", len(s.QPs))
	}
	if s.Dropped[mapQPs] == 0 {
		t.Errorf("gv_qps of 1 entry, two QPs: nothing dropped (%v)", s.Dropped)
	}

	s, cli, srv := run(nil, 18845)
	t.Logf("default gv_qps: %d QPs, dropped %v", len(s.QPs), s.Dropped)
	if len(s.Dropped) != 0 {
		t.Errorf("default sizes: dropped %v", s.Dropped)
	}
	for _, sd := range []*side{cli, srv} {
		if q := findQP(s, sd.dev, sd.qpn); q.SendCompletions != iters || q.RecvCompletions != iters {
			t.Errorf("%s qp %#x: %d send, %d recv completions, want %d each", sd.dev, sd.qpn, q.SendCompletions, q.RecvCompletions, iters)
		}
	}
}
