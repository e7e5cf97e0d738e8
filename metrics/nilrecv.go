package metrics

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil Collector return: errors.Is goverbs.ErrNil.
// A zero Collector (new(Collector), a struct field never set up) is not
// one: it is what NewCollector returns, ready to use, and holds nothing
// to set up or release. A nil source handed to AddBX, AddPSServer or
// AddPSClient, on a nil Collector or any other, is refused with an error
// that is goverbs.ErrNil too (after the receiver's, which comes first).
var (
	errNilCollector = sentinel.Nil("metrics: use of a nil Collector")
	errNilBX        = sentinel.Nil("metrics: Collector.AddBX of a nil source")
	errNilPSServer  = sentinel.Nil("metrics: Collector.AddPSServer of a nil source")
	errNilPSClient  = sentinel.Nil("metrics: Collector.AddPSClient of a nil source")
)
