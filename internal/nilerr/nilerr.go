// Package nilerr makes the errors that methods return when called on a
// nil pointer: each with its package's own message, naming the type, and
// goverbs.ErrNil for errors.Is.
package nilerr

import "github.com/goverbs/goverbs"

// New returns an error whose message is msg and that is goverbs.ErrNil
// for errors.Is.
func New(msg string) error { return &nilErr{msg: msg} }

type nilErr struct{ msg string }

func (e *nilErr) Error() string { return e.msg }

func (e *nilErr) Is(target error) bool { return target == goverbs.ErrNil }

// Or is p, or zero when p is nil: a nil receiver's getters read their
// fields from a zero value (which nothing may write) instead of
// dereferencing nil.
func Or[T any](p, zero *T) *T {
	if p == nil {
		return zero
	}
	return p
}
