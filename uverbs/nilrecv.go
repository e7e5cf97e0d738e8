package uverbs

import "github.com/goverbs/goverbs/internal/nilerr"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilAH          = nilerr.New("uverbs: use of a nil AH")
	errNilCompChannel = nilerr.New("uverbs: use of a nil CompChannel")
	errNilContext     = nilerr.New("uverbs: use of a nil Context")
	errNilPD          = nilerr.New("uverbs: use of a nil PD")
)

// closedDone is a nil CompChannel's Done: a closed channel.
var closedDone = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// orZero is what a nil AH's getters read: the zero AH.
func (ah *AH) orZero() *AH { return nilerr.Or(ah, &zeroAH) }

var zeroAH AH // never written

// orZero is what a nil Context's getters read: the zero Context.
func (c *Context) orZero() *Context { return nilerr.Or(c, &zeroContext) }

var zeroContext Context // never written
