// Package uvobj is what the packages that create kernel objects on a
// device context (cq, qp, mr) share with uverbs and no user needs: the
// context's command descriptor, provider and object table, the
// destroy-with-fallback of a kernel object, and the close-once sequence of
// one. uverbs.Context exports none of it.
package uvobj

import (
	"errors"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/uverbs/provider"
)

// Parts is what cq, qp and mr need of a uverbs.Context.
type Parts struct {
	File    *ioctl.File      // the command descriptor
	Driver  provider.Context // the provider's half of the context
	Device  provider.Device  // the device handle lent to providers
	Objects *Table           // the context's children and user handles
}

// Base, embedded in uverbs.Context, holds its Parts. It has no exported
// method, so that nothing of it shows on Context; Of reaches it.
type Base struct{ parts Parts }

func (b *Base) uvobjParts() *Parts { return &b.parts }

// Holder is a *uverbs.Context (the only type that embeds Base).
type Holder interface{ uvobjParts() *Parts }

// Of returns the Parts of a device context, for uverbs to fill at Open and
// for cq, qp and mr to use.
func Of(h Holder) *Parts { return h.uvobjParts() }

// Table is a device context's object table: the live child objects, which
// the context's Close destroys newest first, and the user handles the
// kernel echoes in completion and async events, each naming its object.
type Table struct {
	mu      sync.Mutex
	closed  bool
	objs    []io.Closer // in creation order
	last    atomic.Uint64
	handles sync.Map // uint64 -> any
	// failed holds, for each tracked object whose last Close failed to
	// destroy it, what Close would have done after (AbandonFailed).
	failed map[io.Closer]func() error
}

// Track registers a child object so that the context's Close destroys it.
// It fails with ioctl.ErrClosed after Shut.
func (t *Table) Track(o io.Closer) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ioctl.ErrClosed
	}
	t.objs = append(t.objs, o)
	return nil
}

// Untrack forgets a child object that was destroyed on its own.
func (t *Table) Untrack(o io.Closer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i := slices.Index(t.objs, o); i >= 0 {
		t.objs = slices.Delete(t.objs, i, i+1)
	}
	delete(t.failed, o)
}

// noteFailed keeps what o's Close does after a destroy (abandon), for
// AbandonFailed: o's destroy failed.
func (t *Table) noteFailed(o io.Closer, abandon func() error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.failed == nil {
		t.failed = map[io.Closer]func() error{}
	}
	t.failed[o] = abandon
}

// AbandonFailed gives up on the objects whose Close could not destroy
// them (the kernel refused: a QP still attached to a multicast group, a
// CQ or SRQ a QP still uses): each is marked closed, its user handle
// released and its provider's side closed (its queues unmapped), as a
// Close that destroyed it would have. The device context's Close calls it
// before it closes the descriptor: a queue left mapped keeps the
// descriptor's file open, and with it every kernel object of the context
// (and the pages its memory regions pin) until the process exits; with
// nothing mapped, closing the descriptor destroys them all. It returns
// the errors of unmapping.
func (t *Table) AbandonFailed() error {
	t.mu.Lock()
	failed := t.failed
	t.failed = nil
	t.mu.Unlock()
	var errs []error
	for _, abandon := range failed {
		if err := abandon(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// IsClosed reports whether Shut ran.
func (t *Table) IsClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// Shut closes the table to new objects and returns the live ones in
// creation order, or false if it was shut before.
func (t *Table) Shut() ([]io.Closer, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, false
	}
	t.closed = true
	objs := t.objs
	t.objs = nil
	return objs, true
}

// NewUserHandle returns a fresh user handle for obj (nil: bound later).
func (t *Table) NewUserHandle(obj any) uint64 {
	h := t.last.Add(1)
	t.handles.Store(h, obj)
	return h
}

// BindUserHandle sets the object of a user handle made before the object.
func (t *Table) BindUserHandle(h uint64, obj any) { t.handles.Store(h, obj) }

// ReleaseUserHandle forgets a user handle.
func (t *Table) ReleaseUserHandle(h uint64) { t.handles.Delete(h) }

// ObjectOf returns the object of a user handle.
func (t *Table) ObjectOf(h uint64) (any, bool) { return t.handles.Load(h) }

// Once is the close-once state of a kernel object: Close destroys it at
// most once, and IsClosed reads without the lock. Close takes its lock
// exclusively (Lock); a create that names the object's handle in its
// command holds it shared (Hold) until the kernel made the new object.
type Once struct {
	mu     sync.RWMutex
	closed atomic.Bool
}

// Hold takes o's lock shared and reports whether the object is open; if
// it is not, it holds nothing. While held, a Close waits: the object's
// handle cannot be destroyed, and so cannot be given by the kernel (which
// hands out the lowest free id) to a new object of the context, between
// the holder's look at it and its command. Release ends the hold. Holds
// of several objects are taken in one fixed order (a QP's PD, its CQs by
// HandleOrder, its SRQ), never with the object's Lock held.
func (o *Once) Hold() bool {
	o.mu.RLock()
	if o.closed.Load() {
		o.mu.RUnlock()
		return false
	}
	return true
}

// Release ends a Hold that succeeded.
func (o *Once) Release() { o.mu.RUnlock() }

// IsClosed reports whether Close succeeded.
func (o *Once) IsClosed() bool { return o.closed.Load() }

// MarkClosed marks the object closed without destroying anything: for an
// object with no kernel side (host-side unit tests of the closed path).
func (o *Once) MarkClosed() { o.closed.Store(true) }

// Lock and Unlock hold off Close (an object's own operations that must not
// run while it is destroyed take them). Lock also waits for the Holds.
func (o *Once) Lock()   { o.mu.Lock() }
func (o *Once) Unlock() { o.mu.Unlock() }

// Close runs the sequence every object's Close has: under the lock, if not
// closed yet, destroy; if that fails, the object stays open and usable and
// the error is wrap's; otherwise mark it closed, untrack obj from t (and
// release its user handle, if not 0), then run after (unmap, unregister;
// its error is returned). Idempotent: a closed object returns nil.
func (o *Once) Close(t *Table, obj io.Closer, user uint64, destroy func() error, wrap func(error) error, after func() error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed.Load() {
		return nil
	}
	if err := destroy(); err != nil {
		t.noteFailed(obj, func() error { return o.abandon(t, user, after) })
		return wrap(err)
	}
	o.closed.Store(true)
	t.Untrack(obj)
	return release(t, user, after)
}

// abandon is the end of Close without the destroy (Table.AbandonFailed;
// the table no longer tracks the object).
func (o *Once) abandon(t *Table, user uint64, after func() error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed.Load() {
		return nil
	}
	o.closed.Store(true)
	return release(t, user, after)
}

// release is what follows a closed object's destroy, or its abandonment:
// its user handle released (if not 0), then after run.
func release(t *Table, user uint64, after func() error) error {
	if user != 0 {
		t.ReleaseUserHandle(user)
	}
	if after != nil {
		return after()
	}
	return nil
}

// CQBase, embedded in cq.CQ, holds its provider CQ, for qp's hooks
// (provider.CQCleaner when a QP goes to RESET or is destroyed). Like Base
// it has no exported method.
type CQBase struct{ drv provider.CQ }

func (b *CQBase) uvobjCQ() *provider.CQ { return &b.drv }

// CQHolder is a *cq.CQ.
type CQHolder interface{ uvobjCQ() *provider.CQ }

// CQOf returns the provider CQ slot of a CQ, for cq to fill at creation
// and qp to read.
func CQOf(h CQHolder) *provider.CQ { return h.uvobjCQ() }

// HandleBase, embedded in uverbs.PD and cq.CQ (under a name of the
// embedding package's), holds what qp, mr and uverbs' own creates need of
// an object whose handle they name: its Once and handle, for HoldHandle,
// and its place in the lock order. Like Base it has no exported method.
type HandleBase struct {
	once   *Once
	handle uint32
	order  uint64
}

func (b *HandleBase) uvobjHandle() *HandleBase { return b }

// HandleHolder is a *uverbs.PD or a *cq.CQ.
type HandleHolder interface{ uvobjHandle() *HandleBase }

// SetHandle fills h's HandleBase at its creation, before anyone else sees
// it: o is its Once, handle its kernel handle, order a number no other
// object of the same kind in the context has (a CQ's user handle), the
// order in which HoldHandle takes two of them.
func SetHandle(h HandleHolder, o *Once, handle uint32, order uint64) {
	*h.uvobjHandle() = HandleBase{once: o, handle: handle, order: order}
}

// HoldHandle holds h open (Once.Hold) and returns its handle, or false,
// holding nothing, if h is closed (or was never created). ReleaseHandle
// ends the hold once the command that names the handle returned.
func HoldHandle(h HandleHolder) (uint32, bool) {
	b := h.uvobjHandle()
	if b.once == nil || !b.once.Hold() {
		return 0, false
	}
	return b.handle, true
}

// ReleaseHandle ends a HoldHandle that succeeded.
func ReleaseHandle(h HandleHolder) { h.uvobjHandle().once.Release() }

// HandleOrder is h's place in the lock order (SetHandle).
func HandleOrder(h HandleHolder) uint64 { return h.uvobjHandle().order }

// FileBase, embedded in uverbs.CompChannel, holds its descriptor's file,
// for cq to name the descriptor in CQ_CREATE (WithFile).
type FileBase struct{ f *os.File }

func (b *FileBase) uvobjFile() **os.File { return &b.f }

// FileHolder is a *uverbs.CompChannel.
type FileHolder interface{ uvobjFile() **os.File }

// SetFile sets h's file at its creation.
func SetFile(h FileHolder, f *os.File) { *h.uvobjFile() = f }

// WithFile runs fn with h's descriptor, which stays open while fn runs: a
// Close of the file meanwhile closes the number only once fn returned
// (os.File's reference count), so the number cannot name another file
// (one opened since, which Linux gives the lowest free number) during fn.
// It returns an error, not running fn, if the file is closed (os.ErrClosed
// if it never had one; the poller's own error if it was closed).
func WithFile(h FileHolder, fn func(fd int)) error {
	f := *h.uvobjFile()
	if f == nil {
		return os.ErrClosed
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(func(fd uintptr) { fn(int(fd)) })
}
