package mr

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// hugeInfo is what /proc/meminfo says about the default huge pages.
type hugeInfo struct {
	total, free int // pages
	size        int // bytes per page
}

func readHugeInfo(t *testing.T) hugeInfo {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Skipf("no /proc/meminfo: %v", err)
	}
	defer f.Close()
	var h hugeInfo
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.Atoi(f[0])
		switch k {
		case "HugePages_Total":
			h.total = n
		case "HugePages_Free":
			h.free = n
		case "Hugepagesize":
			h.size = n << 10 // kB
		}
	}
	return h
}

// kernelPageSize returns the page size backing the mapping that holds
// addr, from /proc/self/smaps (hugetlb mappings say 2048 kB).
func kernelPageSize(t *testing.T, addr uintptr) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatalf("smaps: %v", err)
	}
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if lo, hi, ok := strings.Cut(f[0], "-"); ok && !strings.HasSuffix(f[0], ":") {
			a, err1 := strconv.ParseUint(lo, 16, 64)
			z, err2 := strconv.ParseUint(hi, 16, 64)
			in = err1 == nil && err2 == nil && uint64(addr) >= a && uint64(addr) < z
			continue
		}
		if in && f[0] == "KernelPageSize:" && len(f) > 1 {
			n, _ := strconv.Atoi(f[1])
			return n << 10
		}
	}
	t.Fatalf("no mapping holds %#x in /proc/self/smaps", addr)
	return 0
}

// TestAllocHugePages checks that Alloc of a multiple of 2 MiB, and the
// allocator's regions, really sit on huge pages when the system has enough
// of them free, and on plain pages (still 2 MiB-aligned) when it has none:
// `goverbs vm` guests reserve 64 unless booted with --hugepages 0
// (GOVERBS_VM_HUGEPAGES=0); most machines reserve none.
func TestAllocHugePages(t *testing.T) {
	h := readHugeInfo(t)
	t.Logf("huge pages: %d reserved, %d free, %d KiB each", h.total, h.free, h.size>>10)
	const size = 2 * hugePage
	var wantHuge bool
	switch {
	case h.size == hugePage && h.free >= size/hugePage: // 2 pages, then 1 per region
		wantHuge = true
	case h.free == 0:
		wantHuge = false
	default:
		t.Skipf("%d huge pages of %d KiB free: neither enough for the test nor none", h.free, h.size>>10)
	}
	check := func(what string, m *Memory, align int) {
		t.Helper()
		b := m.Bytes()
		addr := uintptr(unsafe.Pointer(&b[0]))
		ps := kernelPageSize(t, addr)
		t.Logf("%s: %d bytes at %#x, Huge %v, kernel page size %d KiB", what, len(b), addr, m.Huge(), ps>>10)
		if addr%uintptr(align) != 0 {
			t.Errorf("%s at %#x: not aligned to %d KiB", what, addr, align>>10)
		}
		if wantHuge {
			if !m.Huge() || ps != hugePage {
				t.Errorf("%s: Huge %v, kernel page size %d KiB, with %d huge pages free: want huge pages", what, m.Huge(), ps>>10, h.free)
			}
		} else if m.Huge() || ps == hugePage {
			t.Errorf("%s: Huge %v, kernel page size %d KiB, with no huge pages: want plain pages", what, m.Huge(), ps>>10)
		}
		for i := range b { // every page is there and writable
			b[i] = byte(i)
		}
	}

	m, err := Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	check("Alloc(4 MiB)", m, hugePage)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if m.Bytes() != nil {
		t.Error("Bytes after Close")
	}

	// Not a multiple of 2 MiB: plain pages, 64 KiB-aligned, whatever the
	// system has.
	small, err := Alloc(100 << 10)
	if err != nil {
		t.Fatal(err)
	}
	b := small.Bytes()
	if addr := uintptr(unsafe.Pointer(&b[0])); small.Huge() || addr%granule != 0 || len(b) != 100<<10 {
		t.Errorf("Alloc(100 KiB): %d bytes at %#x, Huge %v: want 64 KiB-aligned plain pages", len(b), addr, small.Huge())
	}
	clear(b)
	small.Close()

	// The allocator's regions (2 MiB each here) likewise.
	a := newTestAllocator(t, AllocatorConfig{Classes: []int{64 << 10, 1 << 20}, RegionSize: 2 << 20, Limit: 4 << 20})
	x := mustAlloc(t, a, 1<<20)
	y := mustAlloc(t, a, 1<<20)
	z := mustAlloc(t, a, 64<<10) // the second region
	st := a.Stats()
	if st.Regions != 2 {
		t.Fatalf("%d regions, want 2", st.Regions)
	}
	for i, r := range a.all {
		check(fmt.Sprintf("allocator region %d", i), r.mem, hugePage)
	}
	if want := map[bool]int{true: st.Regions, false: 0}[wantHuge]; st.HugeRegions != want {
		t.Errorf("Stats: %d of %d regions huge, want %d", st.HugeRegions, st.Regions, want)
	}
	for _, b := range []Buf{x, y, z} {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
}
