package metrics

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil Collector return: errors.Is goverbs.ErrNil.
var errNilCollector = sentinel.Nil("metrics: use of a nil Collector")
