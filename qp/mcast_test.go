package qp_test

import (
	"net"
	"os"
	"strings"
	"testing"

	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/qp"
)

// TestMcastAttach attaches a UD QP to a group and detaches it, through
// INVOKE_WRITE and through write(); the kernel refuses a second detach and
// the destruction of an attached QP, the package refuses an RC QP, a nil
// GID and a closed QP. (Datagrams to
// a group are tested with rdma_cm's join in package cm: on RoCE v2 the
// netdev must join the IP group too, which rdma_cm does.)
func TestMcastAttach(t *testing.T) {
	na, _ := rxetest.Pair(t)
	mgid := net.ParseIP("::ffff:239.1.9.1")
	for _, legacy := range []bool{false, true} {
		s := newSide(t, na, pairOpts{cfg: qp.Config{Type: qp.UD}, legacy: legacy})
		if err := s.qp.ToRTS(qp.UDOptions{QKey: 0x11}); err != nil {
			t.Fatal(err)
		}
		if err := s.qp.AttachMcast(mgid, 0); err != nil {
			t.Fatalf("legacy %v: %v", legacy, err)
		}
		if err := s.qp.DetachMcast(mgid, 0); err != nil {
			t.Fatalf("legacy %v: %v", legacy, err)
		}
		err := s.qp.DetachMcast(mgid, 0)
		wantErr(t, err, "DETACH_MCAST")
		t.Logf("legacy %v: second detach: %v", legacy, err)
		wantErr(t, s.qp.AttachMcast(nil, 0), "not a GID")
		// The kernel refuses to destroy a QP still attached to a group
		// (EBUSY); detached, it goes.
		if err := s.qp.AttachMcast(mgid, 0); err != nil {
			t.Fatal(err)
		}
		wantErr(t, s.qp.Close(), "busy")
		if err := s.qp.DetachMcast(mgid, 0); err != nil {
			t.Fatal(err)
		}
		if err := s.qp.Close(); err != nil {
			t.Fatal(err)
		}
		wantErr(t, s.qp.AttachMcast(mgid, 0), "QP closed")
	}
	rc := newSide(t, na, pairOpts{})
	wantErr(t, rc.qp.AttachMcast(mgid, 0), "UD only")
}

// TestContextCloseAbandons: a context closed with a QP still attached to a
// multicast group (whose destruction the kernel refuses) still lets go of
// the device: the QP is marked closed and its queues unmapped, so closing
// the descriptor destroys what is left. Before, the QP's rings stayed
// mapped, which kept the descriptor's file, and every object and pinned
// page of the context, until the process exited.
func TestContextCloseAbandons(t *testing.T) {
	na, _ := rxetest.Pair(t)
	before := uverbsMaps(t)
	s := newSide(t, na, pairOpts{cfg: qp.Config{Type: qp.UD}})
	if err := s.qp.ToRTS(qp.UDOptions{QKey: 0x11}); err != nil {
		t.Fatal(err)
	}
	if err := s.qp.AttachMcast(net.ParseIP("::ffff:239.1.9.2"), 0); err != nil {
		t.Fatal(err)
	}
	if n := uverbsMaps(t); n <= before {
		t.Fatalf("%d uverbs mappings with a QP and a CQ, %d before: the test cannot tell", n, before)
	}
	wantErr(t, s.ctx.Close(), "busy") // the QP's destroy, refused, is reported
	if n := uverbsMaps(t); n > before {
		t.Errorf("%d uverbs mappings after the context's Close, %d before it was opened", n, before)
	}
	wantErr(t, s.qp.AttachMcast(net.ParseIP("::ffff:239.1.9.2"), 0), "QP closed")
}

// uverbsMaps counts this process's mappings of uverbs device files.
func uverbsMaps(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "/dev/infiniband/uverbs")
}
