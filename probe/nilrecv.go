package probe

import "github.com/goverbs/goverbs/internal/nilerr"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilProbes = nilerr.New("probe: use of a nil Probes")
)
