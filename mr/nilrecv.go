package mr

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil pointer, or of a zero value that no
// constructor made (new(MR), a struct field never set up), return:
// errors.Is goverbs.ErrNil. Such a value holds no registered memory and
// no kernel object: handle 0 is never used as one. Its IsClosed is true,
// its other getters return zero values, and its Close returns the error
// below and releases nothing.
var (
	errNilAllocator = sentinel.Nil("mr: use of a nil Allocator (or a zero one, not from mr.NewAllocator)")
	errNilCache     = sentinel.Nil("mr: use of a nil Cache (or a zero one, not from Allocator.NewCache)")
	errNilMR        = sentinel.Nil("mr: use of a nil MR (or a zero one, not from mr.Register)")
	errNilMW        = sentinel.Nil("mr: use of a nil MW (or a zero one, not from mr.AllocMW)")
	errNilMemory    = sentinel.Nil("mr: use of a nil Memory (or a zero one, not from mr.Alloc)")
)

// bad reports whether a is nil or a zero Allocator: newAllocator always
// makes its classes (1 to 255 of them). Alloc and Free read the field
// anyway: the check is one comparison on their path.
func (a *Allocator) bad() bool { return a == nil || a.classes == nil }

// bad reports whether k is nil or a zero Cache: NewCache always sets its
// Allocator.
func (k *Cache) bad() bool { return k == nil || k.a == nil }

// bad reports whether m is nil or a zero Memory: Alloc always sets its
// size (positive), which Close leaves (it clears buf).
func (m *Memory) bad() bool { return m == nil || m.size == 0 }

// bad reports whether m is nil or a zero MR: Register refuses an empty
// buffer, so a registered MR's buf has a first byte (which Addr and SGE
// read), and its PD is set with it.
func (m *MR) bad() bool { return m == nil || len(m.buf) == 0 }

// bad reports whether w is nil or a zero MW: AllocMW refuses a nil PD and
// always sets it.
func (w *MW) bad() bool { return w == nil || w.pd == nil }

// orZero is what a nil MR's getters read: the zero MR.
func (m *MR) orZero() *MR { return sentinel.Or(m, &zeroMR) }

var zeroMR MR // never written

// orZero is what a nil MW's getters read: the zero MW.
func (w *MW) orZero() *MW { return sentinel.Or(w, &zeroMW) }

var zeroMW MW // never written
