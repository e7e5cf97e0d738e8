package cq

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil *CQ, or of a zero CQ that no constructor made
// (new(cq.CQ), a field never set up), return: errors.Is goverbs.ErrNil. A
// zero CQ holds no kernel object: its methods never use its zero handle
// or descriptor. Its getters read its zero fields.
var (
	errNilCQ = sentinel.Nil("cq: use of a nil CQ (or a zero one, not from cq.Create or cq.CreateWith)")
)

// bad reports whether q is nil or a zero CQ. CreateWith refuses a nil
// context and sets ctx in every CQ it returns, and nothing clears it: a
// CQ without one was not made by it. One comparison more than q == nil,
// cheap enough for Poll.
func (q *CQ) bad() bool { return q == nil || q.ctx == nil }
