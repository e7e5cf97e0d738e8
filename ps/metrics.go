package ps

import (
	"time"

	"sync/atomic"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hist"
)

// Metrics: per operation counts, errors and latency of a Server (time to
// handle a request) and of a Client (time of a call as its caller sees it:
// a Pull of keys on several servers is one pull), for package metrics.
// Recording takes no lock and allocates nothing.

// OpMetrics is one operation's counters.
type OpMetrics struct {
	Op       string // Op.String(): pull, push, pull-dense, push-dense, define, stats; "malformed" for requests that did not decode
	Requests uint64 // requests handled (server) or calls made (client)
	Errors   uint64 // of those, the ones that failed
	Latency  bx.Histogram
}

// ServerMetrics is a server's counters.
type ServerMetrics struct {
	Transport        string // rdma or tcp
	Requests, Errors uint64
	Ops              []OpMetrics // operations with requests, in Op order
}

// ClientMetrics is a client's counters.
type ClientMetrics struct {
	Transport string
	Ops       []OpMetrics // operations with calls, in Op order
}

// Metrics returns the server's counters. A nil or zero Server gives none.
func (s *Server) Metrics() ServerMetrics {
	if s.bad() {
		return ServerMetrics{}
	}
	return ServerMetrics{Transport: s.cfg.Transport, Requests: s.requests.Load(), Errors: s.errs.Load(), Ops: s.ops.read()}
}

// Metrics returns the client's counters. A nil or zero Client gives none.
func (c *Client) Metrics() ClientMetrics {
	if c.bad() {
		return ClientMetrics{}
	}
	m := ClientMetrics{Ops: c.ops.read()}
	switch c.t.(type) {
	case *rdmaClient:
		m.Transport = "rdma"
	case *tcpClient:
		m.Transport = "tcp"
	}
	return m
}

// Endpoint is the client's bx endpoint (rdma), or nil.
func (c *Client) Endpoint() *bx.Endpoint {
	if c.bad() {
		return nil
	}
	if t, ok := c.t.(*rdmaClient); ok {
		return t.ep
	}
	return nil
}

// opSlots: index 0 is for requests that did not decode, 1..OpStats the ops.
const opSlots = int(OpStats) + 1

type opStats struct {
	reqs, errs [opSlots]atomic.Uint64
	lat        [opSlots]hist.Recorder
}

func (o *opStats) observe(op Op, d time.Duration, failed bool) {
	i := int(op)
	if i >= opSlots {
		i = 0
	}
	o.reqs[i].Add(1)
	if failed {
		o.errs[i].Add(1)
	}
	o.lat[i].Observe(d)
}

// done records a call that started at start; for a deferred call with the
// function's named error result.
func (o *opStats) done(op Op, start time.Time, err *error) {
	o.observe(op, time.Since(start), *err != nil)
}

func (o *opStats) read() []OpMetrics {
	var out []OpMetrics
	for i := 1; i <= opSlots; i++ {
		j := i % opSlots // the ops in order, then the malformed ones
		n := o.reqs[j].Load()
		if n == 0 {
			continue
		}
		name := Op(j).String()
		if j == 0 {
			name = "malformed"
		}
		out = append(out, OpMetrics{Op: name, Requests: n, Errors: o.errs[j].Load(), Latency: o.lat[j].Read()})
	}
	return out
}
