package mr

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilAllocator = sentinel.Nil("mr: use of a nil Allocator")
	errNilCache     = sentinel.Nil("mr: use of a nil Cache")
	errNilMR        = sentinel.Nil("mr: use of a nil MR")
	errNilMW        = sentinel.Nil("mr: use of a nil MW")
	errNilMemory    = sentinel.Nil("mr: use of a nil Memory")
)

// orZero is what a nil MR's getters read: the zero MR.
func (m *MR) orZero() *MR { return sentinel.Or(m, &zeroMR) }

var zeroMR MR // never written

// orZero is what a nil MW's getters read: the zero MW.
func (w *MW) orZero() *MW { return sentinel.Or(w, &zeroMW) }

var zeroMW MW // never written
