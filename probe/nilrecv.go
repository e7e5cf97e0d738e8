package probe

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilProbes = sentinel.Nil("probe: use of a nil Probes")
)
