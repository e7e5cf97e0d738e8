package cm

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

// Arguments refused before the kernel, without a device: an ID on a
// Channel whose descriptor is the write end of a pipe (no reader runs),
// so that a command that reaches "the kernel" shows as bytes in the pipe.

// pipeID returns an ID of port space ps (a UD one if ud) on a Channel
// over a pipe, and a function that reports how many bytes of commands
// reached the pipe since the last call.
func pipeID(t *testing.T, ps PortSpace, ud bool) (*ID, func() int) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	rc, err := w.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	ch := &Channel{file: w, rc: rc, ids: map[uint64]*ID{}, mcs: map[uint64]*Multicast{}, done: make(chan struct{})}
	ch.mu.Lock()
	id := ch.newIDLocked(ps, ud, 7)
	ch.mu.Unlock()
	written := func() int {
		n := 0
		buf := make([]byte, 4096)
		for {
			r.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
			k, err := r.Read(buf)
			n += k
			if err != nil {
				return n
			}
		}
	}
	return id, written
}

// TestRefusedBeforeKernel: arguments the kernel refuses with a bare
// EINVAL, or takes and silently changes, are refused with an error naming
// them, and no command is written.
func TestRefusedBeforeKernel(t *testing.T) {
	// Bounds a step that went to the pipe and waits for an event that
	// never comes (the old code's, failing); a step refused first does not
	// wait. A hang bound: the cases run in milliseconds.
	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(10*time.Second))
	defer cancel()
	for _, c := range []struct {
		name string
		ps   PortSpace
		ud   bool
		call func(id *ID) error
		want string
	}{
		// ucma_reject takes only reasons 0, 28 (consumer defined) and 35
		// (vendor option not supported); others are EINVAL.
		{"reject reason 1", TCP, false, func(id *ID) error { return id.Reject(nil, RejectNoQP) }, "reason 1"},
		{"reject reason 8", TCP, false, func(id *ID) error { return id.Reject(nil, RejectInvalidServiceID) }, "reason 8"},
		// A UD reject is a SIDR REP: 136 bytes of private data, not 148.
		{"UD reject data", UDP, true, func(id *ID) error { return id.Reject(make([]byte, MaxUDAcceptData+1), 0) }, "private data"},
		// rdma_resolve_addr refuses a source and destination of two families.
		{"resolve 4 to 6", TCP, false, func(id *ID) error {
			return id.ResolveAddr(ctx, netip.MustParseAddr("10.99.0.1"), netip.MustParseAddrPort("[fd00::2]:7174"))
		}, "famil"},
		{"resolve 6 to 4", TCP, false, func(id *ID) error {
			return id.ResolveAddr(ctx, netip.MustParseAddr("fd00::1"), netip.MustParseAddrPort("10.99.0.2:7174"))
		}, "famil"},
		// The kernel masks a QPN to 24 bits: another QP would be named.
		{"connect QPN 25 bits", TCP, false, func(id *ID) error {
			_, err := id.Connect(ctx, ConnParam{QPN: 1 << 24})
			return err
		}, "QPN"},
		{"accept QPN 25 bits", TCP, false, func(id *ID) error {
			_, err := id.Accept(ctx, ConnParam{QPN: 0x1000001})
			return err
		}, "QPN"},
		// Without a QP of its own an RC ID must name one: QPN 0 is the SMI.
		{"connect no QP, QPN 0", TCP, false, func(id *ID) error {
			_, err := id.Connect(ctx, ConnParam{})
			return err
		}, "QPN"},
		{"accept no QP, QPN 0", TCP, false, func(id *ID) error {
			_, err := id.Accept(ctx, ConnParam{})
			return err
		}, "QPN"},
		{"UD accept no QP, QPN 0", UDP, true, func(id *ID) error {
			_, err := id.Accept(ctx, ConnParam{})
			return err
		}, "QPN"},
		// The kernel takes a Q_Key only on AF_IB addresses (ucma_copy_conn_param):
		// on the IP addresses this package gives it, another one is dropped.
		{"UD accept Q_Key", UDP, true, func(id *ID) error {
			_, err := id.Accept(ctx, ConnParam{QPN: 0x11, QKey: 0x11111111})
			return err
		}, "Q_Key"},
		// A zero PD (no AllocPD made it) is no PD: said so, not asked of
		// the kernel's route first.
		{"CreateQP zero PD", TCP, false, func(id *ID) error {
			_, err := id.CreateQP(new(uverbs.PD), qp.Config{})
			return err
		}, "PD"},
	} {
		t.Run(c.name, func(t *testing.T) {
			id, written := pipeID(t, c.ps, c.ud)
			err := c.call(id)
			n := written()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v, want an error naming %q", err, c.want)
			}
			if n != 0 {
				t.Errorf("%d bytes of commands went to the kernel", n)
			}
		})
	}
	// What the kernel takes still goes to it.
	id, written := pipeID(t, UDP, true)
	for _, reason := range []uint8{0, RejectConsumerDefined, RejectVendorOptionNotSupported} {
		if err := id.Reject(make([]byte, MaxUDAcceptData), reason); err != nil {
			t.Errorf("reject with reason %d: %v", reason, err)
		}
		if written() == 0 {
			t.Errorf("reject with reason %d wrote no command", reason)
		}
	}
	// A UD accept does not wait: its own context, not the cases' (whose
	// time a slow machine may have spent).
	if _, err := id.Accept(context.Background(), ConnParam{QPN: 0x11, QKey: 0x01234567}); err != nil {
		t.Errorf("UD accept with the port space's Q_Key: %v", err)
	}
	if written() == 0 {
		t.Error("UD accept wrote no command")
	}
}

// TestCancelledBeforeKernel: a step whose context has ended returns its
// error and starts nothing in the kernel (a connect request or an accept
// the peer would act on, a resolution whose late event stays queued).
func TestCancelledBeforeKernel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name string
		ps   PortSpace
		ud   bool
		call func(id *ID) error
	}{
		{"resolve address", TCP, false, func(id *ID) error {
			return id.ResolveAddr(ctx, netip.Addr{}, netip.MustParseAddrPort("10.99.0.2:7174"))
		}},
		{"resolve route", TCP, false, func(id *ID) error { return id.ResolveRoute(ctx) }},
		{"connect", TCP, false, func(id *ID) error {
			_, err := id.Connect(ctx, ConnParam{QPN: 0x11})
			return err
		}},
		{"UD connect", UDP, true, func(id *ID) error {
			_, err := id.Connect(ctx, ConnParam{})
			return err
		}},
		{"accept", TCP, false, func(id *ID) error {
			_, err := id.Accept(ctx, ConnParam{QPN: 0x11})
			return err
		}},
		{"UD accept", UDP, true, func(id *ID) error {
			_, err := id.Accept(ctx, ConnParam{QPN: 0x11})
			return err
		}},
		{"join multicast", UDP, true, func(id *ID) error {
			_, err := id.JoinMulticast(ctx, netip.MustParseAddr("239.1.7.9"), JoinOptions{})
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			id, written := pipeID(t, c.ps, c.ud)
			err := c.call(id)
			n := written()
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%v, want context.Canceled", err)
			}
			if n != 0 {
				t.Errorf("%d bytes of commands went to the kernel", n)
			}
			if id.ch.IDs() != 1 || len(id.ch.mcs) != 0 {
				t.Errorf("%d IDs and %d groups left on the channel", id.ch.IDs(), len(id.ch.mcs))
			}
		})
	}
}
