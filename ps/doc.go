// Package ps is a sharded in-memory parameter server: the workload
// ByteExpress was built for, served over bx (RDMA) or over kernel TCP with
// the same protocol, so the two can be measured side by side.
//
// What a user holds, in order:
//
//   - Spec: a named parameter, either a dense tensor (float32, KiB to MiB) or
//     a sparse embedding table (uint64 key -> float32 row of fixed Dim, up
//     to millions of rows, materialised on first push), with its optimizer
//     (SGD or Adagrad, applied per row).
//   - Server (NewServer): one shard's Store behind a transport listener,
//     "rdma" (a bx.Endpoint on an RDMA device) or "tcp" (length-prefixed
//     frames over net.TCPConn). Many workers are served concurrently; a push
//     to one row is applied atomically (striped row locks).
//   - Client (Dial): a worker's view of all servers. Keys and dense tensor
//     names are placed on servers by a consistent-hash Ring with virtual
//     nodes; Pull and Push split a batch per server and run the per-server
//     calls concurrently. Pull writes rows into the caller's slice; on rdma
//     it reads them straight out of the registered receive buffer the
//     response landed in (no intermediate copy), on tcp out of its
//     reader's buffer. A request is built straight from the caller's keys
//     and values: in a buffer of the call (a small one, sent by
//     bx.Peer.Call) or in place in an allocator buffer (bx.Endpoint.Alloc).
//     PullAsync and PushAsync keep several operations outstanding.
//
// The hot path allocates nothing in steady state (TestHotPathAllocs): a
// server decodes a request in place, looks its parameter up without a
// lock, writes rows into the response under their stripe lock and applies
// gradients from the request's bytes; over rdma it serves small pulls and
// pushes on the endpoint's progress goroutine (bx.HandleInline), the
// rest on bx's worker pool, and its response is the one allocation per
// request left (bx copies a handler's response at a time the handler does
// not know). Over tcp a connection's requests are served in order by one
// goroutine.
//
// A server bounds its memory, not only per request and per parameter
// (StoreConfig.MaxBatch, MaxValues) but in all: StoreConfig.MaxBytes
// (default DefaultMaxBytes, 4 GiB) caps the parameter storage of all its
// parameters together, whoever defines them and however many rows pushes
// materialise. A define, or a push that would materialise rows, past it
// fails with ErrTooLarge naming the limit and changes nothing (a push is
// refused whole); pulls, and pushes to rows already there, go on. What is
// counted is the values (twice for Adagrad), a fixed cost a row and a
// parameter's fixed part (Store.Bytes): an estimate of the heap it takes,
// not the process's whole footprint.
//
// The wire protocol (proto.go) is a compact little-endian encoding that
// validates every length; the same bytes travel as a bx RPC payload or as
// one TCP frame. Errors from a server (unknown key, wrong dimension,
// oversized batch, NaN gradient, unknown parameter) reach the caller as a
// *ServerError that matches the sentinels with errors.Is; none of them
// stops a server.
//
// A server that restarts comes back empty: a client notices the new
// incarnation in the next response and returns ErrStateLost (once per
// restart) instead of silently serving re-initialised parameters. It
// defines again on that server what it defined there; a define the new
// server refuses (a smaller MaxValues, say) is named in that error, so a
// parameter left undefined is not lost without a word.
package ps
