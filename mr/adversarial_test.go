package mr

import (
	"errors"
	"testing"
)

// TestCacheAllocFallsBackToLargerClass: Cache.Alloc is "Allocator.Alloc
// through the cache", and Allocator.Alloc at the limit serves a small
// request from a free buffer of a larger class rather than failing while
// registered memory sits idle. Before, the cache failed with
// ErrAllocatorFull where the allocator succeeded.
func TestCacheAllocFallsBackToLargerClass(t *testing.T) {
	a := newTestAllocator(t, AllocatorConfig{Classes: []int{4096, 64 << 10}, RegionSize: 512 << 10, Limit: 1 << 20})
	var held []Buf
	for range 16 {
		held = append(held, mustAlloc(t, a, 64<<10))
	}
	if _, err := a.Alloc(64 << 10); !errors.Is(err, ErrAllocatorFull) {
		t.Fatalf("17th 64 KiB buffer: %v, want ErrAllocatorFull", err)
	}
	for _, b := range held {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	k := a.NewCache()
	defer k.Close()
	b, err := k.Alloc(100)
	if err != nil {
		t.Fatalf("cache: small buffer at the limit with 16 large ones free: %v", err)
	}
	if b.Len() != 100 || b.Cap() != 64<<10 {
		t.Errorf("fallback buffer len %d cap %d, want 100 and 64 KiB", b.Len(), b.Cap())
	}
	// A larger buffer the cache holds serves too, without the allocator.
	b2, err := k.Alloc(200)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Free(b); err != nil {
		t.Fatal(err)
	}
	b3, err := k.Alloc(300)
	if err != nil {
		t.Fatalf("cache: small buffer with a large one in the cache: %v", err)
	}
	if b3.ID() != b.ID() {
		t.Errorf("cache served buffer %d, want the large one it holds (%d)", b3.ID(), b.ID())
	}
	for _, x := range []Buf{b2, b3} {
		if err := k.Free(x); err != nil {
			t.Fatal(err)
		}
	}
	k.Flush()
	if st := checkStats(t, a); st.InUse != 0 || st.Classes[1].Free != 16 || st.Classes[0].Carved != 0 {
		t.Errorf("after freeing: %+v", st)
	}
}
