package wr

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilWC = sentinel.Nil("wr: use of a nil WC")
)
