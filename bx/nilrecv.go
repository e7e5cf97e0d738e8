package bx

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil pointer, or of a zero value no constructor
// made (new(Conn), a struct field never set up), return: errors.Is
// goverbs.ErrNil. Such a value holds no device object, no peer and no
// stream; its methods that return no error do nothing or return zero
// values. Each type's bad reports such a value, by one field its
// constructors always set.
var (
	errNilConn     = sentinel.Nil("bx: use of a nil Conn (or a zero one, not from DialConn or a Listener's Accept)")
	errNilEndpoint = sentinel.Nil("bx: use of a nil Endpoint (or a zero one, not from New)")
	errNilMsg      = sentinel.Nil("bx: use of a nil Msg (or a zero one, not from Recv, Call or a Handler)")
	errNilPeer     = sentinel.Nil("bx: use of a nil Peer (or a zero one, not from Dial or Accept)")
	errNilStream   = sentinel.Nil("bx: use of a nil Stream (or a zero one, not from Peer.Stream, or one of a nil Peer)")
)

// bad reports a Conn that DialConn or a Listener's Accept did not make:
// newConn always sets its stream.
func (c *Conn) bad() bool { return c == nil || c.s == nil }

// bad reports an Endpoint that New did not make: New returns one only
// with its device context open (e.ctx), which Close releases but never
// clears.
func (e *Endpoint) bad() bool { return e == nil || e.ctx == nil }

// bad reports a Peer that Dial or Accept did not make: the handshake
// always sets its endpoint.
func (p *Peer) bad() bool { return p == nil || p.e == nil }

// bad reports a Stream that Peer.Stream did not make for a peer: it
// always sets the peer and the notification channel (a nil Peer's
// Streams have neither).
func (s *Stream) bad() bool { return s == nil || s.p == nil || s.notify == nil }

// bad reports a Msg that bx did not deliver: every received message has
// its peer.
func (m *Msg) bad() bool { return m == nil || m.p == nil }
