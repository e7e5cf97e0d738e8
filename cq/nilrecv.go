package cq

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilCQ = sentinel.Nil("cq: use of a nil CQ")
)
