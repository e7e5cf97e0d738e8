// Package closederr makes each package's ErrClosed: an error with the
// package's own message that errors.Is matches against goverbs.ErrClosed.
package closederr

import "github.com/goverbs/goverbs"

// New returns an error whose message is msg and that is
// goverbs.ErrClosed for errors.Is.
func New(msg string) error { return &closed{msg: msg} }

type closed struct{ msg string }

func (e *closed) Error() string { return e.msg }

// Is makes errors.Is(e, goverbs.ErrClosed) hold.
func (e *closed) Is(target error) bool { return target == goverbs.ErrClosed }
