package cm

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil *Channel or *ID, or of a zero one that no
// constructor made (new(cm.ID), a field never set up), return: errors.Is
// goverbs.ErrNil. A zero Channel or ID holds no kernel object: its methods
// never use its zero descriptor or handle, and never wait on it. Its
// getters read its zero fields.
var (
	errNilChannel = sentinel.Nil("cm: use of a nil Channel (or a zero one, not from cm.Open)")
	errNilID      = sentinel.Nil("cm: use of a nil ID (or a zero one, not from Channel.CreateID or CreateIDType, or a connect request's Event.ID)")
)

// bad reports whether ch is nil or a zero Channel: Open sets file (the
// opened rdma_cm descriptor) in every Channel it returns, and nothing
// clears it.
func (ch *Channel) bad() bool { return ch == nil || ch.file == nil }

// bad reports whether id is nil or a zero ID: every ID is made by its
// Channel (newIDLocked, for CreateIDType and for a connect request),
// which sets ch, and nothing clears it.
func (id *ID) bad() bool { return id == nil || id.ch == nil }
