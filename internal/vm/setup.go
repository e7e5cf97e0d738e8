package vm

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// The guest's init scripts (see their headers).
//
//go:embed guest/init1 guest/init2 guest/selftest guest/selftest-cluster
var guestFS embed.FS

// GuestFile returns an embedded guest script.
func GuestFile(name string) []byte {
	b, err := guestFS.ReadFile("guest/" + name)
	if err != nil {
		panic(err)
	}
	return b
}

func writeGuestFile(dir, name string) error { return writeGuestFileAs(dir, name, name) }

func writeGuestFileAs(dir, name, as string) error {
	return os.WriteFile(filepath.Join(dir, as), GuestFile(name), 0o755)
}

// cacheDir: GOVERBS_VM_CACHE, else /var/cache/goverbs-vm for root, else
// $XDG_CACHE_HOME/goverbs-vm (~/.cache/goverbs-vm).
func cacheDir() (string, error) {
	c := os.Getenv("GOVERBS_VM_CACHE")
	if c == "" {
		if os.Geteuid() == 0 {
			c = "/var/cache/goverbs-vm"
		} else {
			uc, err := os.UserCacheDir()
			if err != nil {
				return "", err
			}
			c = filepath.Join(uc, "goverbs-vm")
		}
	}
	return c, os.MkdirAll(filepath.Join(c, "kernel"), 0o755)
}

// Host packages (Debian names): qemu and its qboot firmware, a static
// busybox for stage 1, and what the guest runs from the shared host root
// (rdma, ip, modprobe, the verbs provider for rxe, test tools).
var debDeps = []string{"qemu-system-x86", "busybox-static", "rdma-core", "ibverbs-providers", "ibverbs-utils",
	"perftest", "rdmacm-utils", "iproute2", "kmod", "xz-utils", "coreutils", "util-linux"}

// Commands the guest cannot do without (found on the host: the guest sees
// the host's /).
var essentials = map[string]string{"bash": "bash", "ip": "iproute2", "rdma": "iproute2", "modprobe": "kmod", "timeout": "coreutils"}

func (r *runner) logFile() *os.File {
	f, err := os.OpenFile(filepath.Join(r.cache, "setup.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil
	}
	return f
}

// setupFail reports a setup failure with the end of setup.log.
func (r *runner) setupFail(format string, a ...any) error {
	msg := fmt.Sprintf(format, a...)
	b, _ := os.ReadFile(filepath.Join(r.cache, "setup.log"))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return fail(ExitGuest, "setup failed: %s; from %s:\n%s", msg, filepath.Join(r.cache, "setup.log"), strings.Join(lines, "\n"))
}

// sh runs a setup command with its output going to setup.log.
func (r *runner) sh(dir string, name string, args ...string) error {
	path := findCmd(name)
	if path == "" {
		path = name
	}
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	if f := r.logFile(); f != nil {
		defer f.Close()
		fmt.Fprintf(f, "+ %s %s\n", name, strings.Join(args, " "))
		cmd.Stdout, cmd.Stderr = f, f
	}
	return cmd.Run()
}

// aptGet waits for a concurrent apt/dpkg instead of failing.
func (r *runner) aptGet(dir string, args ...string) error {
	var err error
	for try := 0; try < 10; try++ {
		err = r.sh(dir, "apt-get", append([]string{"-q", "-o", "DPkg::Lock::Timeout=600"}, args...)...)
		if err == nil || args[0] != "update" { // the lists lock may not honour the timeout
			return err
		}
		time.Sleep(5 * time.Second)
	}
	return err
}

func haveCmd(c string) bool { return findCmd(c) != "" }

// findCmd looks c up in PATH and then in the sbin folders a non-root PATH
// often lacks (the guest's init2 has them all).
func findCmd(c string) string {
	if p, err := exec.LookPath(c); err == nil {
		return p
	}
	for _, d := range []string{"/usr/local/sbin", "/usr/sbin", "/sbin"} {
		if p, err := exec.LookPath(filepath.Join(d, c)); err == nil {
			return p
		}
	}
	return ""
}

// ensureDeps installs missing Debian packages (as root, once), or says
// exactly what is missing.
func (r *runner) ensureDeps() error {
	if haveCmd("dpkg-query") && haveCmd("apt-get") {
		out, _ := exec.Command("dpkg-query", append([]string{"-W", "-f=${Package} ${db:Status-Status}\n"}, debDeps...)...).Output()
		inst := map[string]bool{}
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[1] == "installed" {
				inst[f[0]] = true
			}
		}
		var missing []string
		for _, d := range debDeps {
			if !inst[d] {
				missing = append(missing, d)
			}
		}
		if len(missing) > 0 {
			if os.Geteuid() != 0 {
				// Only what is really needed is fatal without root.
				if err := r.checkEssentials(); err != nil {
					return fail(ExitGuest, "%v\nmissing packages: run once as root, or: sudo apt-get install %s", err, strings.Join(missing, " "))
				}
			} else {
				r.say("installing %s", strings.Join(missing, " "))
				if err := r.aptGet("", "update"); err != nil {
					return r.setupFail("apt-get update")
				}
				install := append([]string{"install", "-y", "--no-install-recommends"}, debDeps...)
				if err := r.aptGet("", install...); err != nil {
					// An install killed half-way (Ctrl-C on a first
					// run) leaves dpkg "interrupted": every later
					// apt-get install refuses until this runs.
					if r.sh("", "dpkg", "--configure", "-a") != nil || r.aptGet("", install...) != nil {
						return r.setupFail("apt-get install %s", strings.Join(debDeps, " "))
					}
				}
			}
		}
	}
	return r.checkEssentials()
}

func (r *runner) checkEssentials() error {
	var miss []string
	for _, c := range []string{"bash", "ip", "rdma", "modprobe", "timeout"} {
		if !haveCmd(c) {
			miss = append(miss, fmt.Sprintf("%s (package %s)", c, essentials[c]))
		}
	}
	if _, err := busybox(); err != nil {
		miss = append(miss, err.Error())
	}
	if len(miss) > 0 {
		return fail(ExitGuest, "missing on the host (the guest runs the host's binaries): %s", strings.Join(miss, ", "))
	}
	_, err := qemuPath()
	return err
}

// busybox finds a statically linked busybox for the initramfs
// (GOVERBS_VM_BUSYBOX overrides).
func busybox() (string, error) {
	cands := []string{os.Getenv("GOVERBS_VM_BUSYBOX"), "/bin/busybox", "/usr/bin/busybox", "/sbin/busybox"}
	if p, err := exec.LookPath("busybox"); err == nil {
		cands = append(cands, p)
	}
	for _, c := range cands {
		if c == "" {
			continue
		}
		f, err := elf.Open(c)
		if err != nil {
			continue
		}
		static := true
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				static = false
			}
		}
		f.Close()
		if static {
			return c, nil
		}
	}
	return "", fmt.Errorf("a static busybox (package busybox-static; or set GOVERBS_VM_BUSYBOX)")
}

// kernel is a guest kernel ready to boot.
type kernel struct {
	dir     string // cache folder: vmlinux, initrd-*.cpio
	vmlinux string
	version string
	modDir  string // .../lib/modules/VERSION with modules.dep
	modRoot string // modDir minus lib/modules/VERSION
}

// setup installs dependencies, gets the kernel and builds the initramfs,
// all cached; parallel first runs are serialised with a lock.
func (r *runner) setup() error {
	bb, err := busybox()
	if err == nil {
		// Fast path without the lock: everything is renamed into place last.
		if k, err := r.cachedKernel(); err == nil && k != nil {
			if id, err := initrdID(bb); err == nil {
				p := filepath.Join(k.dir, "initrd-"+id+".cpio")
				if exists(p) {
					r.kernel, r.initrd = k, p
					if err := r.checkEssentials(); err != nil {
						return err
					}
					return nil
				}
			}
		}
	}
	lock, err := os.OpenFile(filepath.Join(r.cache, "lock"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fail(ExitGuest, "%v", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fail(ExitGuest, "lock %s: %v", lock.Name(), err)
	}
	removeStale(r.cache)
	if err := r.ensureDeps(); err != nil {
		return err
	}
	if bb, err = busybox(); err != nil {
		return fail(ExitGuest, "missing %v", err)
	}
	k, err := r.cachedKernel()
	if err != nil {
		return err
	}
	if k == nil {
		if k, err = r.fetchKernel(); err != nil {
			return err
		}
	}
	id, err := initrdID(bb)
	if err != nil {
		return fail(ExitGuest, "%v", err)
	}
	p := filepath.Join(k.dir, "initrd-"+id+".cpio")
	if !exists(p) {
		if err := r.buildInitrd(k, bb, p); err != nil {
			return err
		}
	}
	r.kernel, r.initrd = k, p
	return nil
}

// removeStale deletes what an interrupted setup left half-written (a
// killed run's kernel download or unpack, hundreds of MB each time: its
// deferred RemoveAll never ran). Only with the setup lock held: only its
// holder writes these.
func removeStale(cache string) {
	for _, pat := range []string{filepath.Join(cache, "kernel", ".tmp.*"), filepath.Join(cache, "kernel", "*", "initrd-*.cpio.tmp")} {
		m, _ := filepath.Glob(pat)
		for _, p := range m {
			os.RemoveAll(p)
		}
	}
}

// cachedKernel returns the kernel if it is in the cache (nil if not).
func (r *runner) cachedKernel() (*kernel, error) {
	if r.Kernel == "" || r.Kernel == "debian" {
		if r.Refresh {
			return nil, nil
		}
		dir, err := filepath.EvalSymlinks(filepath.Join(r.cache, "current"))
		if err != nil || !exists(filepath.Join(dir, "ok")) {
			return nil, nil
		}
		return loadKernel(dir)
	}
	dir, err := r.localKernelDir()
	if err != nil {
		return nil, err
	}
	if !exists(filepath.Join(dir, "ok")) {
		return nil, nil
	}
	return loadKernel(dir)
}

func loadKernel(dir string) (*kernel, error) {
	v, err := os.ReadFile(filepath.Join(dir, "version"))
	if err != nil {
		return nil, err
	}
	k := &kernel{dir: dir, vmlinux: filepath.Join(dir, "vmlinux"), version: strings.TrimSpace(string(v))}
	if m, err := os.ReadFile(filepath.Join(dir, "moddir")); err == nil {
		k.modDir = strings.TrimSpace(string(m))
	} else {
		k.modDir = filepath.Join(dir, "root", "lib", "modules", k.version)
	}
	k.modRoot = strings.TrimSuffix(k.modDir, filepath.Join("/lib/modules", k.version))
	if k.modRoot == "" {
		k.modRoot = "/"
	}
	return k, nil
}

// localKernelDir is the cache folder of a --kernel PATH: named by a hash
// of its path, size and mtime.
func (r *runner) localKernelDir() (string, error) {
	abs, err := filepath.Abs(r.Kernel)
	if err != nil {
		return "", err
	}
	st, err := os.Stat(abs)
	if err != nil {
		return "", fail(ExitUsage, "--kernel %s: %v\n--kernel wants a linux-image .deb, a folder holding boot/vmlinuz-VERSION and lib/modules/VERSION "+
			"(e.g. an unpacked package), or a vmlinuz whose modules are in /lib/modules/VERSION; omit it to use Debian's linux-image-amd64", r.Kernel, err)
	}
	h := sha256.Sum256([]byte(fmt.Sprintf("%s %d %d", abs, st.Size(), st.ModTime().UnixNano())))
	return filepath.Join(r.cache, "kernel", "local-"+hex.EncodeToString(h[:8])), nil
}

// fetchKernel fills the cache: the Debian package (apt-get download), a
// given .deb, or a local kernel tree.
func (r *runner) fetchKernel() (*kernel, error) {
	tmp, err := os.MkdirTemp(filepath.Join(r.cache, "kernel"), ".tmp.")
	if err != nil {
		return nil, fail(ExitGuest, "%v", err)
	}
	defer os.RemoveAll(tmp)
	os.Chmod(tmp, 0o755) // so apt's _apt user may write there
	var final, vmlinuz, version, modDir string
	debian := r.Kernel == "" || r.Kernel == "debian"
	deb := ""
	if debian {
		if !haveCmd("apt-cache") {
			return nil, fail(ExitGuest, "no guest kernel: this host has no apt to fetch Debian's linux-image-amd64; pass --kernel PATH "+
				"(a linux-image .deb, or a folder with boot/vmlinuz-VERSION and lib/modules/VERSION)")
		}
		pkg := r.resolveDebian()
		if pkg == "" {
			if err := r.aptGet("", "update"); err != nil {
				return nil, r.setupFail("apt-get update")
			}
			if pkg = r.resolveDebian(); pkg == "" {
				return nil, r.setupFail("cannot resolve linux-image-amd64 with apt-cache depends")
			}
		}
		version = strings.TrimPrefix(pkg, "linux-image-")
		final = filepath.Join(r.cache, "kernel", version)
		if exists(filepath.Join(final, "ok")) { // --refresh found nothing new
			return r.makeCurrent(final)
		}
		r.say("fetching %s (one time)", pkg)
		if err := r.aptGet(tmp, "-o", "APT::Sandbox::User=root", "download", pkg); err != nil {
			// Package lists older than the archive name a .deb that is
			// gone (Debian keeps only the current ABI): update, resolve
			// again, retry once.
			if r.aptGet("", "update") != nil {
				return nil, r.setupFail("apt-get download %s (and apt-get update failed)", pkg)
			}
			if p := r.resolveDebian(); p != "" && p != pkg {
				pkg = p
				version = strings.TrimPrefix(pkg, "linux-image-")
				final = filepath.Join(r.cache, "kernel", version)
				if exists(filepath.Join(final, "ok")) {
					return r.makeCurrent(final)
				}
			}
			if err := r.aptGet(tmp, "-o", "APT::Sandbox::User=root", "download", pkg); err != nil {
				return nil, r.setupFail("apt-get download %s (after apt-get update)", pkg)
			}
		}
		debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
		if len(debs) != 1 {
			return nil, r.setupFail("apt-get download %s gave %d files", pkg, len(debs))
		}
		deb = debs[0]
	} else {
		if final, err = r.localKernelDir(); err != nil {
			return nil, err
		}
		if strings.HasSuffix(r.Kernel, ".deb") {
			deb = r.Kernel
		}
	}
	if deb != "" {
		root := filepath.Join(tmp, "root")
		if err := r.sh("", "dpkg-deb", "-x", deb, root); err != nil {
			return nil, r.setupFail("dpkg-deb -x %s", deb)
		}
		if strings.HasPrefix(deb, tmp) {
			os.Remove(deb)
		}
		vmlinuz, version, _, err = findKernelTree(root)
		if err != nil {
			return nil, fail(ExitGuest, "%s: %v", deb, err)
		}
		// Record the final path of the modules.
		modDir = filepath.Join(final, "root", "lib", "modules", version)
		if !exists(filepath.Join(root, "lib", "modules", version, "modules.dep")) {
			if err := r.sh("", "depmod", "-b", root, version); err != nil { // the .deb ships no modules.dep
				return nil, r.setupFail("depmod -b %s %s", root, version)
			}
		}
	} else {
		st, _ := os.Stat(r.Kernel)
		if st.IsDir() {
			vmlinuz, version, modDir, err = findKernelTree(r.Kernel)
		} else {
			vmlinuz, version, modDir, err = findModules(r.Kernel)
		}
		if err != nil {
			return nil, fail(ExitUsage, "--kernel %s: %v", r.Kernel, err)
		}
		if modDir, err = filepath.Abs(modDir); err != nil {
			return nil, err
		}
		if !exists(filepath.Join(modDir, "modules.dep")) {
			return nil, fail(ExitUsage, "--kernel %s: %s has no modules.dep (run depmod -b ROOT %s)", r.Kernel, modDir, version)
		}
	}
	if err := r.extractVmlinux(vmlinuz, filepath.Join(tmp, "vmlinux")); err != nil {
		return nil, err
	}
	// "ok" last, and only if the rest is whole: the fast path trusts it.
	for _, f := range []struct{ name, data string }{{"version", version + "\n"}, {"moddir", modDir + "\n"}, {"ok", ""}} {
		if err := os.WriteFile(filepath.Join(tmp, f.name), []byte(f.data), 0o644); err != nil {
			return nil, fail(ExitGuest, "kernel cache: %v", err)
		}
	}
	os.RemoveAll(final)
	if err := os.Rename(tmp, final); err != nil {
		return nil, fail(ExitGuest, "%v", err)
	}
	if debian {
		return r.makeCurrent(final)
	}
	return loadKernel(final)
}

func (r *runner) makeCurrent(final string) (*kernel, error) {
	cur := filepath.Join(r.cache, "current")
	os.Remove(cur + ".tmp")
	if err := os.Symlink(filepath.Join("kernel", filepath.Base(final)), cur+".tmp"); err != nil {
		return nil, fail(ExitGuest, "%v", err)
	}
	if err := os.Rename(cur+".tmp", cur); err != nil {
		return nil, fail(ExitGuest, "%v", err)
	}
	return loadKernel(final)
}

func (r *runner) resolveDebian() string {
	out, _ := exec.Command("apt-cache", "depends", "linux-image-amd64").Output()
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") &&
			len(f[1]) > 12 && f[1][12] >= '0' && f[1][12] <= '9' {
			return f[1]
		}
	}
	return ""
}

// findKernelTree finds boot/vmlinuz-V and lib/modules/V under root.
func findKernelTree(root string) (vmlinuz, version, modDir string, err error) {
	zs, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	sort.Strings(zs)
	for i := len(zs) - 1; i >= 0; i-- {
		v := strings.TrimPrefix(filepath.Base(zs[i]), "vmlinuz-")
		m := filepath.Join(root, "lib", "modules", v)
		if st, err := os.Stat(m); err == nil && st.IsDir() {
			return zs[i], v, m, nil
		}
	}
	return "", "", "", fmt.Errorf("no boot/vmlinuz-VERSION with a matching lib/modules/VERSION in %s", root)
}

// findModules: a vmlinuz file; its version comes from the bzImage header,
// its modules from ../lib/modules/V next to it or /lib/modules/V.
func findModules(vmlinuz string) (string, string, string, error) {
	v, err := bzImageVersion(vmlinuz)
	if err != nil {
		return "", "", "", err
	}
	abs, _ := filepath.Abs(vmlinuz)
	for _, m := range []string{filepath.Join(filepath.Dir(abs), "..", "lib", "modules", v), filepath.Join("/lib/modules", v)} {
		if st, err := os.Stat(m); err == nil && st.IsDir() {
			m, _ = filepath.EvalSymlinks(m)
			return vmlinuz, v, m, nil
		}
	}
	return "", "", "", fmt.Errorf("kernel %s: no modules folder (looked for ../lib/modules/%s and /lib/modules/%s); "+
		"pass a folder holding boot/vmlinuz-%s and lib/modules/%s", v, v, v, v, v)
}

// bzImageVersion reads the kernel_version string of an x86 bzImage.
func bzImageVersion(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	hdr := make([]byte, 0x210)
	if _, err := io.ReadFull(f, hdr); err != nil || string(hdr[0x202:0x206]) != "HdrS" {
		return "", fmt.Errorf("%s is not an x86 bzImage (vmlinuz)", p)
	}
	off := int64(binary.LittleEndian.Uint16(hdr[0x20e:])) + 0x200
	buf := make([]byte, 256)
	n, _ := f.ReadAt(buf, off)
	s := string(buf[:n])
	if i := strings.IndexAny(s, " \x00"); i > 0 {
		return s[:i], nil
	}
	return "", fmt.Errorf("%s: no kernel version in its header", p)
}

// extractVmlinux writes the uncompressed ELF kernel (decompressing bzImage
// under TCG costs ~3 s), or the vmlinuz itself if that fails.
func (r *runner) extractVmlinux(vmlinuz, out string) error {
	b, err := os.ReadFile(vmlinuz)
	if err != nil {
		return fail(ExitGuest, "%v", err)
	}
	if bytes.HasPrefix(b, []byte("\x7fELF")) {
		return os.WriteFile(out, b, 0o644)
	}
	if i := bytes.Index(b, []byte("\xfd7zXZ\x00")); i >= 0 && haveCmd("xz") {
		f, err := os.Create(out)
		if err == nil {
			cmd := exec.Command("xz", "-dc", "--single-stream")
			cmd.Stdin, cmd.Stdout = bytes.NewReader(b[i:]), f
			err = cmd.Run()
			f.Close()
			if err == nil {
				if h, _ := os.ReadFile(out); bytes.HasPrefix(h, []byte("\x7fELF")) {
					return nil
				}
			}
		}
	}
	if f := r.logFile(); f != nil {
		fmt.Fprintf(f, "could not extract vmlinux from %s, booting the compressed image\n", vmlinuz)
		f.Close()
	}
	return os.WriteFile(out, b, 0o644)
}

// stage1Modules: what stage 1 must load before it can mount anything.
var stage1Modules = []string{"virtio_pci", "9pnet_virtio", "9p", "overlay"}

// initrdID names the initramfs by a hash of what goes into it, so a new
// init1 or busybox rebuilds it.
func initrdID(bb string) (string, error) {
	h := sha256.New()
	h.Write(GuestFile("init1"))
	f, err := os.Open(bb)
	if err != nil {
		return "", err
	}
	defer f.Close()
	io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// buildInitrd writes the stage-1 initramfs (uncompressed newc: faster
// under TCG): busybox, init1, the modules stage 1 needs (decompressed:
// busybox insmod cannot read .ko.xz) and their load order.
func (r *runner) buildInitrd(k *kernel, bb, out string) error {
	var order []string
	mods := map[string][]byte{}
	for _, m := range stage1Modules {
		o, err := exec.Command(findCmd("modprobe"), "-d", k.modRoot, "-S", k.version, "--show-depends", m).Output()
		if err != nil {
			return fail(ExitGuest, "modprobe -d %s -S %s --show-depends %s: %v", k.modRoot, k.version, m, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(o))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 2 || f[0] != "insmod" { // "builtin X" needs nothing
				continue
			}
			name := filepath.Base(f[1])
			name = name[:strings.Index(name, ".ko")] + ".ko"
			if _, ok := mods[name]; ok {
				continue
			}
			var data []byte
			switch {
			case strings.HasSuffix(f[1], ".ko.xz"):
				data, err = exec.Command("xz", "-dc", f[1]).Output()
			case strings.HasSuffix(f[1], ".ko.zst"):
				data, err = exec.Command("zstd", "-qdc", f[1]).Output()
			case strings.HasSuffix(f[1], ".ko.gz"):
				data, err = exec.Command("gzip", "-dc", f[1]).Output()
			default:
				data, err = os.ReadFile(f[1])
			}
			if err != nil {
				return fail(ExitGuest, "decompressing %s: %v", f[1], err)
			}
			mods[name] = data
			order = append(order, name)
		}
	}
	bbData, err := os.ReadFile(bb)
	if err != nil {
		return fail(ExitGuest, "%v", err)
	}
	var c cpioWriter
	for _, d := range []string{"bin", "dev", "proc", "sys", "modules"} {
		c.dir(d)
	}
	c.file("bin/busybox", 0o755, bbData)
	c.file("init", 0o755, GuestFile("init1"))
	for _, m := range order {
		c.file("modules/"+m, 0o644, mods[m])
	}
	c.file("modules/order", 0o644, []byte(strings.Join(order, "\n")+"\n"))
	c.trailer()
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, c.Bytes(), 0o644); err != nil {
		return fail(ExitGuest, "%v", err)
	}
	return os.Rename(tmp, out)
}

// cpioWriter writes the "newc" format the kernel unpacks.
type cpioWriter struct {
	bytes.Buffer
	ino int
}

func (c *cpioWriter) entry(name string, mode uint32, data []byte) {
	c.ino++
	nlink := 1
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	fmt.Fprintf(&c.Buffer, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	c.WriteString(name)
	c.WriteByte(0)
	c.pad()
	c.Write(data)
	c.pad()
}

func (c *cpioWriter) pad() {
	for c.Len()%4 != 0 {
		c.WriteByte(0)
	}
}

func (c *cpioWriter) dir(name string) { c.entry(name, 0o040755, nil) }

func (c *cpioWriter) file(name string, perm uint32, data []byte) { c.entry(name, 0o100000|perm, data) }

func (c *cpioWriter) trailer() { c.entry("TRAILER!!!", 0, nil) }
