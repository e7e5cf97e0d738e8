package tcgcost

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goverbs/goverbs/flow"
)

var sink int

//go:noinline
func next(x int) int { return x + 1 }

type adder interface{ add(int) int }

type two struct{}

//go:noinline
func (two) add(x int) int { return x + 2 }

func BenchmarkLoop(b *testing.B) {
	buf := make([]int, 1024)
	s := 0
	for i := 0; i < b.N; i++ {
		s += buf[i&1023]
	}
	sink = s
}

func BenchmarkCall(b *testing.B) {
	s := 0
	for i := 0; i < b.N; i++ {
		s = next(s)
	}
	sink = s
}

func BenchmarkInterfaceCall(b *testing.B) {
	var a adder = two{}
	s := 0
	for i := 0; i < b.N; i++ {
		s = a.add(s)
	}
	sink = s
}

func BenchmarkAtomicAdd(b *testing.B) {
	var n atomic.Int64
	for i := 0; i < b.N; i++ {
		n.Add(1)
	}
}

func BenchmarkMutex(b *testing.B) {
	var mu sync.Mutex
	for i := 0; i < b.N; i++ {
		mu.Lock()
		//lint:ignore SA2001 the pair is what is measured
		mu.Unlock()
	}
}

func BenchmarkTimeNow(b *testing.B) {
	s := 0
	for i := 0; i < b.N; i++ {
		s += int(time.Now().UnixNano() & 1)
	}
	sink = s
}

func BenchmarkChannel(b *testing.B) {
	ch := make(chan struct{}, 1)
	for i := 0; i < b.N; i++ {
		ch <- struct{}{}
		<-ch
	}
}

func BenchmarkSyncMapLoad(b *testing.B) {
	var m sync.Map
	m.Store(1, 2)
	for i := 0; i < b.N; i++ {
		m.Load(1)
	}
}

// BenchmarkCredits is a sender's credit step: take one, and the grant
// that returns it.
func BenchmarkCredits(b *testing.B) {
	c := flow.NewCredits(flow.CreditsConfig{Initial: 1 << 20})
	for i := 0; i < b.N; i++ {
		if !c.TryAcquire(1) {
			b.Fatal("no credit")
		}
		if err := c.Grant(uint64(1<<20+i+1), 0); err != nil {
			b.Fatal(err)
		}
	}
}
