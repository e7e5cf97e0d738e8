package cm_test

import (
	"context"
	"errors"
	"os/exec"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/qp"
)

// Device removal: `rdma link delete rxe1` under a running program. These
// tests delete rxe1 and add it back (rxetest.RemoveDevice) before they
// end, so the package's other tests find it as before.
//
// What the kernel (6.1) does: rdma_cm reports DEVICE_REMOVAL to every ID
// bound to the device and destroys the kernel's side of the ID itself
// (ucma's close work), so an ID of ours never holds the delete; the
// uverbs side (rxe has no disassociate_ucontext) waits until every
// descriptor of the device is closed, so a uverbs.Context on the device
// holds the delete until it is closed.

// TestRdmaTool: the guest has iproute2's rdma, which the removal tests
// need to delete and restore a device.
func TestRdmaTool(t *testing.T) {
	needCM(t)
	out, err := exec.Command("rdma", "link").CombinedOutput()
	if err != nil {
		t.Fatalf("rdma link: %v: %s", err, out)
	}
	t.Logf("rdma link:\n%s", out)
}

// waitRemoval waits for id's next event and checks it is DEVICE_REMOVAL.
func waitRemoval(ctx context.Context, t *testing.T, what string, id *cm.ID, start time.Time) {
	t.Helper()
	ev, err := id.Wait(ctx)
	if err != nil {
		t.Fatalf("%s: waiting for DEVICE_REMOVAL: %v (%v)", what, err, context.Cause(ctx))
	}
	if ev.Type != cm.DeviceRemoval {
		t.Fatalf("%s: event %v, want DEVICE_REMOVAL", what, ev.Type)
	}
	t.Logf("%8.3fs %s: %v", time.Since(start).Seconds(), what, ev.Type)
	// Nothing comes after it: a further wait says so at once.
	if _, err := id.Wait(ctx); !errors.Is(err, cm.ErrDeviceRemoved) {
		t.Errorf("%s: wait after DEVICE_REMOVAL: %v, want ErrDeviceRemoved", what, err)
	}
}

// TestRemoveListener: a listener bound to rxe1, its GetRequest waiting,
// when rxe1 is deleted: GetRequest ends with DEVICE_REMOVAL's error
// (ErrDeviceRemoved), a later wait too; the delete finishes while the ID
// and its channel are still open (the kernel destroyed its side of the
// ID), and Close after it succeeds, leaving no cm_id.
func TestRemoveListener(t *testing.T) {
	needCM(t)
	ctx, _ := hang.For(t, "", 20*time.Second)
	base := rxetest.CMIDs()
	r := rxetest.RemoveDevice(t, "rxe1") // restored after the closes below
	ch := openChannel(t)
	lis, err := ch.CreateIDType(cm.TCP, qp.RC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	listen(t, lis, 4)
	// A server waiting for a connect request when the device goes.
	res := make(chan error, 1)
	go func() {
		_, err := lis.GetRequest(ctx)
		res <- err
	}()
	r.Delete(t)
	var ee *cm.EventError
	if err := <-res; !errors.Is(err, cm.ErrDeviceRemoved) || !errors.As(err, &ee) || ee.Event.Type != cm.DeviceRemoval {
		t.Fatalf("GetRequest when the device went: %v (%v), want an *EventError of DEVICE_REMOVAL matching ErrDeviceRemoved", err, context.Cause(ctx))
	} else {
		t.Logf("%8.3fs GetRequest: %v", time.Since(r.Start).Seconds(), err)
	}
	if _, err := lis.Wait(ctx); !errors.Is(err, cm.ErrDeviceRemoved) {
		t.Errorf("wait after DEVICE_REMOVAL: %v, want ErrDeviceRemoved", err)
	}
	if !r.WaitFinished(20 * time.Second) {
		t.Fatalf("rdma link delete rxe1 still blocked with only a removed listener open:\n%s", rxetest.Table())
	}
	if err := lis.Close(); err != nil {
		t.Errorf("close of the removed listener: %v", err)
	}
	if n := rxetest.CMIDs(); base >= 0 && n != base {
		t.Errorf("%d cm_ids after the removal, %d before:\n%s", n, base, rxetest.CMIDTable())
	}
}

// TestRemoveConnected: an RC connection from rxe0 to a listener on rxe1,
// with QPs on both ends; rxe1 is deleted. The listener and the accepted
// ID report DEVICE_REMOVAL; the delete waits for the server's uverbs
// context (its QP, CQ, PD, MR); once the test closes what it holds on
// rxe1 the delete finishes, every Close succeeding. The client's ID on
// rxe0 is logged (what it sees is the kernel's affair) and closed.
func TestRemoveConnected(t *testing.T) {
	needCM(t)
	ctx, _ := hang.For(t, "", 20*time.Second)
	r := rxetest.RemoveDevice(t, "rxe1")
	sch, cch := openChannel(t), openChannel(t)
	lis, err := sch.CreateIDType(cm.TCP, qp.RC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	dst := listen(t, lis, 4)
	cli, err := cch.CreateIDType(cm.TCP, qp.RC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	resolve(ctx, t, cli, dst)
	c := newEnd(t, cli)
	cres := make(chan error, 1)
	go func() {
		_, err := cli.Connect(ctx, cm.ConnParam{ResponderResources: 1, InitiatorDepth: 1})
		cres <- err
	}()
	req, err := lis.GetRequest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := newEnd(t, req.ID)
	if _, err := req.ID.Accept(ctx, cm.ConnParam{}); err != nil {
		t.Fatal(err)
	}
	if err := <-cres; err != nil {
		t.Fatal(err)
	}

	r.Delete(t)
	waitRemoval(ctx, t, "listener", lis, r.Start)
	waitRemoval(ctx, t, "accepted ID", req.ID, r.Start)
	if r.Finished() {
		out, took, err := r.Result()
		t.Fatalf("rdma link delete rxe1 returned (after %v: %v %s) with a uverbs context of rxe1 open; the kernel waits for those", took, err, out)
	}
	for what, f := range map[string]func() error{"listener": lis.Close, "accepted ID": req.ID.Close, "rxe1 context": s.ctx.Close} {
		if err := f(); err != nil {
			t.Errorf("close %s after the removal: %v", what, err)
		}
	}
	if !r.WaitFinished(20 * time.Second) {
		t.Fatalf("rdma link delete rxe1 still blocked after everything on rxe1 was closed:\n%s", rxetest.Table())
	}
	t.Logf("%8.3fs delete finished", time.Since(r.Start).Seconds())
	wctx, cancel := context.WithTimeout(ctx, hang.Scale(2*time.Second))
	ev, err := cli.Wait(wctx)
	cancel()
	t.Logf("client on rxe0 after the removal: %v %v; QP %v", ev.Type, err, c.qp.State())
}
