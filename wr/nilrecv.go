package wr

import "github.com/goverbs/goverbs/internal/nilerr"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilWC = nilerr.New("wr: use of a nil WC")
)
