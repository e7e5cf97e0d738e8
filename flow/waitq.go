package flow

import (
	"sync/atomic"
	"time"
)

// clock, if set, replaces time.Now in stall accounting (tests).
var clock atomic.Pointer[func() time.Time]

// now is the clock of stall accounting (WaitTime).
func now() time.Time {
	if f := clock.Load(); f != nil {
		return (*f)()
	}
	return time.Now()
}

// waiter is one blocked Acquire. It is allocated only on the slow path.
type waiter struct {
	n     uint64  // credits or bytes wanted
	win   *Window // Window waiters: the leaf window
	msgs  int64   // Window waiters: messages wanted
	mask  uint32  // Window waiters: path levels this waiter is blocked at
	epoch uint32  // Credits waiters: epoch the grant was made in

	ready   chan struct{} // closed when granted or failed
	granted bool
	err     error

	prev, next *waiter
}

// waitq is an intrusive FIFO of waiters; removal from the middle is O(1)
// (a cancelled waiter).
type waitq struct {
	head, tail *waiter
	n          int
}

func (q *waitq) push(w *waiter) {
	w.prev, w.next = q.tail, nil
	if q.tail == nil {
		q.head = w
	} else {
		q.tail.next = w
	}
	q.tail = w
	q.n++
}

func (q *waitq) remove(w *waiter) {
	if w.prev == nil {
		q.head = w.next
	} else {
		w.prev.next = w.next
	}
	if w.next == nil {
		q.tail = w.prev
	} else {
		w.next.prev = w.prev
	}
	w.prev, w.next = nil, nil
	q.n--
}

// wake completes a waiter that has already been removed from its queue.
func (w *waiter) wake(err error) {
	w.granted = err == nil
	w.err = err
	close(w.ready)
}
