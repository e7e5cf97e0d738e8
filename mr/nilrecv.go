package mr

import "github.com/goverbs/goverbs/internal/nilerr"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilAllocator = nilerr.New("mr: use of a nil Allocator")
	errNilCache     = nilerr.New("mr: use of a nil Cache")
	errNilMR        = nilerr.New("mr: use of a nil MR")
	errNilMW        = nilerr.New("mr: use of a nil MW")
	errNilMemory    = nilerr.New("mr: use of a nil Memory")
)

// orZero is what a nil MR's getters read: the zero MR.
func (m *MR) orZero() *MR { return nilerr.Or(m, &zeroMR) }

var zeroMR MR // never written

// orZero is what a nil MW's getters read: the zero MW.
func (w *MW) orZero() *MW { return nilerr.Or(w, &zeroMW) }

var zeroMW MW // never written
