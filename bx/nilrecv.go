package bx

import "github.com/goverbs/goverbs/internal/nilerr"

// What the methods of a nil pointer return: errors.Is goverbs.ErrNil.
var (
	errNilConn     = nilerr.New("bx: use of a nil Conn")
	errNilEndpoint = nilerr.New("bx: use of a nil Endpoint")
	errNilMsg      = nilerr.New("bx: use of a nil Msg")
	errNilPeer     = nilerr.New("bx: use of a nil Peer")
	errNilStream   = nilerr.New("bx: use of a nil Stream (or one of a nil Peer)")
)

// closedDone is a nil Peer's Done: a closed channel.
var closedDone = func() chan struct{} { c := make(chan struct{}); close(c); return c }()
