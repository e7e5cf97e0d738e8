// Package goverbs is the root of the module: a pure-Go (cgo-free)
// userspace RDMA verbs driver (packages uverbs, cq, qp, mr, cm), the
// ByteExpress transport on top of it (bx, flow), a parameter server (ps)
// and eBPF probes (probe). It holds the errors they all share: ErrClosed
// and ErrNil.
package goverbs

import "errors"

// ErrClosed is what every goverbs package returns, wrapped or as a value
// of its own, for the use of an object after its Close: errors.Is(err,
// goverbs.ErrClosed) holds for a closed device context, PD, MR, MW, CQ,
// QP, SRQ, AH or completion channel, an rdma_cm ID or event channel, a bx
// Endpoint, Peer or Stream, a flow Window or Credits, and probe's Probes,
// as os.ErrClosed does for files. Each package's own ErrClosed (such as
// bx.ErrClosed) is one of these and still matches with errors.Is.
var ErrClosed = errors.New("goverbs: use of a closed object")

// ErrNil is what a method of a goverbs object returns, wrapped in an error
// that names the object, when it is called on a nil pointer (a
// constructor's error ignored, a field never set) or on a zero value that
// no constructor made (new(qp.QP)): errors.Is(err, goverbs.ErrNil) holds
// for every package's. A method that returns no error does nothing on
// such a receiver, or returns its zero values.
var ErrNil = errors.New("goverbs: use of a nil object")
