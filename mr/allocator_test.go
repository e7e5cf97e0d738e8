package mr

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/goverbs/goverbs"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/uverbs"
)

// testPD returns a PD on a real device, or nil (with the fake registrar)
// when there is none and GOVERBS_RXE=required is not set: the allocator's
// bookkeeping is then still tested on the host, with made-up keys.
func testPD(t testing.TB) *uverbs.PD {
	t.Helper()
	names := rxetest.Active(t)
	if len(names) == 0 {
		if rxetest.Required() {
			t.Fatal("GOVERBS_RXE=required but there is no ACTIVE RDMA device")
		}
		return nil
	}
	ctx := rxetest.Open(t, names[0])
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pd.Close() })
	return pd
}

var fakeKey uint32

func fakeRegister(_ *uverbs.PD, b []byte, _ Access) (uint32, uint32, func() error, error) {
	k := atomicAddKey()
	return k, k | 0x8000_0000, func() error { return nil }, nil
}

var keyMu sync.Mutex

func atomicAddKey() uint32 {
	keyMu.Lock()
	defer keyMu.Unlock()
	fakeKey++
	return fakeKey
}

// newTestAllocator returns an allocator on a real device if there is one,
// closed (and checked to have nothing in use) when the test ends.
func newTestAllocator(t testing.TB, cfg AllocatorConfig) *Allocator {
	t.Helper()
	pd := testPD(t)
	var a *Allocator
	var err error
	if pd != nil {
		a, err = NewAllocator(pd, cfg)
	} else {
		a, err = newAllocator(nil, cfg, fakeRegister)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return a
}

func mustAlloc(t testing.TB, a *Allocator, n int) Buf {
	t.Helper()
	b, err := a.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkInRegion checks that b lies inside one registered region and carries
// its keys.
func checkInRegion(t testing.TB, a *Allocator, b Buf) {
	t.Helper()
	for _, r := range *a.regions.Load() {
		if b.Addr() >= r.base && b.Addr()+uint64(b.Cap()) <= r.base+uint64(len(r.buf)) {
			if b.LKey() != r.lkey || b.RKey() != r.rkey {
				t.Fatalf("buffer at %#x: keys %#x/%#x, region's %#x/%#x", b.Addr(), b.LKey(), b.RKey(), r.lkey, r.rkey)
			}
			return
		}
	}
	t.Fatalf("buffer at %#x (+%d) is in no registered region", b.Addr(), b.Cap())
}

func checkStats(t testing.TB, a *Allocator) AllocatorStats {
	t.Helper()
	st := a.Stats()
	var inUse int64
	for _, c := range st.Classes {
		if c.InUse != int64(c.Allocs-c.Frees) || c.Free != c.Carved-c.InUse || c.InUse < 0 || c.Free < 0 {
			t.Fatalf("class %d inconsistent: %+v", c.Size, c)
		}
		inUse += c.InUse
	}
	if inUse != st.InUse || st.InUse != int64(st.Allocs-st.Frees) || st.Carved > st.Registered || st.Registered > st.Limit {
		t.Fatalf("inconsistent stats: %+v", st)
	}
	return st
}

func TestAllocatorConfigErrors(t *testing.T) {
	for _, c := range []struct {
		cfg  AllocatorConfig
		want string
	}{
		{AllocatorConfig{Classes: []int{}}, "0 size classes"},
		{AllocatorConfig{Classes: []int{100}}, "not a positive multiple of 64"},
		{AllocatorConfig{Classes: []int{128, 64}}, "not ascending"},
		{AllocatorConfig{Classes: []int{64 << 20}}, "larger than the 32 MiB region size"},
		{AllocatorConfig{RegionSize: 1000}, "region size 1000"},
		{AllocatorConfig{Limit: 1 << 40}, "limit"},
		{AllocatorConfig{Access: RemoteWrite}, "need LocalWrite too"},
		{AllocatorConfig{Access: 1 << 20}, "unknown access"},
		{AllocatorConfig{Classes: []int{1 << 20}, RegionSize: 1 << 20, Limit: 512 << 10}, "does not fit the 512 KiB limit"},
	} {
		if _, err := newAllocator(nil, c.cfg, fakeRegister); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.cfg, err, c.want)
		}
	}
	if _, err := NewAllocator(nil, AllocatorConfig{}); err == nil {
		t.Error("nil PD accepted")
	}
	a, err := newAllocator(nil, AllocatorConfig{}, fakeRegister)
	if err != nil {
		t.Fatal(err)
	}
	cfg := a.Config()
	if len(cfg.Classes) != 15 || cfg.Classes[0] != 64 || cfg.Classes[14] != 1<<20 || cfg.RegionSize != 32<<20 ||
		cfg.Limit != 1<<30 || cfg.Access != LocalWrite || cfg.Shards&(cfg.Shards-1) != 0 || cfg.CacheSize != 64 {
		t.Errorf("defaults: %+v", cfg)
	}
}

func TestAllocatorClasses(t *testing.T) {
	a := newTestAllocator(t, AllocatorConfig{Limit: 64 << 20})
	sizes := a.Config().Classes
	var held []Buf
	check := func(n, class int) {
		t.Helper()
		b := mustAlloc(t, a, n)
		held = append(held, b)
		if b.Class() != class || b.Cap() != sizes[class] || b.Len() != n || len(b.Bytes()) != n || cap(b.Bytes()) != sizes[class] {
			t.Errorf("Alloc(%d): class %d cap %d len %d, want class %d cap %d", n, b.Class(), b.Cap(), b.Len(), class, sizes[class])
		}
		if b.Addr()%64 != 0 || (b.Cap() <= granule && b.Addr()%uint64(b.Cap()) != 0) {
			t.Errorf("Alloc(%d) at %#x: not aligned", n, b.Addr())
		}
		if g := b.SGE(n); g.Addr != b.Addr() || g.Length != uint32(n) || g.LKey != b.LKey() {
			t.Errorf("SGE(%d) = %+v", n, g)
		}
		checkInRegion(t, a, b)
	}
	check(0, 0)
	check(1, 0)
	for i, s := range sizes {
		check(s, i)
		check(s-1, i)
		if i+1 < len(sizes) {
			check(s+1, i+1)
		}
	}
	if _, err := a.Alloc(sizes[len(sizes)-1] + 1); !errors.Is(err, ErrTooLarge) {
		t.Errorf("above the largest class: %v", err)
	} else {
		t.Log(err)
	}
	if _, err := a.Alloc(-1); err == nil {
		t.Error("negative size accepted")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("SGE beyond cap did not panic")
			}
		}()
		held[0].SGE(held[0].Cap() + 1)
	}()
	for _, b := range held {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	checkStats(t, a)
}

func TestAllocatorNoOverlap(t *testing.T) {
	a := newTestAllocator(t, AllocatorConfig{RegionSize: 4 << 20, Limit: 64 << 20})
	rng := rand.New(rand.NewPCG(1, 2))
	var held []Buf
	for range 3000 {
		n := 1 << rng.IntN(17)
		n += rng.IntN(n)
		b := mustAlloc(t, a, n)
		fillSeed(b.Bytes()[:b.Cap()], byte(b.ID()))
		held = append(held, b)
	}
	slices.SortFunc(held, func(x, y Buf) int {
		if x.Addr() < y.Addr() {
			return -1
		}
		return 1
	})
	for i, b := range held {
		checkInRegion(t, a, b)
		if i > 0 && held[i-1].Addr()+uint64(held[i-1].Cap()) > b.Addr() {
			t.Fatalf("buffers overlap: %#x+%d and %#x", held[i-1].Addr(), held[i-1].Cap(), b.Addr())
		}
		want := make([]byte, b.Cap())
		fillSeed(want, byte(b.ID()))
		if !bytes.Equal(b.Bytes()[:b.Cap()], want) {
			t.Fatalf("buffer %d at %#x overwritten", b.ID(), b.Addr())
		}
	}
	st := checkStats(t, a)
	if st.InUse != 3000 {
		t.Errorf("in use %d, want 3000", st.InUse)
	}
	for _, b := range held {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	if st := checkStats(t, a); st.InUse != 0 || st.InUseBytes != 0 {
		t.Errorf("after freeing all: %+v", st)
	}
}

func fillSeed(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*13) ^ seed
	}
}

func TestAllocatorLookup(t *testing.T) {
	a := newTestAllocator(t, AllocatorConfig{Classes: []int{256, 4096, 1 << 20}, RegionSize: 2 << 20, Limit: 16 << 20})
	var held []Buf
	for _, n := range []int{10, 256, 3000, 4096, 1 << 20, 100, 700 << 10} {
		held = append(held, mustAlloc(t, a, n))
	}
	for _, b := range held {
		for _, addr := range []uint64{b.Addr(), b.Addr() + 1, b.Addr() + uint64(b.Cap()/2), b.Addr() + uint64(b.Cap()) - 1} {
			got, ok := a.Lookup(addr)
			if !ok || got != b {
				t.Errorf("Lookup(%#x) = %+v, %v; want %+v", addr, got, ok, b)
			}
		}
		if got, ok := a.FromHandle(b.Handle()); !ok || got != b {
			t.Errorf("FromHandle(%#x) = %+v, %v", b.Handle(), got, ok)
		}
		// The next byte is a free buffer, another class's chunk, or nothing.
		if got, ok := a.Lookup(b.Addr() + uint64(b.Cap())); ok && got.ID() == b.ID() {
			t.Errorf("Lookup past the end of %d found it", b.ID())
		}
	}
	rs := *a.regions.Load()
	for _, addr := range []uint64{0, 1, rs[0].base - 1, rs[len(rs)-1].base + uint64(len(rs[len(rs)-1].buf)), ^uint64(0)} {
		if got, ok := a.Lookup(addr); ok {
			t.Errorf("Lookup(%#x) outside every region found %+v", addr, got)
		}
	}
	// Carved but uncut space and free buffers are not found.
	last := rs[len(rs)-1]
	if last.used < len(last.buf) {
		if _, ok := a.Lookup(last.base + uint64(last.used)); ok {
			t.Error("Lookup of uncarved space found a buffer")
		}
	}
	b := held[0]
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Lookup(b.Addr()); ok {
		t.Error("Lookup found a freed buffer")
	}
	if _, ok := a.FromHandle(b.Handle()); ok {
		t.Error("FromHandle found a freed buffer")
	}
	if _, ok := a.FromHandle(^uint64(0)); ok {
		t.Error("FromHandle of garbage succeeded")
	}
	// A new allocation of the same slot has a new handle.
	b2 := mustAlloc(t, a, 10)
	if b2.ID() == b.ID() && b2.Handle() == b.Handle() {
		t.Error("reused slot kept its handle")
	}
	if _, ok := a.FromHandle(b.Handle()); ok && b2.ID() == b.ID() {
		t.Error("stale handle resolves to the new allocation")
	}
	for _, b := range append(held[1:], b2) {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
}

func TestAllocatorBadFree(t *testing.T) {
	a := newTestAllocator(t, AllocatorConfig{Classes: []int{64, 4096}, RegionSize: 1 << 20, Limit: 4 << 20})
	other := newTestAllocator(t, AllocatorConfig{Classes: []int{64, 4096}, RegionSize: 1 << 20, Limit: 4 << 20})
	b := mustAlloc(t, a, 64)
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	err := a.Free(b)
	if !errors.Is(err, ErrDoubleFree) {
		t.Fatalf("double free: %v", err)
	}
	t.Log(err)
	// Cycle until the slot comes back: the stale Buf must not free it.
	var again Buf
	var tmp []Buf
	for {
		again = mustAlloc(t, a, 64)
		if again.ID() == b.ID() {
			break
		}
		tmp = append(tmp, again)
	}
	if err := a.Free(b); !errors.Is(err, ErrDoubleFree) {
		t.Fatalf("stale free: %v", err)
	}
	if _, ok := a.Lookup(again.Addr()); !ok {
		t.Fatal("stale free released the new allocation")
	}
	ob := mustAlloc(t, other, 64)
	if err := a.Free(ob); !errors.Is(err, ErrForeignBuf) {
		t.Errorf("foreign free: %v", err)
	}
	if err := a.Free(Buf{}); !errors.Is(err, ErrForeignBuf) {
		t.Errorf("zero Buf free: %v", err)
	}
	if err := a.NewCache().Free(ob); !errors.Is(err, ErrForeignBuf) {
		t.Errorf("foreign free through a cache: %v", err)
	}
	if st := checkStats(t, a); st.InUse != int64(len(tmp)+1) {
		t.Errorf("in use %d, want %d", st.InUse, len(tmp)+1)
	}
	for _, x := range append(tmp, again) {
		if err := a.Free(x); err != nil {
			t.Fatal(err)
		}
	}
	if err := other.Free(ob); err != nil {
		t.Fatal(err)
	}
	var z Buf
	if z.Bytes() != nil || z.Cap() != 0 || z.Len() != 0 {
		t.Error("zero Buf is not empty")
	}
}

func TestAllocatorClose(t *testing.T) {
	pd := testPD(t)
	reg := registrar(registerMR)
	if pd == nil {
		reg = fakeRegister
	}
	a, err := newAllocator(pd, AllocatorConfig{Classes: []int{4096}, RegionSize: 1 << 20, Limit: 4 << 20}, reg)
	if err != nil {
		t.Fatal(err)
	}
	b := mustAlloc(t, a, 100)
	k := a.NewCache()
	kb, err := k.Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	if err := k.Free(kb); err != nil {
		t.Fatal(err)
	}
	b = mustAlloc(t, a, 100)
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil { // cached buffers count as free
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := a.Alloc(10); !errors.Is(err, uverbs.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("alloc after close: %v", err)
	}
	if _, err := k.Alloc(10); !errors.Is(err, uverbs.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("cache alloc after close: %v", err)
	}
	if err := a.Free(b); !errors.Is(err, uverbs.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("free after close: %v", err)
	}
	if _, ok := a.Lookup(b.Addr()); ok {
		t.Error("lookup after close")
	}
	k.Close()
	if _, err := k.Alloc(10); !errors.Is(err, uverbs.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Errorf("alloc on a closed cache: %v", err)
	}

	// Closing with a buffer in use: an error, and the memory stays mapped.
	a2, err := newAllocator(pd, AllocatorConfig{Classes: []int{4096}, RegionSize: 256 << 10, Limit: 1 << 20}, reg)
	if err != nil {
		t.Fatal(err)
	}
	held := mustAlloc(t, a2, 4096)
	err = a2.Close()
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "1 buffers (4 KiB) in use") {
		t.Fatalf("close with a buffer in use: %v", err)
	}
	t.Log(err)
	fillSeed(held.Bytes(), 1) // must not fault
}

func TestAllocatorLimit(t *testing.T) {
	a := newTestAllocator(t, AllocatorConfig{Classes: []int{4096, 64 << 10}, RegionSize: 512 << 10, Limit: 1 << 20})
	var held []Buf
	var err error
	for {
		var b Buf
		if b, err = a.Alloc(64 << 10); err != nil {
			break
		}
		held = append(held, b)
		checkStats(t, a)
		if len(held) > 100 {
			t.Fatal("no limit")
		}
	}
	if !errors.Is(err, ErrAllocatorFull) || len(held) != 16 {
		t.Fatalf("after %d buffers: %v", len(held), err)
	}
	want := "mr: allocator: 1 MiB limit reached allocating a 64 KiB buffer (in use 1 MiB, 1 MiB registered)"
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %q, want %q", err, want)
	}
	t.Log(err)
	if _, err := a.Alloc(1); !errors.Is(err, ErrAllocatorFull) {
		t.Errorf("small class with no room left: %v", err)
	}
	st := checkStats(t, a)
	if st.Registered != 1<<20 || st.Regions != 2 || st.Failures != 2 || st.InUse != 16 {
		t.Errorf("stats at the limit: %+v", st)
	}
	if err := a.Free(held[3]); err != nil {
		t.Fatal(err)
	}
	held[3] = mustAlloc(t, a, 60<<10)
	if _, err := a.NewCache().Alloc(64 << 10); !errors.Is(err, ErrAllocatorFull) {
		t.Errorf("cache alloc at the limit: %v", err)
	}
	for _, b := range held {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	if st := checkStats(t, a); st.InUse != 0 || st.Classes[1].Free != 16 {
		t.Errorf("after freeing: %+v", st)
	}
	// At the limit with every region carved for 64 KiB, a small request
	// is served by a free 64 KiB buffer instead of failing.
	b, err := a.Alloc(100)
	if err != nil {
		t.Fatalf("small buffer at the limit with 16 large ones free: %v", err)
	}
	if b.Len() != 100 || b.Cap() != 64<<10 {
		t.Errorf("fallback buffer len %d cap %d, want 100 and 64 KiB", b.Len(), b.Cap())
	}
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	if st := checkStats(t, a); st.InUse != 0 || st.Classes[1].Free != 16 {
		t.Errorf("after freeing the fallback buffer: %+v", st)
	}
}

// mrCount returns the number of MRs `rdma resource show` reports, or -1.
func mrCount() int {
	out, err := exec.Command("rdma", "resource", "show").Output()
	if err != nil {
		return -1
	}
	n := 0
	for _, m := range regexp.MustCompile(`\bmr (\d+)`).FindAllStringSubmatch(string(out), -1) {
		k, _ := strconv.Atoi(m[1])
		n += k
	}
	return n
}

func TestAllocatorGrowth(t *testing.T) {
	a := newTestAllocator(t, AllocatorConfig{Classes: []int{4096, 256 << 10}, RegionSize: 2 << 20, Limit: 64 << 20})
	real := a.pd != nil
	before := mrCount()
	var held []Buf
	for i := range 2000 {
		n := 4096
		if i%50 == 0 {
			n = 256 << 10
		}
		held = append(held, mustAlloc(t, a, n))
	}
	st := checkStats(t, a)
	// 1960 x 4 KiB + 40 x 256 KiB = 17.7 MiB: 9 regions of 2 MiB.
	if st.Regions < 9 || st.Regions > 10 || st.Registered != int64(st.Regions)*(2<<20) {
		t.Errorf("%d regions, %d bytes registered for %d buffers", st.Regions, st.Registered, len(held))
	}
	t.Logf("%d buffers in %d regions (%d on huge pages), %s carved of %s registered",
		len(held), st.Regions, st.HugeRegions, fmtBytes(st.Carved), fmtBytes(st.Registered))
	if real && before >= 0 {
		after := mrCount()
		t.Logf("rdma resource show: %d MRs before, %d with the allocator", before, after)
		if after-before != st.Regions {
			t.Errorf("rdma resource show: %d MRs before, %d after, want %d more", before, after, st.Regions)
		}
	}
	for _, b := range held {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	// Freed buffers are reused: the same load does not grow again.
	for range 2 {
		held = held[:0]
		for i := range 2000 {
			n := 4096
			if i%50 == 0 {
				n = 256 << 10
			}
			held = append(held, mustAlloc(t, a, n))
		}
		for _, b := range held {
			if err := a.Free(b); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st2 := checkStats(t, a); st2.Regions != st.Regions || st2.Carved != st.Carved {
		t.Errorf("grew on reuse: %d -> %d regions", st.Regions, st2.Regions)
	}
	if real && before >= 0 {
		a.Close()
		if after := mrCount(); after != before {
			t.Errorf("after Close: %d MRs, want %d", after, before)
		}
	}
}

func TestAllocatorConcurrent(t *testing.T) {
	a := newTestAllocator(t, AllocatorConfig{Classes: []int{64, 256, 1024, 4096, 16384, 65536}, RegionSize: 4 << 20, Limit: 256 << 20})
	const workers, iters = 8, 20000
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var k *Cache
			if w%2 == 1 {
				k = a.NewCache()
				defer k.Close()
			}
			alloc := a.Alloc
			free := a.Free
			if k != nil && w%4 == 1 {
				alloc, free = k.Alloc, k.Free
			} else if k != nil {
				alloc = k.Alloc // free to the allocator, across paths
			}
			var held []Buf
			for i := range iters {
				if len(held) < 16 && (len(held) == 0 || rng.IntN(3) > 0) {
					n := rng.IntN(65536) + 1
					b, err := alloc(n)
					if err != nil {
						errc <- err
						return
					}
					s := byte(w*31 + i)
					b.Bytes()[0], b.Bytes()[n-1] = s, s
					held = append(held, b)
					continue
				}
				j := rng.IntN(len(held))
				b := held[j]
				held[j] = held[len(held)-1]
				held = held[:len(held)-1]
				if got, ok := a.Lookup(b.Addr() + uint64(b.Len()/2)); !ok || got != b {
					errc <- errors.New("lookup of a held buffer failed")
					return
				}
				if b.Bytes()[0] != b.Bytes()[b.Len()-1] {
					errc <- errors.New("buffer contents changed under its owner")
					return
				}
				if err := free(b); err != nil {
					errc <- err
					return
				}
				if err := free(b); !errors.Is(err, ErrDoubleFree) {
					errc <- errors.New("concurrent double free not detected")
					return
				}
			}
			for _, b := range held {
				if err := free(b); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	// Stats and Lookup race with the workers.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 {
			st := a.Stats()
			for _, c := range st.Classes {
				if c.InUse < 0 || c.InUse != int64(c.Allocs-c.Frees) || c.Free != c.Carved-c.InUse {
					t.Errorf("class %d inconsistent under load: %+v", c.Size, c)
				}
			}
		}
	}()
	wg.Wait()
	<-done
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	st := checkStats(t, a)
	if st.InUse != 0 || st.Allocs != st.Frees || st.Allocs == 0 {
		t.Errorf("at the end: %+v", st)
	}
	for _, c := range st.Classes {
		if c.Free != c.Carved {
			t.Errorf("class %d: %d free of %d carved", c.Size, c.Free, c.Carved)
		}
	}
	// Every carved buffer is on exactly one free list once caches closed.
	seen := map[uint32]bool{}
	for c := range a.classes {
		for s := range a.classes[c].shards {
			for h := uint32(a.classes[c].shards[s].head.Load()); h != 0; {
				if seen[h-1] {
					t.Fatalf("slot %d twice in the free lists", h-1)
				}
				seen[h-1] = true
				_, sl := a.slot(h - 1)
				h = sl.next.Load()
			}
		}
	}
	var carved int64
	for _, c := range st.Classes {
		carved += c.Carved
	}
	if int64(len(seen)) != carved {
		t.Errorf("%d buffers in free lists, %d carved", len(seen), carved)
	}
	t.Logf("%d allocs, %d regions, %s carved", st.Allocs, st.Regions, fmtBytes(st.Carved))
}

func TestAllocatorZeroAllocs(t *testing.T) {
	a := newTestAllocator(t, AllocatorConfig{})
	k := a.NewCache()
	defer k.Close()
	sizes := []int{0, 64, 1000, 4096, 65536, 1 << 20}
	for _, n := range sizes { // warm up: carve every class used
		b := mustAlloc(t, a, n)
		a.Free(b)
		b, _ = k.Alloc(n)
		k.Free(b)
	}
	i := 0
	if got := testing.AllocsPerRun(1000, func() {
		b, err := a.Alloc(sizes[i%len(sizes)])
		i++
		if err != nil {
			panic(err)
		}
		_ = b.Bytes()
		_ = b.SGE(b.Len())
		if _, ok := a.Lookup(b.Addr()); !ok {
			panic("lookup")
		}
		if err := a.Free(b); err != nil {
			panic(err)
		}
	}); got != 0 {
		t.Errorf("Allocator Alloc+Free: %v allocations per run", got)
	}
	if got := testing.AllocsPerRun(1000, func() {
		b, err := k.Alloc(sizes[i%len(sizes)])
		i++
		if err != nil {
			panic(err)
		}
		if err := k.Free(b); err != nil {
			panic(err)
		}
	}); got != 0 {
		t.Errorf("Cache Alloc+Free: %v allocations per run", got)
	}
	// Batches larger than a cache spill and refill through the allocator.
	var held [200]Buf
	if got := testing.AllocsPerRun(100, func() {
		for j := range held {
			held[j], _ = k.Alloc(64)
		}
		for j := range held {
			if err := k.Free(held[j]); err != nil {
				panic(err)
			}
		}
	}); got != 0 {
		t.Errorf("Cache batch Alloc+Free: %v allocations per run", got)
	}
	if unsafe.Sizeof(Buf{}) > 40 {
		t.Errorf("Buf is %d bytes", unsafe.Sizeof(Buf{}))
	}
}

func TestFmtBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 512: "512 B", 1024: "1 KiB", 1536: "1.5 KiB", 1 << 20: "1 MiB",
		63<<20 + 800<<10: "63.8 MiB", 1 << 30: "1 GiB"} {
		if got := fmtBytes(n); got != want {
			t.Errorf("fmtBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func benchAllocator(b *testing.B) *Allocator {
	a := newTestAllocator(b, AllocatorConfig{})
	for _, n := range []int{64, 4096} {
		x, err := a.Alloc(n)
		if err != nil {
			b.Fatal(err)
		}
		a.Free(x)
	}
	return a
}

func BenchmarkAllocFree(b *testing.B) {
	a := benchAllocator(b)
	b.ReportAllocs()
	for b.Loop() {
		x, err := a.Alloc(4096)
		if err != nil {
			b.Fatal(err)
		}
		a.Free(x)
	}
}

func BenchmarkAllocFreeParallel(b *testing.B) {
	a := benchAllocator(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			x, err := a.Alloc(4096)
			if err != nil {
				panic(err)
			}
			a.Free(x)
		}
	})
}

func BenchmarkCacheAllocFree(b *testing.B) {
	a := benchAllocator(b)
	k := a.NewCache()
	defer k.Close()
	b.ReportAllocs()
	for b.Loop() {
		x, err := k.Alloc(4096)
		if err != nil {
			b.Fatal(err)
		}
		k.Free(x)
	}
}

func BenchmarkCacheAllocFreeParallel(b *testing.B) {
	a := benchAllocator(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		k := a.NewCache()
		defer k.Close()
		for pb.Next() {
			x, err := k.Alloc(4096)
			if err != nil {
				panic(err)
			}
			k.Free(x)
		}
	})
}

func BenchmarkLookup(b *testing.B) {
	a := benchAllocator(b)
	x, _ := a.Alloc(4096)
	defer a.Free(x)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := a.Lookup(x.Addr() + 100); !ok {
			b.Fatal("lookup")
		}
	}
}

func TestBufResize(t *testing.T) {
	a := newTestAllocator(t, AllocatorConfig{Classes: []int{256, 4096}, RegionSize: 2 << 20, Limit: 4 << 20})
	b := mustAlloc(t, a, 3000) // class 4096
	b.Bytes()[0], b.Bytes()[2999] = 7, 9
	for _, n := range []int{0, 1, 2999, 3000, 4096} {
		r, err := b.Resize(n)
		if err != nil {
			t.Fatalf("Resize(%d): %v", n, err)
		}
		if r.Len() != n || len(r.Bytes()) != n || r.Cap() != b.Cap() || r.Addr() != b.Addr() || r.Handle() != b.Handle() {
			t.Errorf("Resize(%d): len %d, bytes %d, cap %d, addr %#x, handle %#x; want the same buffer of %d bytes",
				n, r.Len(), len(r.Bytes()), r.Cap(), r.Addr(), r.Handle(), n)
		}
		if got := r.SGE(r.Len()); got.Addr != b.Addr() || got.Length != uint32(n) || got.LKey != b.LKey() {
			t.Errorf("Resize(%d).SGE = %+v", n, got)
		}
	}
	if r, _ := b.Resize(3000); r.Bytes()[0] != 7 || r.Bytes()[2999] != 9 {
		t.Error("Resize changed the contents")
	}
	if b.Len() != 3000 {
		t.Errorf("Resize changed the receiver's length to %d", b.Len())
	}
	for _, n := range []int{-1, 4097, 1 << 30} {
		if _, err := b.Resize(n); err == nil || !strings.Contains(err.Error(), "outside the 4096-byte buffer") {
			t.Errorf("Resize(%d) = %v, want an error naming the buffer's size", n, err)
		}
	}
	if _, err := (Buf{}).Resize(0); !errors.Is(err, ErrForeignBuf) {
		t.Errorf("zero Buf Resize = %v, want ErrForeignBuf", err)
	}
	for _, n := range []int{-1, 4097, 1 << 62} {
		func() {
			defer func() {
				err, _ := recover().(error)
				if err == nil || err.Error() != fmt.Sprintf("mr: Buf.SGE(%d) outside the 4096-byte buffer", n) {
					t.Errorf("SGE(%d) panicked with %v, want an error naming n and the buffer's size", n, err)
				}
			}()
			b.SGE(n)
		}()
	}
	// A resized copy frees the buffer; the original is then a double free.
	r, _ := b.Resize(10)
	if err := a.Free(r); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(b); !errors.Is(err, ErrDoubleFree) {
		t.Errorf("second Free through the other copy = %v, want ErrDoubleFree", err)
	}
}

// TestClassOf checks classOf (a table up to 4 KiB, a search above)
// against a scan of the classes, for every size around and between them.
func TestClassOf(t *testing.T) {
	for _, classes := range [][]int{
		nil, // the defaults
		{64},
		{128, 192, 4096, 8192},
		{4480},
		{640, 4096 + 64, 1 << 20},
	} {
		a, err := newAllocator(nil, AllocatorConfig{Classes: classes, RegionSize: 1 << 20, Limit: 1 << 20}, fakeRegister)
		if err != nil {
			t.Fatal(err)
		}
		sizes := a.Config().Classes
		for n := -3; n <= sizes[len(sizes)-1]+3 && n <= 10000; n++ {
			want := -1
			for i, s := range sizes {
				if n >= 0 && s >= n {
					want = i
					break
				}
			}
			got, err := a.classOf(n)
			if want < 0 {
				if err == nil {
					t.Fatalf("classes %v: classOf(%d) = %d, want an error", sizes, n, got)
				}
				continue
			}
			if err != nil || got != want {
				t.Fatalf("classes %v: classOf(%d) = %d, %v; want %d", sizes, n, got, err, want)
			}
		}
	}
}

// TestAllocatorConfigBounds checks the upper bounds of the fields that
// end up in fixed-size places: CacheSize (each Cache makes room for that
// many IDs per class) and the class sizes (buffer lengths are 32 bits).
func TestAllocatorConfigBounds(t *testing.T) {
	for _, c := range []struct {
		cfg  AllocatorConfig
		want string
	}{
		{AllocatorConfig{CacheSize: math.MaxInt}, fmt.Sprintf("CacheSize %d outside [2, 65536]", math.MaxInt)},
		{AllocatorConfig{CacheSize: 1<<16 + 1}, "CacheSize 65537 outside [2, 65536]"},
		{AllocatorConfig{CacheSize: 1}, "CacheSize 1 outside [2, 65536]"},
		{AllocatorConfig{CacheSize: -1}, "CacheSize -1 outside [2, 65536]"},
		{AllocatorConfig{Shards: -1}, "Shards -1 is negative"},
		{AllocatorConfig{Classes: []int{4 << 30}, RegionSize: 4 << 30, Limit: 8 << 30},
			"class 0: size 4294967296 (4 GiB) is 4 GiB or more"},
		{AllocatorConfig{Classes: []int{64, 5 << 30}, RegionSize: 8 << 30, Limit: 16 << 30},
			"class 1: size 5368709120 (5 GiB) is 4 GiB or more"},
		{AllocatorConfig{Classes: []int{64, 1 << 32}}, "class 1: size 4294967296 (4 GiB) is 4 GiB or more"},
	} {
		a, err := newAllocator(nil, c.cfg, fakeRegister)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.cfg, err, c.want)
		}
		if a != nil {
			t.Errorf("%+v: an allocator along with error %v", c.cfg, err)
		}
	}
	// The bounds themselves are accepted.
	a, err := newAllocator(nil, AllocatorConfig{Classes: []int{64, 1<<32 - 64}, RegionSize: 4 << 30, Limit: 4 << 30, CacheSize: 1 << 16}, fakeRegister)
	if err != nil {
		t.Fatal(err)
	}
	k := a.NewCache()
	if k == nil || cap(k.cls[0].ids) != 1<<16 {
		t.Fatalf("NewCache with CacheSize 1<<16: %+v", k)
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}
