package flow

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// ControlReserve is the number of credits per peer that data messages may
// never use: the last credit is kept for an explicit credit update, so two
// peers whose buffers are full of each other's data can always tell each
// other about re-posted buffers. See the package documentation.
const ControlReserve = 1

// CreditsConfig configures the sender side of one peer.
type CreditsConfig struct {
	// Epoch is the starting epoch (usually 0).
	Epoch uint32
	// Initial is the cumulative grant known from connection setup: the
	// number of receive buffers the peer posted for us, including the
	// control reserve slot.
	Initial uint64
	// MaxGrant is the most credits the receiver can have outstanding for us
	// (its posted buffers for this peer). A grant that would leave more
	// than MaxGrant unconsumed is rejected with ErrImpossibleGrant; an
	// Acquire that could never fit returns ErrTooLarge. 0 disables both.
	MaxGrant uint64
	// InOrderGrants says grants arrive in the order they were issued (one
	// RC QP per peer). A smaller cumulative grant in the same epoch is then
	// an error (ErrGrantBackwards). Leave it false when grants ride on
	// several QPs of the peer: they can arrive reordered, and a smaller
	// value is just stale and ignored.
	InOrderGrants bool
}

// CreditStats are cumulative counters of a Credits.
type CreditStats struct {
	Acquired    uint64        // data credits handed out
	Control     uint64        // credits taken by TryAcquireControl
	Stalls      uint64        // Acquire calls that had to wait
	Cancelled   uint64        // waits ended by their context
	WaitTime    time.Duration // total time spent in waits that ended
	Waiting     uint64        // Acquire calls waiting now (not cumulative)
	Grants      uint64        // grants that raised the cumulative grant
	StaleGrants uint64        // grants ignored as duplicate, reordered or of an older epoch
}

// Credits is the sender side of receive-credit flow control for one peer.
// One credit names one receive buffer the peer has posted for us; every
// message that consumes a receive (SEND, SEND_WITH_IMM, WRITE_WITH_IMM)
// needs one. Grants are cumulative per epoch, so duplicates and reordering
// are harmless. It is safe for concurrent use.
//
// Make one with NewCredits: a nil or zero Credits grants nothing, and its
// methods that return an error return one that is goverbs.ErrNil.
type Credits struct {
	mu       sync.Mutex
	epoch    uint32
	granted  uint64 // cumulative grant of this epoch
	consumed uint64 // cumulative credits consumed in this epoch
	maxGrant uint64
	inOrder  bool
	closed   bool
	made     bool // by NewCredits, never written again: false in a zero Credits (bad)
	q        waitq
	st       CreditStats
}

// NewCredits returns the sender-side credit state for one peer.
func NewCredits(cfg CreditsConfig) *Credits {
	return &Credits{
		epoch:    cfg.Epoch,
		granted:  cfg.Initial,
		maxGrant: cfg.MaxGrant,
		inOrder:  cfg.InOrderGrants,
		made:     true,
	}
}

// total is every unconsumed credit, the control reserve included.
// Invariant: granted >= consumed.
func (c *Credits) total() uint64 { return c.granted - c.consumed }

func (c *Credits) data() uint64 {
	if t := c.total(); t > ControlReserve {
		return t - ControlReserve
	}
	return 0
}

// Available returns the credits data messages may use now (the control
// reserve excluded).
func (c *Credits) Available() uint64 {
	if c.bad() {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.data()
}

// State returns the epoch and the cumulative granted and consumed counters.
func (c *Credits) State() (epoch uint32, granted, consumed uint64) {
	if c.bad() {
		return 0, 0, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch, c.granted, c.consumed
}

// Stats returns a snapshot of the counters.
func (c *Credits) Stats() CreditStats {
	if c.bad() {
		return CreditStats{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.st
	st.Waiting = uint64(c.q.n)
	return st
}

// TryAcquire takes n data credits if they are available now and nobody is
// waiting ahead (no barging past blocked Acquires). It never blocks.
func (c *Credits) TryAcquire(n uint64) bool {
	if c.bad() {
		return false
	}
	c.mu.Lock()
	ok := !c.closed && c.q.n == 0 && c.data() >= n
	if ok {
		c.consumed += n
		c.st.Acquired += n
	}
	c.mu.Unlock()
	return ok
}

// TryAcquireEpoch is TryAcquire that also returns the epoch the credits
// were consumed in (see AcquireEpoch).
func (c *Credits) TryAcquireEpoch(n uint64) (uint32, bool) {
	if c.bad() {
		return 0, false
	}
	c.mu.Lock()
	ok := !c.closed && c.q.n == 0 && c.data() >= n
	if ok {
		c.consumed += n
		c.st.Acquired += n
	}
	epoch := c.epoch
	c.mu.Unlock()
	return epoch, ok
}

// TryAcquireControl takes one credit for a control message (an explicit
// credit update), which may use the reserve. It never waits behind data.
func (c *Credits) TryAcquireControl() bool {
	if c.bad() {
		return false
	}
	c.mu.Lock()
	ok := !c.closed && c.total() >= 1
	if ok {
		c.consumed++
		c.st.Control++
	}
	c.mu.Unlock()
	return ok
}

// Acquire takes n data credits, waiting in FIFO order until grants make
// them available, ctx is done (ctx.Err() is returned and nothing is
// consumed) or c is closed (ErrClosed). It spawns no goroutine.
// A nil ctx is refused with an error.
func (c *Credits) Acquire(ctx context.Context, n uint64) error {
	_, err := c.acquire(ctx, n, false) // which checks c and ctx
	return err
}

// AcquireEpoch is Acquire that also returns the epoch the credits were
// consumed in: after a Resync to a newer epoch they are forgotten, and a
// message that has not gone out yet needs new ones.
func (c *Credits) AcquireEpoch(ctx context.Context, n uint64) (uint32, error) {
	return c.acquire(ctx, n, true) // which checks c and ctx
}

// acquire is Acquire and AcquireEpoch (epoch says which, for the error
// of a nil ctx alone).
func (c *Credits) acquire(ctx context.Context, n uint64, epoch bool) (uint32, error) {
	if c.bad() {
		return 0, errNilCredits
	}
	if ctx == nil {
		if epoch {
			return 0, errNilCtxCreditsAcquireEpoch
		}
		return 0, errNilCtxCreditsAcquire
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, ErrClosed
	}
	if c.q.n == 0 && c.data() >= n {
		c.consumed += n
		c.st.Acquired += n
		epoch := c.epoch
		c.mu.Unlock()
		return epoch, nil
	}
	if c.maxGrant > 0 && n > c.maxGrant-min(c.maxGrant, ControlReserve) {
		c.mu.Unlock()
		return 0, fmt.Errorf("%w: %d credits, peer posts at most %d (%d reserved for control)",
			ErrTooLarge, n, c.maxGrant, ControlReserve)
	}
	w := &waiter{n: n, ready: make(chan struct{})}
	c.q.push(w)
	c.st.Stalls++
	start := now() // under the lock: a counted stall has its start time
	c.mu.Unlock()

	select {
	case <-w.ready:
		c.mu.Lock()
		c.st.WaitTime += now().Sub(start)
		c.mu.Unlock()
		return w.epoch, w.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.WaitTime += now().Sub(start)
	c.st.Cancelled++
	switch {
	case w.granted:
		// Granted while we were being cancelled: give the credits back,
		// unless a Reset/Resync already forgot that consumption.
		if w.epoch == c.epoch {
			c.consumed -= n
			c.st.Acquired -= n
			c.dispatch()
		}
	case w.err == nil:
		c.q.remove(w)
		c.dispatch() // a smaller waiter behind us may fit now
	}
	return 0, ctx.Err()
}

// dispatch grants waiters in FIFO order while the head fits.
func (c *Credits) dispatch() {
	for w := c.q.head; w != nil && c.data() >= w.n; w = c.q.head {
		c.q.remove(w)
		c.consumed += w.n
		c.st.Acquired += w.n
		w.epoch = c.epoch
		w.wake(nil)
	}
}

// Grant applies a cumulative grant received from the peer (piggybacked on
// a message header or in an explicit credit update). It is idempotent:
// duplicates, values below the current grant and grants of older epochs
// are ignored (counted in StaleGrants). A grant of a newer epoch returns
// ErrEpochAhead, one the receiver could not have issued
// ErrImpossibleGrant; neither is applied.
func (c *Credits) Grant(cumulative uint64, epoch uint32) error {
	if c.bad() {
		return errNilCredits
	}
	c.mu.Lock()
	err := c.grant(cumulative, epoch)
	c.mu.Unlock() // not deferred: once per message
	return err
}

// grant is Grant's body; c.mu is held.
func (c *Credits) grant(cumulative uint64, epoch uint32) error {
	switch {
	case c.closed:
		return ErrClosed
	case epoch < c.epoch:
		c.st.StaleGrants++
		return nil
	case epoch > c.epoch:
		return fmt.Errorf("%w: epoch %d, current %d", ErrEpochAhead, epoch, c.epoch)
	case cumulative <= c.granted:
		if cumulative < c.granted && c.inOrder {
			return fmt.Errorf("%w: %d after %d in epoch %d", ErrGrantBackwards, cumulative, c.granted, epoch)
		}
		c.st.StaleGrants++
		return nil
	case c.maxGrant > 0 && cumulative-c.consumed > c.maxGrant:
		return fmt.Errorf("%w: grant %d with %d consumed leaves %d outstanding, peer posts at most %d",
			ErrImpossibleGrant, cumulative, c.consumed, cumulative-c.consumed, c.maxGrant)
	}
	c.granted = cumulative
	c.st.Grants++
	c.dispatch()
	return nil
}

// Reset starts a new epoch from nothing: the peer lost its receive state
// (a new endpoint incarnation) and will grant afresh in epoch. Until its
// first grant nothing is available. Waiters keep waiting.
func (c *Credits) Reset(epoch uint32) error {
	if c.bad() {
		return errNilCredits
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if epoch <= c.epoch {
		return fmt.Errorf("%w: reset to %d, current %d", ErrStaleEpoch, epoch, c.epoch)
	}
	c.epoch, c.granted, c.consumed = epoch, 0, 0
	return nil
}

// Resync applies the receiver's view after recovery: in epoch it has
// granted `granted` credits in total and consumed (seen arrive) `consumed`
// of them. Messages we sent that never arrived are forgiven; they will be
// resent, consuming credits again. Precondition: no message of the old
// epoch can still arrive at the peer (every QP to it was reset), otherwise
// its buffer would be counted twice.
func (c *Credits) Resync(epoch uint32, granted, consumed uint64) error {
	if c.bad() {
		return errNilCredits
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case epoch <= c.epoch:
		return fmt.Errorf("%w: resync to %d, current %d", ErrStaleEpoch, epoch, c.epoch)
	case granted < consumed || (c.maxGrant > 0 && granted-consumed > c.maxGrant):
		return fmt.Errorf("%w: resync granted %d consumed %d (max %d)",
			ErrImpossibleGrant, granted, consumed, c.maxGrant)
	}
	c.epoch, c.granted, c.consumed = epoch, granted, consumed
	c.dispatch()
	return nil
}

// Close fails every waiting and future Acquire with ErrClosed.
// It is idempotent.
func (c *Credits) Close() {
	if c.bad() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for w := c.q.head; w != nil; w = c.q.head {
		c.q.remove(w)
		w.wake(ErrClosed)
	}
}

// String describes the credits' state, for diagnostics.
func (c *Credits) String() string {
	switch {
	case c == nil:
		return "<nil>"
	case c.bad():
		return "<zero Credits>"
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("epoch %d granted %d consumed %d (total %d, data %d) waiting %d closed %v",
		c.epoch, c.granted, c.consumed, c.total(), c.data(), c.q.n, c.closed)
}
