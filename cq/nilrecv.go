package cq

import "github.com/goverbs/goverbs/internal/nilerr"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilCQ = nilerr.New("cq: use of a nil CQ")
)
