package cm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/ioctl"
)

// Host tests of races and terminal events, without a device: the
// Channel's descriptor is the write end of a pipe, and a fake kernel reads
// the commands from the other end in the order they were written. Events
// go through Channel.dispatch as the reader hands over what GET_EVENT
// returned (struct rdma_ucm_event_resp as the kernel fills it).

// fakeCmd is one command the fake kernel read.
type fakeCmd struct {
	cmd    uint32
	handle uint32 // the ID's handle, or the group's for LEAVE_MCAST
	uid    uint64 // JOIN_MCAST's uid
}

func (c fakeCmd) String() string {
	name := map[uint32]string{
		ioctl.RDMA_USER_CM_CMD_JOIN_MCAST:  "JOIN_MCAST",
		ioctl.RDMA_USER_CM_CMD_LEAVE_MCAST: "LEAVE_MCAST",
		ioctl.RDMA_USER_CM_CMD_DESTROY_ID:  "DESTROY_ID",
	}[c.cmd]
	if name == "" {
		name = fmt.Sprintf("command %d", c.cmd)
	}
	return fmt.Sprintf("%s(handle %d, uid %d)", name, c.handle, c.uid)
}

// fakeKernel reads what a pipe Channel writes. With answerJoins it answers
// each JOIN_MCAST as the kernel does once the join is made: a
// MULTICAST_JOIN event with the join's uid.
type fakeKernel struct {
	ch          *Channel
	r, w        *os.File
	answerJoins bool
	done        chan struct{}

	mu   sync.Mutex
	cmds []fakeCmd
}

func newFakeKernel(t *testing.T, answerJoins bool) *fakeKernel {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := w.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	ch := &Channel{file: w, rc: rc, ids: map[uint64]*ID{}, mcs: map[uint64]*Multicast{}, done: make(chan struct{})}
	k := &fakeKernel{ch: ch, r: r, w: w, answerJoins: answerJoins, done: make(chan struct{})}
	go k.run()
	t.Cleanup(func() { k.stop() })
	return k
}

func (k *fakeKernel) run() {
	defer close(k.done)
	var hdr [ioctl.SizeofUcmCmdHdr]byte
	for {
		if _, err := io.ReadFull(k.r, hdr[:]); err != nil {
			return
		}
		body := make([]byte, binary.NativeEndian.Uint16(hdr[4:]))
		if _, err := io.ReadFull(k.r, body); err != nil {
			return
		}
		c := fakeCmd{cmd: binary.NativeEndian.Uint32(hdr[0:])}
		switch c.cmd {
		case ioctl.RDMA_USER_CM_CMD_JOIN_MCAST:
			var j ioctl.UcmJoinMcast
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&j)), ioctl.SizeofUcmJoinMcast), body)
			c.handle, c.uid = j.Id, j.Uid
		case ioctl.RDMA_USER_CM_CMD_LEAVE_MCAST, ioctl.RDMA_USER_CM_CMD_DESTROY_ID:
			var d ioctl.UcmDestroyID
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&d)), ioctl.SizeofUcmDestroyID), body)
			c.handle = d.Id
		}
		k.mu.Lock()
		k.cmds = append(k.cmds, c)
		k.mu.Unlock()
		if c.cmd == ioctl.RDMA_USER_CM_CMD_JOIN_MCAST && k.answerJoins {
			k.ch.dispatch(&ioctl.UcmEventResp{Uid: c.uid, Event: uint32(MulticastJoin)})
		}
	}
}

// stop closes the channel's end and returns the commands, all of them
// read.
func (k *fakeKernel) stop() []fakeCmd {
	k.w.Close()
	<-k.done
	k.r.Close()
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cmds
}

func (k *fakeKernel) newID(ps PortSpace, ud bool, handle uint32) *ID {
	k.ch.mu.Lock()
	defer k.ch.mu.Unlock()
	return k.ch.newIDLocked(ps, ud, handle)
}

// TestJoinRacesClose: JoinMulticast of several groups racing the ID's
// Close. Every join either completes before the destroy (and Close
// leaves its group) or returns an error matching ErrClosed; no
// JOIN_MCAST or LEAVE_MCAST is written after DESTROY_ID (its handle, and
// the groups' handles, are free for the kernel to give to the next ID or
// group made), every group joined is left before it, and no group is
// left in the channel's or the ID's tables.
func TestJoinRacesClose(t *testing.T) {
	const rounds, joiners = 2000, 4
	bad := 0
	for round := range rounds {
		// A hang bound, a round's own: a round takes microseconds on the
		// host and a few ms under -race in the TCG guest, where 2000
		// rounds took 10-14 s and one bound for them all ran out.
		ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(10*time.Second))
		k := newFakeKernel(t, true)
		id := k.newID(UDP, true, 7)
		start := make(chan struct{})
		errs := make([]error, joiners)
		var wg sync.WaitGroup
		for i := range joiners {
			wg.Go(func() {
				<-start
				_, errs[i] = id.JoinMulticast(ctx, netip.AddrFrom4([4]byte{239, 1, 9, byte(i + 1)}), JoinOptions{})
			})
		}
		var closeErr error
		wg.Go(func() {
			<-start
			for range rand.IntN(40) {
				runtime.Gosched()
			}
			closeErr = id.Close()
		})
		close(start)
		wg.Wait()
		cancel()
		cmds := k.stop()
		fail := func(format string, a ...any) {
			bad++
			if bad <= 5 {
				t.Errorf("round %d: "+format+"; commands: %v", append(append([]any{round}, a...), cmds)...)
			}
		}
		if closeErr != nil {
			fail("Close: %v", closeErr)
		}
		for i, err := range errs {
			if err != nil && !errors.Is(err, ErrClosed) {
				fail("join %d: %v, want success or ErrClosed", i, err)
			}
		}
		destroyed, joins, leaves := false, 0, 0
		for _, c := range cmds {
			switch c.cmd {
			case ioctl.RDMA_USER_CM_CMD_DESTROY_ID:
				destroyed = true
			case ioctl.RDMA_USER_CM_CMD_JOIN_MCAST, ioctl.RDMA_USER_CM_CMD_LEAVE_MCAST:
				if destroyed {
					fail("%v written after DESTROY_ID", c)
				}
				if c.cmd == ioctl.RDMA_USER_CM_CMD_JOIN_MCAST {
					joins++
				} else {
					leaves++
				}
			}
		}
		if !destroyed {
			fail("no DESTROY_ID")
		}
		if joins != leaves {
			fail("%d groups joined, %d left", joins, leaves)
		}
		k.ch.mu.Lock()
		nmcs := len(k.ch.mcs)
		k.ch.mu.Unlock()
		if nmcs != 0 || len(id.Multicasts()) != 0 || k.ch.IDs() != 0 {
			fail("after Close: %d groups on the channel, %d on the ID, %d IDs", nmcs, len(id.Multicasts()), k.ch.IDs())
		}
	}
	if bad > 0 {
		t.Errorf("%d failures in %d rounds", bad, rounds)
	}
}

// TestLeaveDuringJoin: LeaveMulticast of a group whose join waits for its
// event. The kernel drops the group's events with LEAVE_MCAST, so the
// join's never comes: the join ends at once with an error matching
// ErrNotJoined, not at its context's end.
func TestLeaveDuringJoin(t *testing.T) {
	k := newFakeKernel(t, false) // the join's event is late: it never comes
	id := k.newID(UDP, true, 7)
	group := netip.MustParseAddr("239.1.9.9")
	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(10*time.Second))
	defer cancel()
	res := make(chan error, 1)
	go func() {
		_, err := id.JoinMulticast(ctx, group, JoinOptions{})
		res <- err
	}()
	// Wait for the join to be made (its JOIN_MCAST written, the group on the ID).
	for len(id.Multicasts()) == 0 {
		select {
		case err := <-res:
			t.Fatalf("join returned before it was left: %v", err)
		case <-ctx.Done():
			t.Fatal("the join was not made")
		case <-time.After(time.Millisecond):
		}
	}
	if err := id.LeaveMulticast(group); err != nil {
		t.Fatalf("leave: %v", err)
	}
	err := <-res
	if !errors.Is(err, ErrNotJoined) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("join left while it waited: %v, want ErrNotJoined at once", err)
	}
	k.ch.mu.Lock()
	nmcs := len(k.ch.mcs)
	k.ch.mu.Unlock()
	if nmcs != 0 || len(id.Multicasts()) != 0 {
		t.Errorf("%d groups on the channel, %d on the ID", nmcs, len(id.Multicasts()))
	}
	if err := id.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	leaves := 0
	for _, c := range k.stop() {
		if c.cmd == ioctl.RDMA_USER_CM_CMD_LEAVE_MCAST {
			leaves++
		}
	}
	if leaves != 1 {
		t.Errorf("%d LEAVE_MCAST written, want 1", leaves)
	}
}

// feed hands the ID an event as the channel's reader would after GET_EVENT.
func feed(id *ID, t EventType, status int32) {
	id.ch.dispatch(&ioctl.UcmEventResp{Uid: id.uid, Id: id.handle, Event: uint32(t), Status: uint32(status)})
}

// TestWaitDisconnectTerminal: WaitDisconnect ends on every event after
// which no DISCONNECTED comes: DEVICE_REMOVAL (the kernel destroys its
// cm_id and reports nothing more), a reject of the established
// connection, TIMEWAIT_EXIT (the connection's last event: its DISCONNECTED
// was taken before). Events that are not the end (ADDR_CHANGE) are passed
// over.
func TestWaitDisconnectTerminal(t *testing.T) {
	// One hang bound for all cases: each ends at once.
	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(10*time.Second))
	defer cancel()
	for _, c := range []struct {
		name   string
		events []EventType
		status int32
		want   error // nil: no error
	}{
		{"disconnected", []EventType{AddrChange, Disconnected}, 0, nil},
		{"device removal", []EventType{AddrChange, DeviceRemoval}, 0, ErrDeviceRemoved},
		{"rejected", []EventType{Rejected}, RejectStaleConn, ErrRejected},
		{"connect error", []EventType{ConnectError}, -110, ErrConnect},
		{"timewait exit", []EventType{TimewaitExit}, 0, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			id, _ := pipeID(t, TCP, false)
			for _, e := range c.events {
				feed(id, e, c.status)
			}
			err := id.WaitDisconnect(ctx)
			switch {
			case c.want == nil && err != nil:
				t.Errorf("%v, want nil", err)
			case c.want != nil && !errors.Is(err, c.want):
				t.Errorf("%v, want an error matching %v", err, c.want)
			}
			var ee *EventError
			if c.want != nil && !errors.As(err, &ee) {
				t.Errorf("%v is no *EventError", err)
			}
		})
	}
	// A waiter already waiting when the device goes.
	id, _ := pipeID(t, TCP, false)
	res := make(chan error, 1)
	go func() { res <- id.WaitDisconnect(ctx) }()
	feed(id, DeviceRemoval, 0)
	if err := <-res; !errors.Is(err, ErrDeviceRemoved) || err == nil || !strings.Contains(err.Error(), "device removed") {
		t.Errorf("waiting when the device was removed: %v, want ErrDeviceRemoved saying so", err)
	}
}

// TestWaitAfterDeviceRemoval: once DEVICE_REMOVAL was taken (by Wait),
// the kernel reports nothing more for the ID: a later Wait, WaitDisconnect
// or GetRequest ends at once with ErrDeviceRemoved instead of waiting for
// its context.
func TestWaitAfterDeviceRemoval(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(10*time.Second))
	defer cancel()
	id, _ := pipeID(t, TCP, false)
	feed(id, Established, 0)
	feed(id, DeviceRemoval, 0)
	for _, want := range []EventType{Established, DeviceRemoval} {
		ev, err := id.Wait(ctx)
		if err != nil || ev.Type != want {
			t.Fatalf("Wait: %v, %v; want %v", ev, err, want)
		}
	}
	for name, wait := range map[string]func() error{
		"Wait":           func() error { _, err := id.Wait(ctx); return err },
		"WaitDisconnect": func() error { return id.WaitDisconnect(ctx) },
		"GetRequest":     func() error { _, err := id.GetRequest(ctx); return err },
	} {
		if err := wait(); !errors.Is(err, ErrDeviceRemoved) {
			t.Errorf("%s after DEVICE_REMOVAL: %v, want ErrDeviceRemoved", name, err)
		}
	}
}

// TestJoinDeviceRemoval: a join waiting for its event when the device
// goes ends with ErrDeviceRemoved, and its group is untracked without a
// LEAVE_MCAST (the kernel left it with its cm_id; it would refuse the
// leave, ENXIO).
func TestJoinDeviceRemoval(t *testing.T) {
	k := newFakeKernel(t, false)
	id := k.newID(UDP, true, 7)
	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(10*time.Second))
	defer cancel()
	res := make(chan error, 1)
	go func() {
		_, err := id.JoinMulticast(ctx, netip.MustParseAddr("239.1.9.8"), JoinOptions{})
		res <- err
	}()
	for len(id.Multicasts()) == 0 {
		select {
		case err := <-res:
			t.Fatalf("join returned before the removal: %v", err)
		case <-ctx.Done():
			t.Fatal("the join was not made")
		case <-time.After(time.Millisecond):
		}
	}
	feed(id, DeviceRemoval, 0)
	if err := <-res; !errors.Is(err, ErrDeviceRemoved) {
		t.Errorf("join when the device went: %v, want ErrDeviceRemoved", err)
	}
	k.ch.mu.Lock()
	nmcs := len(k.ch.mcs)
	k.ch.mu.Unlock()
	if nmcs != 0 || len(id.Multicasts()) != 0 {
		t.Errorf("%d groups on the channel, %d on the ID", nmcs, len(id.Multicasts()))
	}
	if err := id.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	for _, c := range k.stop() {
		if c.cmd == ioctl.RDMA_USER_CM_CMD_LEAVE_MCAST {
			t.Errorf("%v written after DEVICE_REMOVAL", c)
		}
	}
}

// TestStepKeepsOtherEvents: the events a step's wait passes over stay
// queued for Wait, in order. A group's MULTICAST_ERROR after its join
// (the group is no longer accessible: librdmacm hands it to the
// application, which leaves and joins again) and an ADDR_CHANGE that came
// while ResolveRoute (or any other step) waited were dropped: Wait never
// saw them and waited for its context. The group stays joined until
// LeaveMulticast, which still leaves it in the kernel.
func TestStepKeepsOtherEvents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(10*time.Second))
	defer cancel()
	k := newFakeKernel(t, true)
	id := k.newID(UDP, true, 7)
	group := netip.MustParseAddr("239.1.9.7")
	m, err := id.JoinMulticast(ctx, group, JoinOptions{})
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	etimedout := int32(-110)
	k.ch.dispatch(&ioctl.UcmEventResp{Uid: m.uid, Event: uint32(MulticastError), Status: uint32(etimedout)})
	feed(id, AddrChange, 0)
	feed(id, RouteResolved, 0)
	if err := id.ResolveRoute(ctx); err != nil {
		t.Fatalf("resolve route: %v", err)
	}
	for _, want := range []EventType{MulticastError, AddrChange} {
		ev, err := id.Wait(ctx)
		if err != nil || ev.Type != want {
			t.Fatalf("Wait after the step: %v, %v; want %v", ev, err, want)
		}
		if want == MulticastError && ev.Multicast != m {
			t.Errorf("MULTICAST_ERROR for %v, want %v", ev.Multicast, m)
		}
	}
	if ms := id.Multicasts(); len(ms) != 1 || ms[0] != m {
		t.Errorf("after the group's MULTICAST_ERROR the ID has %v, want %v until it is left", ms, m)
	}
	if err := id.LeaveMulticast(group); err != nil {
		t.Errorf("leave after MULTICAST_ERROR: %v", err)
	}
	if err := id.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	leaves := 0
	for _, c := range k.stop() {
		if c.cmd == ioctl.RDMA_USER_CM_CMD_LEAVE_MCAST {
			leaves++
		}
	}
	if leaves != 1 {
		t.Errorf("%d LEAVE_MCAST written, want 1", leaves)
	}
}

// TestStepRequeuesInOrder: events passed over by a step go back ahead of
// those that came after them, in the order they came; a listener's
// GetRequest passes over an ADDR_CHANGE and Wait returns it after.
func TestStepRequeuesInOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(10*time.Second))
	defer cancel()
	id, _ := pipeID(t, TCP, false)
	feed(id, AddrChange, 0)
	feed(id, TimewaitExit, 0)
	feed(id, ConnectRequest, 0)
	feed(id, Established, 0)
	ev, err := id.GetRequest(ctx)
	if err != nil || ev.Type != ConnectRequest || ev.ID == nil {
		t.Fatalf("GetRequest: %v, %v", ev, err)
	}
	ev.ID.Close()
	for _, want := range []EventType{AddrChange, TimewaitExit, Established} {
		ev, err := id.Wait(ctx)
		if err != nil || ev.Type != want {
			t.Fatalf("Wait after GetRequest: %v, %v; want %v", ev, err, want)
		}
	}
}
