package cm

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilChannel = sentinel.Nil("cm: use of a nil Channel")
	errNilID      = sentinel.Nil("cm: use of a nil ID")
)
