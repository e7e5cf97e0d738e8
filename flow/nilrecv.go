package flow

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilCredits  = sentinel.Nil("flow: use of a nil Credits")
	errNilReturner = sentinel.Nil("flow: use of a nil Returner")
	errNilWindow   = sentinel.Nil("flow: use of a nil Window")
)
