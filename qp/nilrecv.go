package qp

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilQP  = sentinel.Nil("qp: use of a nil QP")
	errNilSRQ = sentinel.Nil("qp: use of a nil SRQ")
)

// orZero is what a nil QP's getters read: the zero QP.
func (q *QP) orZero() *QP { return sentinel.Or(q, &zeroQP) }

var zeroQP QP // never written

// orZero is what a nil SRQ's getters read: the zero SRQ.
func (s *SRQ) orZero() *SRQ { return sentinel.Or(s, &zeroSRQ) }

var zeroSRQ SRQ // never written
