// Package sentinel makes the errors every goverbs package shares the
// sentinels of: each package's own error, with its own message, that
// errors.Is matches against goverbs.ErrClosed (Closed: each package's
// ErrClosed) or goverbs.ErrNil (Nil: what its methods return on a nil
// pointer). It also holds what a nil receiver's other methods return.
package sentinel

import "github.com/goverbs/goverbs"

// Closed returns an error whose message is msg and that is
// goverbs.ErrClosed for errors.Is.
func Closed(msg string) error { return &sentinelErr{msg: msg, is: goverbs.ErrClosed} }

// Nil returns an error whose message is msg and that is goverbs.ErrNil
// for errors.Is.
func Nil(msg string) error { return &sentinelErr{msg: msg, is: goverbs.ErrNil} }

type sentinelErr struct {
	msg string
	is  error
}

func (e *sentinelErr) Error() string { return e.msg }

func (e *sentinelErr) Is(target error) bool { return target == e.is }

// Or is p, or zero when p is nil: a nil receiver's getters read their
// fields from a zero value (which nothing may write) instead of
// dereferencing nil.
func Or[T any](p, zero *T) *T {
	if p == nil {
		return zero
	}
	return p
}

// Done is a closed channel: the Done of a nil object (a nil bx Peer,
// uverbs CompChannel or ps Pending) is over already.
var Done <-chan struct{} = func() chan struct{} { c := make(chan struct{}); close(c); return c }()
