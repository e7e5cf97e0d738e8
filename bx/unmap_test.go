package bx_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/procstat"
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
	var grown, opened int64
	for range 3 {
		before := vmSize(t)
		srv, cli, _, _ := pair(t, nil)
		opened += vmSize(t) - before
		closeAll(t, cli, srv)
		grown += vmSize(t) - before
	}
	t.Logf("3 endpoint pairs: mapped %d MiB while open, %d MiB left after Close", opened>>20, grown>>20)
	if grown > opened/4 {
		t.Errorf("closed endpoints left %d MiB of the %d MiB they mapped", grown>>20, opened>>20)
	}
	exchange(true)
}
