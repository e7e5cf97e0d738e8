package vm

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// qemuPath finds qemu-system-x86_64 (GOVERBS_VM_QEMU overrides).
func qemuPath() (string, error) {
	q := os.Getenv("GOVERBS_VM_QEMU")
	if q == "" {
		q = "qemu-system-x86_64"
	}
	p, err := exec.LookPath(q)
	if err != nil {
		return "", fail(ExitGuest, "qemu not found (%s): install it (Debian/Ubuntu: apt-get install qemu-system-x86; "+
			"Fedora: dnf install qemu-system-x86-core) or point GOVERBS_VM_QEMU at qemu-system-x86_64", q)
	}
	return p, nil
}

// accel picks kvm when it really works, else tcg. GOVERBS_VM_ACCEL=tcg|kvm
// overrides. KVM is used only if /dev/kvm answers KVM_GET_API_VERSION (12)
// and KVM_CREATE_VM, the CPU advertises vmx or svm, and the host is not a
// PVM guest (kvm_pvm: there -accel kvm aborts or hangs at "Probing EDD").
func accel() string {
	switch os.Getenv("GOVERBS_VM_ACCEL") {
	case "tcg":
		return "tcg"
	case "kvm":
		return "kvm"
	}
	if kvmUsable() {
		return "kvm"
	}
	return "tcg"
}

func kvmUsable() bool {
	if runtime.GOARCH != "amd64" || exists("/sys/module/kvm_pvm") {
		return false
	}
	info, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return false
	}
	flags := ""
	for _, l := range strings.Split(string(info), "\n") {
		if strings.HasPrefix(l, "flags") {
			flags = " " + l + " "
			break
		}
	}
	if !strings.Contains(flags, " vmx ") && !strings.Contains(flags, " svm ") {
		return false
	}
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	const kvmGetAPIVersion, kvmCreateVM = 0xAE00, 0xAE01
	if v, err := unix.IoctlRetInt(fd, kvmGetAPIVersion); err != nil || v != 12 {
		return false
	}
	vm, err := unix.IoctlRetInt(fd, kvmCreateVM)
	if err != nil {
		return false
	}
	unix.Close(vm)
	return true
}

// shq quotes s for bash.
func shq(s string) string {
	if s != "" && strings.IndexFunc(s, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_./=:,+@%", c))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func validName(n string) bool {
	if n == "" || n[0] >= '0' && n[0] <= '9' {
		return false
	}
	for _, c := range n {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// jobScript is the bash script that runs argv in the guest: the caller's
// environment (minus what describes the calling shell, this machine or the
// node), the working directory, the command.
func jobScript(prog string, argv []string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# written by %s\n", prog)
	for _, kv := range os.Environ() {
		name, val, ok := strings.Cut(kv, "=")
		if !ok || !validName(name) {
			continue
		}
		switch name {
		case "PWD", "OLDPWD", "SHLVL", "_", "HOSTNAME", "SHELLOPTS", "BASHOPTS", "PPID", "UID", "EUID",
			"GOVERBS_VM_NODE", "GOVERBS_VM_NODES", "GOVERBS_VM_BIN":
			continue
		}
		if strings.HasPrefix(name, "BASH_") {
			continue
		}
		fmt.Fprintf(&b, "export %s=%s\n", name, shq(val))
	}
	b.WriteString("export GOVERBS_VM_GUEST=1\n")
	// goverbs itself, for `goverbs vm exec`; last, so the caller's wins.
	b.WriteString("[[ -n ${GOVERBS_VM_BIN:-} ]] && export PATH=${PATH:+$PATH:}${GOVERBS_VM_BIN%/*}\n")
	wd, err := os.Getwd()
	if err != nil {
		wd = "/"
	}
	fmt.Fprintf(&b, "cd -- %s || { echo %s >&2; exit 125; }\n", shq(wd), shq(prog+": cannot enter "+wd+" in the guest"))
	b.WriteString("exec")
	for _, a := range argv {
		b.WriteString(" " + shq(a))
	}
	b.WriteString("\n")
	return b.Bytes()
}

// prepare writes the node's run share: init2, config, job, selftest and a
// copy of this binary (for `goverbs vm exec` in the guest).
func (nd *node) prepare(argv, shares []string, self string) error {
	r := nd.r
	if err := os.MkdirAll(filepath.Join(nd.dir, "bin"), 0o755); err != nil {
		return err
	}
	if err := writeGuestFile(nd.dir, "init2"); err != nil {
		return err
	}
	if nd.idx == 0 {
		if err := os.WriteFile(filepath.Join(nd.dir, "job"), jobScript(r.prog(), argv), 0o644); err != nil {
			return err
		}
		name := "selftest"
		if r.Nodes > 1 {
			name = "selftest-cluster"
		}
		if err := writeGuestFileAs(nd.dir, name, "selftest"); err != nil {
			return err
		}
	}
	if self != "" {
		dst := filepath.Join(nd.dir, "bin", "goverbs")
		if err := os.Link(self, dst); err != nil {
			if err := copyFile(self, dst, 0o755); err != nil {
				return err
			}
		}
	}
	var c bytes.Buffer
	mode := "single"
	if r.Nodes > 1 {
		mode = "cluster"
	}
	// HOST_T0: the host's clock as qemu starts, for the guest's check of
	// its own clock (init2's clock_check). GOVERBS_VM_TEST_BADCLOCK=1 (for
	// tests) puts it in the future, so every guest finds its clock fast.
	t0 := time.Now().Unix()
	if os.Getenv("GOVERBS_VM_TEST_BADCLOCK") == "1" {
		t0 += 3600
	}
	fmt.Fprintf(&c, "KVER=%s\nKMODDIR=%s\nTIMEOUT=%d\nMODE=%s\nNODE=%d\nNODES=%d\nDEVICES=%d\nHUGEPAGES=%d\nMTU=%d\nHOST_T0=%d\nSHARES=(",
		shq(r.kernel.version), shq(r.kernel.modDir), int(r.Timeout.Seconds()), mode, nd.idx, r.Nodes, r.Devices, r.hugePages(), r.MTU, t0)
	for i, d := range shares {
		fmt.Fprintf(&c, " %s", shq(fmt.Sprintf("rw%d=%s", i, d)))
	}
	c.WriteString(" )\n")
	return os.WriteFile(filepath.Join(nd.dir, "config"), c.Bytes(), 0o644)
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// qopt escapes a value inside a qemu option list: a comma is doubled (a
// --rw folder or $TMPDIR with a comma would otherwise end the value there
// and qemu refuse the rest as an unknown parameter).
func qopt(s string) string { return strings.ReplaceAll(s, ",", ",,") }

func (nd *node) args(shares []string) []string {
	r := nd.r
	cmdline := "console=ttyS0 quiet loglevel=4 edd=off panic=-1 oops=panic" +
		" i8042.noaux i8042.nokbd i8042.nopnp tsc=reliable no_timer_check" +
		" mitigations=off cryptomgr.notests rcupdate.rcu_expedited=1 " + os.Getenv("GOVERBS_VM_APPEND")
	a := []string{"-name", "goverbs-vm-node" + strconv.Itoa(nd.idx), "-nodefaults", "-no-user-config"}
	if r.accel == "kvm" {
		a = append(a, "-accel", "kvm", "-cpu", "host")
	} else {
		a = append(a, "-accel", "tcg,thread=multi", "-cpu", "max")
	}
	a = append(a, "-m", r.Mem, "-smp", strconv.Itoa(r.CPUs), "-no-reboot", "-display", "none", "-vga", "none")
	if exists("/usr/share/qemu/qboot.rom") {
		a = append(a, "-bios", "/usr/share/qemu/qboot.rom") // boots faster than SeaBIOS
	}
	a = append(a, "-kernel", r.kernel.vmlinux, "-initrd", r.initrd, "-append", cmdline,
		// fds 3, 4, 5: our stdout, stderr and console pipes.
		"-chardev", "file,id=con,path=/dev/fd/5", "-serial", "chardev:con",
		"-device", "virtio-serial-pci,id=vser")
	if nd.idx == 0 {
		a = append(a, "-chardev", "file,id=out,path=/dev/fd/3,append=on", "-chardev", "file,id=err,path=/dev/fd/4,append=on")
	} else {
		a = append(a, "-chardev", "null,id=out", "-chardev", "null,id=err")
	}
	a = append(a,
		"-device", "virtserialport,bus=vser.0,chardev=out,name=stdout",
		"-device", "virtserialport,bus=vser.0,chardev=err,name=stderr",
		"-fsdev", "local,id=root,path=/,security_model=none,readonly=on,multidevs=remap",
		"-device", "virtio-9p-pci,fsdev=root,mount_tag=root",
		"-fsdev", "local,id=run,path="+qopt(nd.dir)+",security_model=none",
		"-device", "virtio-9p-pci,fsdev=run,mount_tag=run")
	if r.Nodes > 1 {
		a = append(a, "-fsdev", "local,id=cluster,path="+qopt(r.clusDir)+",security_model=none",
			"-device", "virtio-9p-pci,fsdev=cluster,mount_tag=cluster")
		for d := 0; d < r.Devices; d++ {
			guest, sw := r.sw.paths(nd.idx, d)
			id := fmt.Sprintf("n%d", d)
			a = append(a,
				"-netdev", fmt.Sprintf("dgram,id=%s,local.type=unix,local.path=%s,remote.type=unix,remote.path=%s", id, qopt(guest), qopt(sw)),
				"-device", fmt.Sprintf("virtio-net-pci,netdev=%s,mac=52:54:00:77:%02x:%02x,romfile=", id, d, nd.idx))
		}
	}
	for i, d := range shares {
		a = append(a, "-fsdev", fmt.Sprintf("local,id=rw%d,path=%s,security_model=none,multidevs=remap", i, qopt(d)),
			"-device", fmt.Sprintf("virtio-9p-pci,fsdev=rw%d,mount_tag=rw%d", i, i))
	}
	return a
}

// start launches the node's qemu. Its stdout/stderr ports reach ours
// through pipes (qemu reopens /dev/fd/N: a pipe is right where a regular
// file would get a second file offset); the console is copied to
// console.log (and with --verbose to our stderr).
func (nd *node) start(qemu string, shares []string) error {
	r := nd.r
	var files []*os.File // fds 3, 4, 5 in qemu
	var closeAfter []*os.File
	// Ours once qemu has them, and on every early return too: a pipe left
	// open would keep its relay, and so wait() and the cleanup, waiting.
	defer func() {
		for _, f := range closeAfter {
			f.Close()
		}
	}()
	pipeTo := func(w io.Writer, prefix string, logf *os.File) error {
		pr, pw, err := os.Pipe()
		if err != nil {
			return err
		}
		files = append(files, pw)
		closeAfter = append(closeAfter, pw)
		nd.relays.Add(1)
		go func() {
			defer nd.relays.Done()
			defer pr.Close()
			if logf == nil {
				io.Copy(w, pr)
				return
			}
			defer logf.Close()
			sc := bufio.NewReader(pr)
			for {
				line, err := sc.ReadString('\n')
				if line != "" {
					logf.WriteString(line)
					if w != nil {
						io.WriteString(w, prefix+strings.TrimRight(line, "\r\n")+"\n")
					}
				}
				if err != nil {
					return
				}
			}
		}()
		return nil
	}
	if nd.idx == 0 {
		if err := pipeTo(r.Stdout, "", nil); err != nil {
			return err
		}
		if err := pipeTo(r.Stderr, "", nil); err != nil {
			return err
		}
	} else {
		null, err := os.Open(os.DevNull)
		if err != nil {
			return err
		}
		files = append(files, null, null)
		closeAfter = append(closeAfter, null)
	}
	con, err := os.Create(filepath.Join(nd.dir, "console.log"))
	if err != nil {
		return err
	}
	var conW io.Writer
	if r.Verbose {
		conW = r.Stderr
	}
	if err := pipeTo(conW, fmt.Sprintf("[node%d console] ", nd.idx), con); err != nil {
		con.Close()
		return err
	}
	qlog, err := os.Create(filepath.Join(nd.dir, "qemu.log"))
	if err != nil {
		return err
	}
	closeAfter = append(closeAfter, qlog)
	cmd := exec.Command(qemu, nd.args(shares)...)
	cmd.Stdout, cmd.Stderr = qlog, qlog
	cmd.ExtraFiles = files
	// Own process group: a terminal's Ctrl-C reaches us, and we stop the
	// guests. Pdeathsig: if we are SIGKILLed, qemu goes too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	nd.cmd = cmd
	// Pdeathsig fires when the thread that forked qemu exits: start and
	// wait on one locked thread, which outlives qemu.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits after qemu
		if err := cmd.Start(); err != nil {
			errc <- err
			return
		}
		errc <- nil
		cmd.Wait()
		close(nd.exited)
	}()
	if err = <-errc; err != nil {
		nd.cmd = nil
		return err
	}
	return nil
}
