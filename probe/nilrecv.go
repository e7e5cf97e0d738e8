package probe

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil Probes, or of a zero one no Attach made
// (new(Probes), a struct field never set up), return: errors.Is
// goverbs.ErrNil. Such a value holds no map, program or link; its Status
// is empty and nothing is Attached. A Command's zero value is a plain
// record (Doorbell false), not one of these.
var (
	errNilProbes = sentinel.Nil("probe: use of a nil Probes (or a zero one, not from Attach)")
)

// bad reports a Probes that Attach did not make: Attach sets its map
// table before anything else (and Close leaves it), so only a nil or a
// zero Probes has none.
func (p *Probes) bad() bool { return p == nil || p.maps == nil }
