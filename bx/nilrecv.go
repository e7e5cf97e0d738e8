package bx

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilConn     = sentinel.Nil("bx: use of a nil Conn")
	errNilEndpoint = sentinel.Nil("bx: use of a nil Endpoint")
	errNilMsg      = sentinel.Nil("bx: use of a nil Msg")
	errNilPeer     = sentinel.Nil("bx: use of a nil Peer")
	errNilStream   = sentinel.Nil("bx: use of a nil Stream (or one of a nil Peer)")
)
