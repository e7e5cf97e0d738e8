package metrics

import "github.com/goverbs/goverbs/internal/nilerr"

// What the methods of a nil Collector return: errors.Is goverbs.ErrNil.
var errNilCollector = nilerr.New("metrics: use of a nil Collector")
