package ps

import "github.com/goverbs/goverbs/internal/nilerr"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilClient = nilerr.New("ps: use of a nil Client")
	// Wait on a Pending not from PullAsync or PushAsync would wait for ever.
	errNilPending = nilerr.New("ps: Wait on a nil Pending (or one not from PullAsync or PushAsync)")
	errNilServer  = nilerr.New("ps: use of a nil Server")
	errNilStore   = nilerr.New("ps: use of a nil Store")
)

// orZero is what a nil Server's getters read: the zero Server.
func (s *Server) orZero() *Server { return nilerr.Or(s, &zeroServer) }

var zeroServer Server // never written

// closedCh is a nil Pending's Done: a closed channel.
var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()
