package flow

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil pointer, or of a zero value no constructor
// made (new(Window), a struct field never set up), return: errors.Is
// goverbs.ErrNil. Methods without an error result return their zero
// values, or do nothing. Each type tells the two apart from a usable one
// by one field its constructors always set (its bad method). A zero
// Dedup needs no check: its window is empty, so it calls every sequence
// Ahead and delivers none, without panicking.
var (
	errNilCredits  = sentinel.Nil("flow: use of a nil Credits (or a zero one, not from flow.NewCredits)")
	errNilReturner = sentinel.Nil("flow: use of a nil Returner (or a zero one, not from flow.NewReturner)")
	errNilWindow   = sentinel.Nil("flow: use of a nil Window (or a zero one, not from flow.NewWindow or Window.NewChild)")
)

// bad reports a nil or zero Credits: made is set by NewCredits alone.
func (c *Credits) bad() bool { return c == nil || !c.made }

// bad reports a nil or zero Returner: NewReturner makes threshold at
// least 1, and nothing writes it again (so it is read without the lock).
func (r *Returner) bad() bool { return r == nil || r.threshold == 0 }

// bad reports a nil or zero Window: NewWindow and NewChild set t (the
// tree's, shared), and nothing writes it again (so it is read without the
// lock).
func (w *Window) bad() bool { return w == nil || w.t == nil }
