package vm

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
)

func TestShq(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	for _, s := range []string{"", "plain", "a b", "it's", `"$HOME"`, "x\ny", "*", "$(echo no)", "back\\slash", "-n", "é"} {
		out, err := exec.Command("bash", "-c", "printf %s "+shq(s)).Output()
		if err != nil || string(out) != s {
			t.Errorf("shq(%q) = %s: bash printed %q (%v)", s, shq(s), out, err)
		}
	}
}

func TestJobScript(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	t.Setenv("VMTEST_VALUE", "a 'quoted'\nvalue $x")
	t.Setenv("GOVERBS_VM_NODE", "7") // describes the node: not carried over
	dir := t.TempDir()
	t.Chdir(dir)
	job := jobScript("test", []string{"bash", "-c", `printf '%s|%s|%s|%s|%s' "$VMTEST_VALUE" "$GOVERBS_VM_GUEST" "${GOVERBS_VM_NODE:-unset}" "$PWD" "$1"`, "_", "arg with 'spaces'"})
	p := filepath.Join(dir, "job")
	if err := os.WriteFile(p, job, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", p)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	want := "a 'quoted'\nvalue $x|1|unset|" + dir + "|arg with 'spaces'"
	if err != nil || string(out) != want {
		t.Fatalf("job printed %q (%v), want %q\njob:\n%s", out, err, want, job)
	}
}

func TestParseNode(t *testing.T) {
	for s, want := range map[string]int{"0": 0, "2": 2, "node1": 1} {
		if n, err := ParseNode(s, 3); err != nil || n != want {
			t.Errorf("ParseNode(%q) = %d, %v", s, n, err)
		}
	}
	for _, s := range []string{"3", "-1", "x", "node"} {
		if _, err := ParseNode(s, 3); err == nil {
			t.Errorf("ParseNode(%q): no error", s)
		}
	}
}

func TestParseHugePages(t *testing.T) {
	for s, want := range map[string]int{"": DefaultHugePages, "0": NoHugePages, "8": 8, "64": 64} {
		if n, err := ParseHugePages(s); err != nil || n != want {
			t.Errorf("ParseHugePages(%q) = %d, %v; want %d", s, n, err, want)
		}
	}
	for _, s := range []string{"-1", "x", "2M", " 8"} {
		if n, err := ParseHugePages(s); err == nil {
			t.Errorf("ParseHugePages(%q) = %d, no error", s, n)
		}
	}
	// What init2 writes to nr_hugepages.
	for o, want := range map[int]int{0: DefaultHugePages, NoHugePages: 0, 8: 8} {
		if n := (&runner{Options: Options{HugePages: o}}).hugePages(); n != want {
			t.Errorf("HugePages %d: guest reserves %d, want %d", o, n, want)
		}
	}
}

func TestParseMTU(t *testing.T) {
	for s, want := range map[string]int{"": DefaultMTU, "1500": 1500, "9000": 9000, "1280": MinMTU, "65535": MaxMTU} {
		if n, err := ParseMTU(s); err != nil || n != want {
			t.Errorf("ParseMTU(%q) = %d, %v; want %d", s, n, err, want)
		}
	}
	for _, s := range []string{"0", "1279", "65536", "-9000", "9k", " 9000"} {
		if n, err := ParseMTU(s); err == nil {
			t.Errorf("ParseMTU(%q) = %d, no error", s, n)
		}
	}
}

// The init scripts configure routing and mount over /: they must refuse to
// run anywhere but as PID 1 of the guest.
func TestInitRefusesOnHost(t *testing.T) {
	for _, name := range []string{"init1", "init2"} {
		s := string(GuestFile(name))
		// The guard comes before any command that changes something.
		guard := strings.Index(s, `"$$" != 1`)
		if name == "init2" {
			guard = strings.Index(s, "(($$ != 1))")
		}
		first := len(s)
		for _, w := range []string{"mount", "ip ", "rdma ", "modprobe", "--install", "echo o"} {
			if i := strings.Index(s, "\n"+w); i >= 0 && i < first {
				first = i
			}
			if i := strings.Index(s, "\nmnt "); i >= 0 && i < first {
				first = i
			}
		}
		if guard < 0 || guard > first {
			t.Errorf("%s: no PID-1 guard before its first action", name)
		}
	}
	// And they do refuse, run here (in throw-away namespaces when we can,
	// so even a broken guard could not touch the host).
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	dir := t.TempDir()
	for _, name := range []string{"init2"} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, GuestFile(name), 0o755)
		args := []string{bash, p}
		if u, err := exec.LookPath("unshare"); err == nil && os.Geteuid() == 0 {
			args = append([]string{u, "--mount", "--net", "--uts", "--"}, args...)
		}
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "only runs as PID 1") {
			t.Errorf("%s on the host: %v, %q", name, err, out)
		}
	}
}

func TestCpio(t *testing.T) {
	var c cpioWriter
	c.dir("bin")
	c.file("bin/hello", 0o755, []byte("hi\n"))
	c.file("init", 0o755, []byte("#!/bin/sh\n"))
	c.trailer()
	b := c.Bytes()
	if len(b)%4 != 0 || !bytes.HasPrefix(b, []byte("070701")) || !bytes.Contains(b, []byte("TRAILER!!!")) {
		t.Fatalf("bad archive")
	}
	bb, err := busybox()
	if err != nil {
		t.Skip("no busybox to list the archive")
	}
	cmd := exec.Command(bb, "cpio", "-t")
	cmd.Stdin = bytes.NewReader(b)
	out, err := cmd.Output()
	if err != nil || strings.Fields(string(out))[1] != "bin/hello" {
		t.Fatalf("busybox cpio -t: %q %v", out, err)
	}
}

func TestBzImageVersion(t *testing.T) {
	img := make([]byte, 0x600)
	copy(img[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(img[0x20e:], 0x300)
	copy(img[0x500:], "6.1.0-99-amd64 (debian-kernel@lists.debian.org) #1 SMP\x00")
	p := filepath.Join(t.TempDir(), "vmlinuz")
	os.WriteFile(p, img, 0o644)
	if v, err := bzImageVersion(p); err != nil || v != "6.1.0-99-amd64" {
		t.Fatalf("bzImageVersion = %q, %v", v, err)
	}
	os.WriteFile(p, []byte("not a kernel"), 0o644)
	if _, err := bzImageVersion(p); err == nil {
		t.Fatal("no error for a non-kernel")
	}
}

func TestAccelNeverKVMOnPVM(t *testing.T) {
	a := accel()
	t.Logf("accel: %s", a)
	if exists("/sys/module/kvm_pvm") && os.Getenv("GOVERBS_VM_ACCEL") == "" && a != "tcg" {
		t.Fatalf("PVM host: accel %s, want tcg", a)
	}
}

// The switch, with fake guests: flooding, learning, loss and partition.
func TestSwitch(t *testing.T) {
	base := "" // unix sockets: not on the 9p /tmp of a guest
	if os.Getenv("GOVERBS_VM_GUEST") == "1" && exists("/dev/shm") {
		base = "/dev/shm"
	}
	dir, err := os.MkdirTemp(base, "vmsw")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	s, err := newSwitch(filepath.Join(dir, "net"), 3, 1, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	var g []*net.UnixConn
	for i := 0; i < 3; i++ {
		gp, _ := s.paths(i, 0)
		c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: gp, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		g = append(g, c)
	}
	go s.run()
	mac := func(i byte) []byte { return []byte{0x52, 0x54, 0, 0x77, 0, i} }
	frame := func(dst, src []byte, payload string) []byte {
		f := append(append(append([]byte{}, dst...), src...), 0x08, 0x00)
		return append(f, payload...)
	}
	send := func(i int, f []byte) {
		_, sw := s.paths(i, 0)
		if _, err := g[i].WriteToUnix(f, &net.UnixAddr{Name: sw, Net: "unixgram"}); err != nil {
			t.Fatal(err)
		}
	}
	// recvWithin reads one frame of node i, "" if none came within d: a
	// frame that must come gets a hang bound (scaled), one that must not
	// gets 300 ms.
	recvWithin := func(i int, d time.Duration) string {
		g[i].SetReadDeadline(time.Now().Add(d))
		buf := make([]byte, 2048)
		n, _, err := g[i].ReadFromUnix(buf)
		if err != nil {
			return ""
		}
		return string(buf[14:n])
	}
	recv := func(i int) string { return recvWithin(i, hang.Scale(10*time.Second)) }
	quiet := func(i int) string { return recvWithin(i, 300*time.Millisecond) }
	bcast := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	send(0, frame(bcast, mac(0), "hello"))
	if a, b := recv(1), recv(2); a != "hello" || b != "hello" {
		t.Fatalf("broadcast: %q %q", a, b)
	}
	send(2, frame(mac(0), mac(2), "to0")) // 0 is known: unicast only
	if a, b := recv(0), quiet(1); a != "to0" || b != "" {
		t.Fatalf("unicast: node0 %q, node1 %q", a, b)
	}
	s.setDown(2, true)
	send(0, frame(mac(2), mac(0), "cut"))
	if a := quiet(2); a != "" {
		t.Fatalf("down link delivered %q", a)
	}
	// Link requests from the guests, as `goverbs vm link` writes them.
	os.WriteFile(filepath.Join(dir, "link.2.req"), []byte("loss 100\n"), 0o644)
	deadline := time.Now().Add(hang.Scale(5 * time.Second))
	for !exists(filepath.Join(dir, "link.2.done")) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "link.2.done")); string(b) != "ok\n" {
		t.Fatalf("link request: %q", b)
	}
	if s.loss[2].Load() != 1e6 {
		t.Fatalf("link 2: down %v loss %d", s.down[2].Load(), s.loss[2].Load())
	}
	send(0, frame(mac(2), mac(0), "lost"))
	if a := quiet(2); a != "" {
		t.Fatalf("100%% loss delivered %q", a)
	}
	if err := s.apply(2, []string{"up"}); err != nil {
		t.Fatal(err)
	}
	send(0, frame(mac(2), mac(0), "back"))
	if a := recv(2); a != "back" {
		t.Fatalf("link up: got %q", a)
	}
	if st := s.stats(); !strings.Contains(st, "node 2:") || !strings.Contains(st, "dropped 2") {
		t.Errorf("stats:\n%s", st)
	}
	for _, bad := range []string{"x", "nan", "NaN", "-1", "101"} {
		if err := s.apply(1, []string{"loss", bad}); err == nil {
			t.Errorf("loss %s accepted", bad)
		}
	}
	// A frame as large as MaxMTU allows crosses whole.
	big := frame(mac(2), mac(0), strings.Repeat("j", MaxMTU+4))
	send(0, big)
	g[2].SetReadDeadline(time.Now().Add(hang.Scale(10 * time.Second)))
	buf := make([]byte, 2*len(big))
	if n, _, err := g[2].ReadFromUnix(buf); err != nil || n != len(big) {
		t.Errorf("a %d-byte frame arrived as %d bytes (%v)", len(big), n, err)
	}
}

// fakeBoot boots a "guest" that is a shell script standing in for qemu
// (it writes to the console pipe, fd 5, as the kernel would): the
// supervisor's bounds and cleanup, without qemu.
func fakeBoot(t *testing.T, script string) (*runner, chan os.Signal, chan int) {
	t.Helper()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	tmp, err := os.MkdirTemp("", "vmfake") // short: the run folder's base
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	t.Setenv("TMPDIR", tmp)
	fake := filepath.Join(tmp, "qemu")
	if err := os.WriteFile(fake, []byte("#!"+sh+"\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	r := &runner{Options: Options{Prog: "test", Nodes: 1, Devices: 2, CPUs: 1, Mem: "1G", MTU: DefaultMTU, Stdout: io.Discard, Stderr: &stderr},
		kernel: &kernel{vmlinux: "/nonexistent/vmlinux", version: "0.0.0-fake", modDir: "/nonexistent"}, initrd: "/nonexistent/initrd", accel: "tcg"}
	sigc := make(chan os.Signal, 1)
	done := make(chan int, 1)
	go func() {
		code, err := r.boot([]string{"true"}, fake, sigc)
		if err != nil {
			t.Errorf("boot: %v", err)
		}
		done <- code
	}()
	return r, sigc, done
}

// A guest that never starts its command but whose console keeps growing
// (a kernel printing stall warnings) is stopped at GOVERBS_VM_BOOT_MAX,
// said so, and nothing is left running or on disk.
func TestBootBoundChattyConsole(t *testing.T) {
	// The silence bound well above the whole-boot one: a loaded host that
	// stalls the fake's loop for a second must not make it the one that
	// fires.
	t.Setenv("GOVERBS_VM_BOOT_TIMEOUT", "20")
	t.Setenv("GOVERBS_VM_BOOT_MAX", "3")
	r, _, done := fakeBoot(t, `while :; do echo "rcu: INFO: rcu_sched self-detected stall" >&5; sleep 0.2; done`)
	var code int
	select {
	case code = <-done:
	case <-time.After(hang.Scale(60 * time.Second)):
		t.Fatal("a guest whose console keeps printing was never stopped")
	}
	stderr := r.Stderr.(*bytes.Buffer).String()
	if code != ExitTimeout || !strings.Contains(stderr, "still printing") || !strings.Contains(stderr, "self-detected stall") {
		t.Errorf("exit %d (want %d), stderr:\n%s", code, ExitTimeout, stderr)
	}
	pid := r.nodes[0].cmd.Process.Pid
	r.cleanup()
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("fake qemu %d still running", pid)
	}
	if exists(r.dir) {
		t.Errorf("run folder %s left behind", r.dir)
	}
}

// A signal stops the guest at once: 128+signal, the "qemu" gone.
func TestBootSignal(t *testing.T) {
	r, sigc, done := fakeBoot(t, `echo booting >&5; exec sleep 1000`)
	deadline := time.Now().Add(hang.Scale(30 * time.Second))
	for time.Now().Before(deadline) { // (r is boot's until done)
		if m, _ := filepath.Glob(filepath.Join(os.Getenv("TMPDIR"), "goverbs-vm.*", "node0", "console.log")); len(m) == 1 {
			if st, err := os.Stat(m[0]); err == nil && st.Size() > 0 {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	sigc <- syscall.SIGTERM
	select {
	case code := <-done:
		if code != 128+int(syscall.SIGTERM) {
			t.Errorf("exit %d after SIGTERM", code)
		}
	case <-time.After(hang.Scale(30 * time.Second)):
		t.Fatal("no exit after SIGTERM")
	}
	if err := syscall.Kill(r.nodes[0].cmd.Process.Pid, 0); err == nil {
		t.Error("fake qemu still running after SIGTERM")
	}
	r.cleanup()
	if exists(r.dir) {
		t.Errorf("run folder %s left behind", r.dir)
	}
}

// What an interrupted setup left half-written goes; the finished cache
// stays.
func TestRemoveStale(t *testing.T) {
	c := t.TempDir()
	keep := []string{"kernel/6.1.0-9-amd64/ok", "kernel/6.1.0-9-amd64/vmlinux", "kernel/6.1.0-9-amd64/initrd-0123.cpio", "lock"}
	stale := []string{"kernel/.tmp.123/root/boot/vmlinuz-6.1.0-9-amd64", "kernel/.tmp.456/linux-image.deb", "kernel/6.1.0-9-amd64/initrd-0123.cpio.tmp"}
	for _, f := range append(append([]string{}, keep...), stale...) {
		p := filepath.Join(c, f)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	removeStale(c)
	for _, f := range keep {
		if !exists(filepath.Join(c, f)) {
			t.Errorf("%s removed", f)
		}
	}
	for _, f := range append(stale, "kernel/.tmp.123", "kernel/.tmp.456") {
		if exists(filepath.Join(c, f)) {
			t.Errorf("%s left", f)
		}
	}
}

// Folders with a comma reach qemu escaped (",,"), or qemu would end the
// path at the comma and refuse the rest.
func TestArgsCommaPath(t *testing.T) {
	r := &runner{Options: Options{Nodes: 1, CPUs: 1, Mem: "1G"}, kernel: &kernel{vmlinux: "/k/vmlinux"}, initrd: "/k/initrd"}
	nd := &node{r: r, dir: "/tmp/a,b/goverbs-vm.1/node0"}
	args := strings.Join(nd.args([]string{"/tmp", "/data/x,y"}), " ")
	for _, want := range []string{"path=/tmp/a,,b/goverbs-vm.1/node0,security_model=none", "path=/data/x,,y,security_model=none"} {
		if !strings.Contains(args, want) {
			t.Errorf("qemu args lack %q:\n%s", want, args)
		}
	}
}

func TestMemMiB(t *testing.T) {
	for s, want := range map[string]int{"2G": 2048, "1g": 1024, "1536": 1536, "512M": 512, "1.5G": 1536, "size=2G,maxmem=4G": 2048, "1048576K": 1024} {
		if n, ok := memMiB(s); !ok || n != want {
			t.Errorf("memMiB(%q) = %d, %v; want %d", s, n, ok, want)
		}
	}
	for _, s := range []string{"", "G", "x", "-1G", "0", "NaN"} {
		if n, ok := memMiB(s); ok {
			t.Errorf("memMiB(%q) = %d, ok", s, n)
		}
	}
}

// A node whose start fails half-way (here: console.log cannot be
// created) must not leave a relay waiting on a pipe: wait, and with it
// the cleanup, returns.
func TestStartFailureReleasesRelays(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "console.log"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &runner{Options: Options{Nodes: 1, CPUs: 1, Mem: "1G", Stdout: io.Discard, Stderr: io.Discard},
		kernel: &kernel{vmlinux: "/k/vmlinux"}, initrd: "/k/initrd"}
	nd := &node{r: r, dir: dir, exited: make(chan struct{})}
	r.nodes = []*node{nd}
	if err := nd.start("/nonexistent/qemu", nil); err == nil {
		t.Fatal("start succeeded")
	}
	done := make(chan struct{})
	go func() { r.killAll(); r.waitAll(); close(done) }()
	select {
	case <-done:
	case <-time.After(hang.Scale(10 * time.Second)):
		t.Fatal("waitAll hangs after a failed start: a relay still reads an open pipe")
	}
}
