package leakcheck

import (
	"strings"
	"testing"
	"time"
)

func leaky(stop <-chan struct{}) { <-stop }

func TestWait(t *testing.T) {
	b := Take()
	stop := make(chan struct{})
	go leaky(stop)
	if s := b.Wait(50 * time.Millisecond); !strings.Contains(s, "leakcheck.leaky") {
		t.Fatalf("a goroutine left running: Wait returned %q, want its stack", s)
	}
	close(stop)
	if s := b.Wait(Bound); s != "" {
		t.Fatalf("after the goroutine ended: %s", s)
	}
}
