package uverbs

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilAH          = sentinel.Nil("uverbs: use of a nil AH")
	errNilCompChannel = sentinel.Nil("uverbs: use of a nil CompChannel")
	errNilContext     = sentinel.Nil("uverbs: use of a nil Context")
	errNilPD          = sentinel.Nil("uverbs: use of a nil PD")
)

// orZero is what a nil AH's getters read: the zero AH.
func (ah *AH) orZero() *AH { return sentinel.Or(ah, &zeroAH) }

var zeroAH AH // never written

// orZero is what a nil Context's getters read: the zero Context.
func (c *Context) orZero() *Context { return sentinel.Or(c, &zeroContext) }

var zeroContext Context // never written
