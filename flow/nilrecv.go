package flow

import "github.com/goverbs/goverbs/internal/nilerr"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilCredits  = nilerr.New("flow: use of a nil Credits")
	errNilReturner = nilerr.New("flow: use of a nil Returner")
	errNilWindow   = nilerr.New("flow: use of a nil Window")
)
