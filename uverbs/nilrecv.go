package uverbs

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil pointer, or of a zero value that no
// constructor made (new(Context), a struct field never set up), return:
// errors.Is goverbs.ErrNil. Such a value holds no kernel object: its zero
// descriptor (0, the process's stdin) and handle 0 are never used as one.
// Its IsClosed is true, its other getters return zero values, and its
// Close returns the error below and closes nothing.
var (
	errNilAH          = sentinel.Nil("uverbs: use of a nil AH (or a zero one, not from PD.CreateAH)")
	errNilCompChannel = sentinel.Nil("uverbs: use of a nil CompChannel (or a zero one, not from Context.CreateCompChannel)")
	errNilContext     = sentinel.Nil("uverbs: use of a nil Context (or a zero one, not from uverbs.Open or uverbs.OpenWith)")
	errNilPD          = sentinel.Nil("uverbs: use of a nil PD (or a zero one, not from Context.AllocPD)")
)

// bad reports whether c is nil or a zero Context: OpenWith always sets
// the command descriptor (file), and nothing clears it.
func (c *Context) bad() bool { return c == nil || c.file == nil }

// bad reports whether pd is nil or a zero PD: AllocPD always sets its
// Context.
func (pd *PD) bad() bool { return pd == nil || pd.ctx == nil }

// bad reports whether ah is nil or a zero AH: CreateAH always sets its PD.
func (ah *AH) bad() bool { return ah == nil || ah.pd == nil }

// bad reports whether ch is nil or a zero CompChannel: CreateCompChannel
// always sets its descriptor's file (closed by Close, never cleared).
func (ch *CompChannel) bad() bool { return ch == nil || ch.file == nil }

// orZero is what a nil AH's getters read: the zero AH.
func (ah *AH) orZero() *AH { return sentinel.Or(ah, &zeroAH) }

var zeroAH AH // never written

// orZero is what a nil Context's getters read: the zero Context.
func (c *Context) orZero() *Context { return sentinel.Or(c, &zeroContext) }

var zeroContext Context // never written
