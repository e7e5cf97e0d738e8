package cm

import "github.com/goverbs/goverbs/internal/nilerr"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilChannel = nilerr.New("cm: use of a nil Channel")
	errNilID      = nilerr.New("cm: use of a nil ID")
)
