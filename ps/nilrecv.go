package ps

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilClient = sentinel.Nil("ps: use of a nil Client")
	// Wait on a Pending not from PullAsync or PushAsync would wait for ever.
	errNilPending = sentinel.Nil("ps: Wait on a nil Pending (or one not from PullAsync or PushAsync)")
	errNilServer  = sentinel.Nil("ps: use of a nil Server")
	errNilStore   = sentinel.Nil("ps: use of a nil Store")
)

// orZero is what a nil Server's getters read: the zero Server.
func (s *Server) orZero() *Server { return sentinel.Or(s, &zeroServer) }

var zeroServer Server // never written
