package cq

import "github.com/goverbs/goverbs/internal/uvobj"

// HoldClose takes the lock Close takes, as a Close in progress holds it,
// for the tests of what must wait for a Close. closeHeld, called with it
// held, closes the CQ as Close would (destroyed, marked closed, untracked,
// its ring unmapped and its channel let go); unlock releases the lock.
func HoldClose(q *CQ) (closeHeld func() error, unlock func()) {
	q.once.Lock()
	return func() error {
		if err := q.destroy(); err != nil {
			return err
		}
		q.once.MarkClosed()
		t := uvobj.Of(q.ctx).Objects
		t.Untrack(q)
		t.ReleaseUserHandle(q.user)
		return q.release()
	}, q.once.Unlock
}
