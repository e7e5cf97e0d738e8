package qp

import (
	"fmt"

	"github.com/goverbs/goverbs/internal/uvobj"
)

// HoldClose takes the lock Close takes, as a Close in progress holds it,
// for the tests of what must wait for a Close. closeHeld, called with it
// held, closes the object as Close would (the kernel object destroyed,
// marked closed, untracked, its queues unmapped); unlock releases it.
func HoldClose(obj any) (closeHeld func() error, unlock func()) {
	switch o := obj.(type) {
	case *QP:
		o.once.Lock()
		return func() error {
			return closeHeldObj(&o.once, uvobj.Of(o.ctx).Objects, o, o.user, o.destroyHooked, o.drv.Close)
		}, o.once.Unlock
	case *SRQ:
		o.once.Lock()
		return func() error {
			return closeHeldObj(&o.once, uvobj.Of(o.ctx).Objects, o, o.user, o.destroy, o.drv.Close)
		}, o.once.Unlock
	}
	panic(fmt.Sprintf("qp: HoldClose of a %T", obj))
}

// closeHeldObj is uvobj.Once.Close's sequence without taking the lock.
func closeHeldObj(o *uvobj.Once, t *uvobj.Table, obj interface{ Close() error }, user uint64, destroy, after func() error) error {
	if err := destroy(); err != nil {
		return err
	}
	o.MarkClosed()
	t.Untrack(obj)
	if user != 0 {
		t.ReleaseUserHandle(user)
	}
	return after()
}

// CheckModify is Modify's check of attr before the kernel sees it, on a
// QP with no device: masks without port, AV or path MTU need none.
func CheckModify(attr *Attr, mask AttrMask) error { return (&QP{}).check(attr, mask) }

// CheckUD is PostSend's check of a UD batch, on a QP whose path MTU is 0.
func CheckUD(wrs []SendWR) error { return (&QP{}).checkUD(wrs) }
