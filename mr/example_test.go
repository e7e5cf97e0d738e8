package mr_test

import (
	"fmt"
	"log"
	"testing"

	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/uverbs"
)

// Memory for RDMA lives outside the Go heap (the garbage collector never
// moves it); registering it gives the keys work requests name it by.
func ExampleRegister() {
	ctx, err := uverbs.Open("rxe0")
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	if err != nil {
		log.Fatal(err)
	}
	mem, err := mr.Alloc(1 << 20) // huge pages when the system has them
	if err != nil {
		log.Fatal(err)
	}
	defer mem.Close()
	m, err := mr.Register(pd, mem.Bytes(), mr.LocalWrite|mr.RemoteWrite)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close() // before mem.Close: deferred calls run last-in first-out
	copy(mem.Bytes(), "payload")
	sge, err := m.SGE(0, len("payload")) // for a SendWR or RecvWR
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("lkey %#x rkey %#x, SGE of %d bytes\n", m.LKey(), m.RKey(), sge.Length)
}

// An Allocator carves size-classed buffers out of a few registered
// regions: no registration and no heap allocation per buffer.
func ExampleNewAllocator() {
	ctx, err := uverbs.Open("rxe0")
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	if err != nil {
		log.Fatal(err)
	}
	a, err := mr.NewAllocator(pd, mr.AllocatorConfig{Classes: []int{256, 4096, 65536}, Access: mr.LocalWrite})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	b, err := a.Alloc(1000) // from the 4096-byte class
	if err != nil {
		log.Fatal(err)
	}
	copy(b.Bytes(), "request")
	sge := b.SGE(b.Len())
	fmt.Println(b.Len(), b.Cap(), sge.LKey == b.LKey())
	if err := a.Free(b); err != nil {
		log.Fatal(err)
	}
}

// TestExamples runs this package's examples on the guest's devices and
// checks what they print (they have no Output comment: see rxetest.Example).
func TestExamples(t *testing.T) {
	rxetest.RunExamples(t, []rxetest.ExampleCase{
		{Name: "ExampleRegister", F: ExampleRegister, Want: "SGE of 7 bytes"},
		{Name: "ExampleNewAllocator", F: ExampleNewAllocator, Want: "1000 4096 true"},
	})
}
