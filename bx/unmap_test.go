package bx_test

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/procstat"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// vmSize is the process's mapped memory in bytes.
func vmSize(t *testing.T) int64 {
	t.Helper()
	kb, err := procstat.Field("VmSize")
	if err != nil {
		t.Fatal(err)
	}
	return kb << 10
}

// closeAll closes the endpoints, each error a test error.
func closeAll(t *testing.T, es ...*bx.Endpoint) {
	t.Helper()
	for _, e := range es {
		if err := e.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}
}

// TestCloseUnmapsPools: Endpoint.Close gives its buffer pools' memory back
// (before, it deregistered the MRs and left every pool mapped, so a process
// that opened and closed endpoints grew by hundreds of MB each time); and
// when a user still holds a received message, Close leaves the memory
// mapped, so the message stays readable.
func TestCloseUnmapsPools(t *testing.T) {
	exchange := func(keep bool) {
		srv, cli, p, sp := pair(t, nil)
		ctx, wd := hang.For(t, "", 30*time.Second) // a hang bound (no progress), not a speed bound
		defer wd.Stop()
		if err := p.Stream(1).Send(ctx, []byte("keep me")); err != nil {
			t.Fatal(err)
		}
		m, err := sp.Stream(1).Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !keep {
			m.Release()
		}
		closeAll(t, cli, srv)
		if keep {
			// Still mapped: reading it must not fault.
			if got := m.Data(); !bytes.Equal(got, []byte("keep me")) {
				t.Errorf("a message held across Close reads %q", got)
			}
			m.Release()
		}
	}
	exchange(false) // warm up the runtime's own mappings
	// Pools left mapped show in every round; the Go runtime reserving a
	// new 64 MiB heap arena shows in one (seen: 72 of 196 MiB over three
	// rounds). So the round that kept the least decides.
	var grown, opened []int64
	for range 3 {
		before := vmSize(t)
		srv, cli, _, _ := pair(t, nil)
		opened = append(opened, vmSize(t)-before)
		closeAll(t, cli, srv)
		grown = append(grown, vmSize(t)-before)
	}
	t.Logf("3 endpoint pairs: mapped %v bytes while open, %v left after Close", opened, grown)
	if i := slices.Index(grown, slices.Min(grown)); grown[i] > opened[i]/4 {
		t.Errorf("closed endpoints left %d MiB of the %d MiB they mapped (the round that kept the least of 3)", grown[i]>>20, opened[i]>>20)
	}
	exchange(true)
}

// TestNewFailureUnmapsPools: a New that fails after its pools exist (here
// posting the receive buffers: 1024 of 8 KiB do not fit a 4 MiB
// MemoryLimit) leaves no pool mapped; before, each such failure kept its
// pools (6 MiB and more). And a New asking for more receive buffers than
// the device's SRQ takes fails first, naming the product, before it sizes
// anything by it.
func TestNewFailureUnmapsPools(t *testing.T) {
	a, _ := rxetest.Pair(t)
	try := func() {
		e, err := bx.New(bx.Config{Device: a, Token: token, MemoryLimit: 4 << 20, MaxMessage: 1 << 20})
		if err == nil {
			e.Close()
			t.Fatal("New with 1024 receive buffers of 8 KiB in a 4 MiB MemoryLimit succeeded")
		}
	}
	try() // warm up: the first failure may map what stays (slabs, the context's caches)
	// Each failure had registered an eager, a rendezvous and a target pool
	// (2 MiB at least each): 10 leaks would be 60 MiB or more, in every
	// round. The Go runtime reserving a heap arena (64 MiB; under -race
	// 72 seen) shows in one round, at any time: the round that grew the
	// least decides.
	const n = 10
	var grew []int64
	for range 2 {
		before := vmSize(t)
		for range n {
			try()
		}
		after := vmSize(t)
		t.Logf("VmSize %d -> %d MiB over %d failed New", before>>20, after>>20, n)
		grew = append(grew, after-before)
	}
	if g := slices.Min(grew); g > 16<<20 {
		t.Errorf("VmSize grew by %d MiB or more in each of 2 rounds of %d failed New: pools left mapped", g>>20, n)
	}
	// Two peers: within the backlog bound New checks first (MaxPeers x
	// (Credits + Lanes x LaneMsgs) up to 2^22), beyond rxe's SRQ (2^20).
	_, err := bx.New(bx.Config{Device: a, Token: token, MaxPeers: 2, Credits: 1 << 20})
	if err == nil || !strings.Contains(err.Error(), "Credits 1048576") || !strings.Contains(err.Error(), "shared receive queue takes") {
		t.Errorf("New with 2^20 credits for two peers: %v; want the SRQ's limit named", err)
	}
}
