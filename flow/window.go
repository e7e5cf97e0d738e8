package flow

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// Limits bound the messages and bytes outstanding in a Window. Zero means
// unlimited.
type Limits struct {
	Msgs  int64
	Bytes int64
}

// maxDepth bounds a window tree's height (a waiter's blocked levels are a
// bit mask).
const maxDepth = 32

// WindowStats are cumulative counters of one Window (acquisitions through
// it, including those started at a child).
type WindowStats struct {
	Acquired  uint64        // messages admitted
	Stalls    uint64        // Acquire calls that had to wait (counted at the leaf)
	Cancelled uint64        // waits ended by their context (leaf)
	WaitTime  time.Duration // total time spent in waits that ended (leaf)
	Waiting   uint64        // Acquire calls waiting now at this leaf (not cumulative)
	Oversize  uint64        // messages larger than Limits.Bytes admitted alone
}

// wtree is what all windows of one hierarchy share: one lock, so acquiring
// a leaf and all its ancestors is atomic without lock ordering, and one
// FIFO of waiters.
type wtree struct {
	mu sync.Mutex
	q  waitq
}

// Window is a software send window bounding the messages and bytes
// outstanding (posted, not yet completed) at one level: an endpoint, or a QP
// under it. Windows form a tree (NewChild); acquiring at a window acquires
// at it and every ancestor atomically, all or nothing.
//
// Fairness: waiters are served in FIFO order per window. A waiter blocks
// later requests only at the windows where it does not fit, so a full QP
// window does not stall its siblings, while a large message waiting for its
// endpoint window keeps smaller later ones from overtaking it there.
//
// A message larger than Limits.Bytes is admitted alone: when the window has
// no bytes outstanding, and nothing else fits while it is outstanding. It
// is never rejected (a parameter-server tensor may be larger than any
// sensible window) and never starves (it blocks later requests while it
// waits).
//
// It is safe for concurrent use.
//
// Make one with NewWindow or NewChild: a nil or zero Window admits
// nothing, and its methods that return an error return one that is
// goverbs.ErrNil.
type Window struct {
	t      *wtree    // set by NewWindow and NewChild, never written again: nil in a zero Window (bad)
	path   []*Window // this window, then its ancestors
	lim    Limits
	closed bool

	msgs, bytes int64
	blocked     int32 // queued waiters blocked at this window
	st          WindowStats
}

// NewWindow returns a root window (an endpoint's).
func NewWindow(l Limits) *Window {
	w := &Window{t: new(wtree), lim: l}
	w.path = []*Window{w}
	return w
}

// NewChild returns a window under w (a QP's under its endpoint's): an
// acquire at the child also acquires at w and w's ancestors. A tree is at
// most 32 windows deep (a root and 31 levels of children). It returns nil
// when w is nil or zero, or already 32 deep (w's ancestors and w): a nil
// Window admits nothing, and its methods' errors are goverbs.ErrNil.
func (w *Window) NewChild(l Limits) *Window {
	if w.bad() || len(w.path) >= maxDepth {
		return nil
	}
	c := &Window{t: w.t, lim: l}
	c.path = append([]*Window{c}, w.path...)
	return c
}

// Limits returns the window's limits.
func (w *Window) Limits() Limits {
	if w.bad() {
		return Limits{}
	}
	return w.lim
}

// Outstanding returns the messages and bytes outstanding at this window
// (including those acquired through its children).
func (w *Window) Outstanding() (msgs, bytes int64) {
	if w.bad() {
		return 0, 0
	}
	w.t.mu.Lock()
	defer w.t.mu.Unlock()
	return w.msgs, w.bytes
}

// Stats returns a snapshot of the counters.
func (w *Window) Stats() WindowStats {
	if w.bad() {
		return WindowStats{}
	}
	w.t.mu.Lock()
	defer w.t.mu.Unlock()
	st := w.st
	for wt := w.t.q.head; wt != nil; wt = wt.next {
		if wt.win == w {
			st.Waiting++
		}
	}
	return st
}

// fits reports whether m messages of b bytes in all fit now. More than
// the limit of messages, like more bytes than the limit, are admitted
// alone (with nothing outstanding). What would carry a count past
// MaxInt64 does not fit, limited or not: it waits for releases (alone, it
// always fits). The comparisons subtract, so no sum can wrap.
func (w *Window) fits(m, b int64) bool {
	if m > math.MaxInt64-w.msgs || b > math.MaxInt64-w.bytes {
		return false
	}
	if w.lim.Msgs > 0 && w.msgs > 0 && m > w.lim.Msgs-w.msgs {
		return false
	}
	return w.lim.Bytes <= 0 || w.bytes == 0 || b <= w.lim.Bytes-w.bytes
}

// admissible: every level fits and nobody queued is blocked at it.
func (w *Window) admissible(m, b int64) bool {
	for _, x := range w.path {
		if x.closed || x.blocked > 0 || !x.fits(m, b) {
			return false
		}
	}
	return true
}

func (w *Window) take(m, b int64) {
	for _, x := range w.path {
		x.msgs += m
		x.bytes += b
		x.st.Acquired += uint64(m)
		if x.lim.Bytes > 0 && b > x.lim.Bytes {
			x.st.Oversize++
		}
	}
}

func (w *Window) isClosed() bool {
	for _, x := range w.path {
		if x.closed {
			return true
		}
	}
	return false
}

// TryAcquire admits one message of b bytes if it fits now at every level
// and no earlier waiter is blocked at any of them. It never blocks.
func (w *Window) TryAcquire(b int64) bool { return w.TryAcquireN(1, b) }

// TryAcquireN is TryAcquire of m messages of b bytes in all, all or
// nothing (a message sent in m parts, each released on its own).
func (w *Window) TryAcquireN(m, b int64) bool {
	if w.bad() {
		return false
	}
	if b < 0 || m < 1 {
		return false
	}
	w.t.mu.Lock()
	ok := w.admissible(m, b)
	if ok {
		w.take(m, b)
	}
	w.t.mu.Unlock()
	return ok
}

// Acquire admits one message of b bytes, waiting (FIFO per window) until it
// fits at every level, ctx is done (ctx.Err() is returned and nothing is
// held) or a window on the path is closed (ErrClosed). A nil ctx is
// refused with an error.
func (w *Window) Acquire(ctx context.Context, b int64) error { return w.acquire(ctx, 1, b, false) }

// AcquireN is Acquire of m messages of b bytes in all, admitted together
// (all or nothing, one place in the queue): a message sent in m parts,
// whose parts Release one at a time. m messages over Limits.Msgs are
// admitted alone, as oversize bytes are.
func (w *Window) AcquireN(ctx context.Context, m, b int64) error { return w.acquire(ctx, m, b, true) }

// acquire is Acquire and AcquireN (isN says which, for the error of a
// nil ctx alone).
func (w *Window) acquire(ctx context.Context, m, b int64, isN bool) error {
	if w.bad() {
		return errNilWindow
	}
	if ctx == nil {
		if isN {
			return errNilCtxWindowAcquireN
		}
		return errNilCtxWindowAcquire
	}
	if b < 0 || m < 1 {
		return fmt.Errorf("flow: window acquire of %d messages, %d bytes", m, b)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	t := w.t
	t.mu.Lock()
	if w.isClosed() {
		t.mu.Unlock()
		return ErrClosed
	}
	if w.admissible(m, b) {
		w.take(m, b)
		t.mu.Unlock()
		return nil
	}
	wt := &waiter{n: uint64(b), msgs: m, win: w, ready: make(chan struct{})}
	t.q.push(wt)
	w.mark(wt)
	w.st.Stalls++
	start := now() // under the lock: a counted stall has its start time
	t.mu.Unlock()

	select {
	case <-wt.ready:
		t.mu.Lock()
		w.st.WaitTime += now().Sub(start)
		t.mu.Unlock()
		return wt.err
	case <-ctx.Done():
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	w.st.WaitTime += now().Sub(start)
	w.st.Cancelled++
	switch {
	case wt.granted:
		// Granted as we were cancelled: give it back, and take back what
		// take counted.
		w.put(m, b)
		for _, x := range w.path {
			x.st.Acquired -= uint64(m)
			if x.lim.Bytes > 0 && b > x.lim.Bytes {
				x.st.Oversize--
			}
		}
		t.dispatch()
	case wt.err == nil:
		t.q.remove(wt)
		wt.unmark()
		t.dispatch()
	}
	return ctx.Err()
}

// mark records at which levels wt (just queued, or being rescanned) is
// blocked: where it does not fit or an earlier waiter is blocked.
func (w *Window) mark(wt *waiter) {
	b := int64(wt.n)
	var m uint32
	for i, x := range w.path {
		if x.blocked > 0 || !x.fits(wt.msgs, b) {
			m |= 1 << i
		}
	}
	for i, x := range w.path {
		if m&(1<<i) != 0 {
			x.blocked++
		}
	}
	wt.mask = m
}

func (wt *waiter) unmark() {
	for i, x := range wt.win.path {
		if wt.mask&(1<<i) != 0 {
			x.blocked--
		}
	}
	wt.mask = 0
}

// dispatch rescans the queue in FIFO order, admitting every waiter that is
// admissible given the waiters before it.
func (t *wtree) dispatch() {
	if t.q.n == 0 {
		return
	}
	for wt := t.q.head; wt != nil; wt = wt.next {
		wt.unmark()
	}
	for wt := t.q.head; wt != nil; {
		next := wt.next
		w := wt.win
		if w.admissible(wt.msgs, int64(wt.n)) {
			t.q.remove(wt)
			w.take(wt.msgs, int64(wt.n))
			wt.wake(nil)
		} else {
			w.mark(wt)
		}
		wt = next
	}
}

func (w *Window) put(m, b int64) {
	for _, x := range w.path {
		x.msgs -= m
		x.bytes -= b
	}
}

// Release returns one completed message of b bytes (the size it was
// acquired with) to w and its ancestors. Releasing more than is
// outstanding at any level changes nothing and returns ErrOverRelease.
func (w *Window) Release(b int64) error { return w.ReleaseN(1, b) }

// ReleaseN returns m messages of b bytes in all at once: what an AcquireN
// took, when none of its parts went out.
func (w *Window) ReleaseN(m, b int64) error {
	if w.bad() {
		return errNilWindow
	}
	t := w.t
	t.mu.Lock()
	for _, x := range w.path {
		if m < 1 || b < 0 || x.msgs < m || x.bytes < b {
			err := fmt.Errorf("%w: %d messages of %d bytes with %d messages, %d bytes outstanding",
				ErrOverRelease, m, b, x.msgs, x.bytes)
			t.mu.Unlock()
			return err
		}
	}
	w.put(m, b)
	t.dispatch()
	t.mu.Unlock() // not deferred: once per message
	return nil
}

// Close fails waiting and future acquires through w (and its children)
// with ErrClosed. Outstanding messages can still be released. Idempotent.
func (w *Window) Close() {
	if w.bad() {
		return
	}
	t := w.t
	t.mu.Lock()
	defer t.mu.Unlock()
	w.closed = true
	for wt := t.q.head; wt != nil; {
		next := wt.next
		if wt.win.isClosed() {
			t.q.remove(wt)
			wt.unmark()
			wt.wake(ErrClosed)
		}
		wt = next
	}
	t.dispatch()
}
