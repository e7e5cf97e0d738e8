package bx

import "fmt"

// allocErr is the error of an allocation that failed: ErrClosed once the
// endpoint is closed (its pools are gone; the allocator's own error, "use
// of closed uverbs object", told a Call or Send on a peer of a closed
// endpoint nothing it could match), else err.
func (e *Endpoint) allocErr(err error) error {
	if e.closed.Load() {
		return fmt.Errorf("%w (%v)", ErrClosed, err)
	}
	return err
}
