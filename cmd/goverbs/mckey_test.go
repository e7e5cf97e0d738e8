package main

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestMckeyInterop runs goverbs mckey against rdma-core's mckey
// (rdmacm-utils) both ways and against itself: the receiver joins a group
// from rxe1 (10.99.0.2), the sender joins it from rxe0 (10.99.0.1) and,
// after mckey's 3 s pause, sends 10 datagrams of 100 bytes to it over the
// veth. Both must print the join of ::ffff:GROUP and `data transfers
// complete`; a goverbs receiver also reports the count, size and sender.
func TestMckeyInterop(t *testing.T) {
	cmInterop(t, "mckey", "sender", "receiver", func(t *testing.T, i int, sender, receiver string, run peerRun) {
		group := netip.AddrFrom4([4]byte{239, 1, 8, byte(1 + i)})
		start := time.Now()
		recvRes, recvDone := run(receiver, "-m", group.String(), "-b", "10.99.0.2", "-C", "10", "-S", "100")
		deadline := time.Now().Add(hang.Scale(30 * time.Second))
		for !rxetest.IGMPMember(t, "v1", group) {
			select {
			case <-recvDone:
				r := recvRes()
				t.Fatalf("the receiver exited before it joined: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
			case <-time.After(10 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("v1 did not join %v", group)
			}
		}
		sendRes, _ := run(sender, "-m", group.String(), "-b", "10.99.0.1", "-s", "-C", "10", "-S", "100")
		rs, rr := sendRes(), recvRes()
		t.Logf("%.1f s", time.Since(start).Seconds())
		joined := fmt.Sprintf("mckey: joined dgid: ::ffff:%v mlid 0x0 sl 0", group)
		checkCMRun(t, sender+" sender", rs, joined)
		checkCMRun(t, receiver+" receiver", rr, joined)
		if receiver == "goverbs" && !strings.Contains(rr.stdout, "mckey: received 10 messages of 100 bytes from ::ffff:10.99.0.1") {
			t.Errorf("goverbs receiver's report:\n%s", rr.stdout)
		}
		if rxetest.IGMPMember(t, "v0", group) || rxetest.IGMPMember(t, "v1", group) {
			t.Errorf("a membership of %v outlived the processes", group)
		}
	})
}

func TestMckeyUsage(t *testing.T) {
	checkUsageErrors(t, [][]string{
		{"mckey"}, {"mckey", "-m", "239.1.1.1", "-c", "2"}, {"mckey", "-m", "239.1.1.1", "-p", "2"},
		{"mckey", "-m", "239.1.1.1", "-C", "-1"}, {"mckey", "-m", "239.1.1.1", "-l"},
	})
}
