package mr

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/uverbs"
)

// TestAllocatorCloseRace: Close racing Allocs and Frees (through the
// Allocator and through Caches) counts in its ErrInUse exactly the
// buffers whose Alloc succeeded and whose Free did not, and every Alloc
// and Free that fails for the close says so (uverbs.ErrClosed). Close
// counted a slot that an Alloc had marked in use and then gave back on
// seeing the close (the Alloc failed; Close reported a buffer in use
// and left the memory mapped for good), and a buffer whose Free passed
// the closed check before Close and freed it after Close had counted it
// (the Free succeeded; Close reported it in use).
func TestAllocatorCloseRace(t *testing.T) {
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound: each round is microseconds of work
	workers := max(4, runtime.GOMAXPROCS(0))
	// Rounds enough to catch the old defect nearly every run on two
	// cores (it showed within 500 rounds there, within 20 under the race
	// detector), not a bound on time.
	rounds := 3000
	if raceEnabled || testing.Short() {
		rounds = 500
	}
	for round := range rounds {
		a, err := newAllocator(nil, AllocatorConfig{Classes: []int{64, 4096}, RegionSize: 256 << 10, Limit: 1 << 20, Shards: 2}, fakeRegister)
		if err != nil {
			t.Fatal(err)
		}
		held := make([]int, workers)
		var ops atomic.Int64
		var wg sync.WaitGroup
		errc := make(chan error, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				alloc, free := a.Alloc, a.Free
				if w%2 == 1 {
					k := a.NewCache()
					defer k.Close()
					alloc, free = k.Alloc, k.Free
				}
				var mine []Buf
				defer func() { held[w] = len(mine) }()
				for i := 0; ; i++ {
					ops.Add(1)
					if i%256 == 255 {
						runtime.Gosched() // with one P, lets Close in
					}
					if len(mine) < 8 && i%3 != 2 {
						b, err := alloc(64 << (6 * (i % 2)))
						if err != nil {
							if !errors.Is(err, uverbs.ErrClosed) {
								errc <- fmt.Errorf("alloc: %w", err)
							}
							return
						}
						mine = append(mine, b)
						continue
					}
					if err := free(mine[len(mine)-1]); err != nil {
						if !errors.Is(err, uverbs.ErrClosed) {
							errc <- fmt.Errorf("free: %w", err)
						}
						return // its buffer is still in use
					}
					mine = mine[:len(mine)-1]
				}
			}()
		}
		for ops.Load() < int64(50*workers) && ctx.Err() == nil {
			runtime.Gosched()
		}
		cerr := a.Close()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatalf("round %d: workers did not stop after Close: %v", round, hang.Cause(ctx, ctx.Err()))
		}
		close(errc)
		for err := range errc {
			t.Fatalf("round %d: %v", round, err)
		}
		n := 0
		for _, h := range held {
			n += h
		}
		switch {
		case n == 0 && cerr != nil:
			t.Fatalf("round %d: no buffer held, Close: %v", round, cerr)
		case n > 0 && (!errors.Is(cerr, ErrInUse) || !strings.Contains(cerr.Error(), fmt.Sprintf("closed with %d buffers", n))):
			t.Fatalf("round %d: %d buffers held after Close, Close said: %v", round, n, cerr)
		}
		if n > 0 {
			for _, r := range a.all { // Close left them mapped
				r.mem.Close()
			}
		}
		wd.Progress()
	}
}
