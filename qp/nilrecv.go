package qp

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil *QP or *SRQ, or of a zero one that no
// constructor made (new(qp.QP), a field never set up), return: errors.Is
// goverbs.ErrNil. A zero QP or SRQ holds no kernel object: its methods
// never use its zero handle. Its getters read its zero fields.
var (
	errNilQP  = sentinel.Nil("qp: use of a nil QP (or a zero one, not from qp.Create)")
	errNilSRQ = sentinel.Nil("qp: use of a nil SRQ (or a zero one, not from qp.CreateSRQ)")
)

// bad reports whether q is nil or a zero QP. Create sets ctx (its PD's
// context, which it has used by then to reach the device) in every QP it
// returns, and nothing clears it: a QP without one was not made by it.
// One comparison more than q == nil, cheap enough for the post paths.
func (q *QP) bad() bool { return q == nil || q.ctx == nil }

// bad reports whether s is nil or a zero SRQ: CreateSRQ sets ctx as
// Create does for a QP.
func (s *SRQ) bad() bool { return s == nil || s.ctx == nil }

// orZero is what a nil QP's getters read: the zero QP.
func (q *QP) orZero() *QP { return sentinel.Or(q, &zeroQP) }

var zeroQP QP // never written

// orZero is what a nil SRQ's getters read: the zero SRQ.
func (s *SRQ) orZero() *SRQ { return sentinel.Or(s, &zeroSRQ) }

var zeroSRQ SRQ // never written
