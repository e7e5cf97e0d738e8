package ps

import "github.com/goverbs/goverbs/internal/sentinel"

// What the methods of a nil pointer, or of a zero value no constructor
// made (new(Client), a struct field never set up), return: errors.Is
// goverbs.ErrNil. Methods without an error result return their zero
// values, or do nothing. Each type tells the two apart from a usable one
// by one field its constructors always set (its bad method). A Request
// needs none: its accessors return 0 for an index outside its data,
// whatever the data (a zero Request has none).
var (
	errNilClient = sentinel.Nil("ps: use of a nil Client (or a zero one, not from ps.Dial)")
	// Wait on a Pending not from PullAsync or PushAsync would wait for ever.
	errNilPending = sentinel.Nil("ps: Wait on a nil Pending (or a zero one, not from Client.PullAsync or Client.PushAsync)")
	errNilServer  = sentinel.Nil("ps: use of a nil Server (or a zero one, not from ps.NewServer)")
	errNilStore   = sentinel.Nil("ps: use of a nil Store (or a zero one, not from ps.NewStore)")
)

// bad reports a nil or zero Client: Dial sets t (the transport) before it
// returns one, and nothing writes it again.
func (c *Client) bad() bool { return c == nil || c.t == nil }

// bad reports a nil or zero Pending: PullAsync and PushAsync make done.
func (p *Pending) bad() bool { return p == nil || p.done == nil }

// bad reports a nil or zero Ring, or one of no servers (NewRing(0, v)):
// one that places nothing. NewRing of n in 1..MaxServers makes owner
// n*vnodes long.
func (r *Ring) bad() bool { return r == nil || len(r.owner) == 0 }

// bad reports a nil or zero Server: NewServer makes inc (the incarnation)
// odd, and nothing writes it again.
func (s *Server) bad() bool { return s == nil || s.inc == 0 }

// bad reports a nil or zero Store: NewStore makes cfg.MaxBatch positive,
// and nothing writes it again.
func (s *Store) bad() bool { return s == nil || s.cfg.MaxBatch <= 0 }

// orZero is what a nil Server's getters read: the zero Server.
func (s *Server) orZero() *Server { return sentinel.Or(s, &zeroServer) }

var zeroServer Server // never written
