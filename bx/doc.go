// Package bx is ByteExpress: messages, streams and RPC between processes
// over RDMA (RC queue pairs on one device), with a TCP control plane for
// setup, credit resync and recovery. It is built on packages uverbs, cq,
// qp and mr; its flow control (credits, send windows, duplicate
// filtering) is package flow.
//
// # What a user holds
//
//   - Endpoint (New(Config)): one process's presence on one RDMA device: a
//     shared receive queue whose buffers every peer's messages land in, one
//     event-driven CQ polled by a progress goroutine, buffer pools, and
//     its peers. Config.Device and Config.Token (at least 16 bytes, the
//     same at both ends) are required; zero values elsewhere take the
//     defaults Config lists, and New refuses a negative one it has no
//     meaning for, naming the field.
//   - Peer (Endpoint.Dial, or Endpoint.Listen then Accept): the
//     connection to one remote endpoint, a TCP control connection and
//     Config.Lanes RC QPs carrying any number of streams. Peer.ID is the
//     remote endpoint's incarnation: a restarted peer has a new one. Both
//     ends must run the same bx wire version: the handshake refuses a peer
//     of another (ErrProtocol, naming both versions).
//   - Stream (Peer.Stream(id)): a logical channel to a peer; messages of
//     one stream arrive in order. Send copies, SendBuffer hands over a
//     Buffer from Endpoint.Alloc without a copy; Recv returns a *Msg.
//   - RPC: Endpoint.Handle (or HandleInline, for a quick handler run on
//     the goroutine polling the CQ) serves a stream id for every peer;
//     Peer.Call sends a request and waits for the response. A handler
//     may build its response in place in a send buffer of bx's
//     (Msg.Reply): then it is posted with no allocation and no copy.
//     While the
//     endpoint polls, a waiting Call polls the CQ itself; on an endpoint
//     without handlers, when no other Call or Recv waits, it then leaves
//     the CQ to the next Call instead of waking the progress goroutine,
//     which looks again on its own after 4 Config.Spin
//     (GOVERBS_BX_LAZY=0 wakes it every time). In steady state a
//     request, response or stream message goes without its 48-byte
//     header, whose changes from the last one on the lane ride in the
//     immediate of a SEND_WITH_IMM (wire.go, "Compact data messages"): a
//     4 KiB payload is then 4 packets at IB MTU 1024, not 5
//     (GOVERBS_BX_COMPACT=0 sends every header). Messages
//     of up to 256 bytes, header included, are posted inline
//     (GOVERBS_BX_INLINE=0 posts them from their buffers). A polling
//     goroutine yields its P every 4 polls of an empty CQ
//     (GOVERBS_BX_YIELD=N sets N; 0 never yields, measured worse), and
//     its CPU to the kernel's other runnable threads (sched_yield) once
//     the CQ has been empty for 100 usec and every 100 usec after
//     (GOVERBS_BX_OSYIELD=usec; 0 never), but only while something else
//     of its endpoint waits (a second Call or Recv, or a blocking
//     handler on the worker pool): that buys a loaded parameter server
//     its tail, while a lone ping-pong, whose yield only woke the
//     process's own idle thread, keeps its CPU (a 4 KiB bx_lat under
//     TCG paid 1.4x for it; docs/perf.md, "Twenty-eighth session" and
//     "Thirty-first session"; GOVERBS_BX_OSYIELD_ALWAYS=1 yields as
//     before). After the CQ has been empty
//     for the spin window the progress goroutine arms it and sleeps; the
//     window starts at Config.Spin and doubles after each sleep shorter
//     than 4 Spins, up to 4 Spins (GOVERBS_BX_SPINGROWTH=N caps it at
//     N Spins; 1 keeps it at Spin): traffic with gaps of up to a
//     millisecond is polled through, which costs a core while it lasts
//     (docs/evaluation.md, "Twenty-third session" and "Thirty-seventh
//     session", has the trade measured: the cap was 16 Spins before).
//     The ticker that sends the credit and acknowledgement updates no
//     message carried looks every 2 ms while any are owed or messages
//     keep arriving, and sleeps one tick after the last
//     (GOVERBS_BX_TICK_US=usec sets it: scripts/bench-instr stretches it
//     for processes slowed down under valgrind).
//   - Msg: a received message whose Data is the buffer it landed in (no
//     copy). Release it when done: until then the buffer, and the credit
//     it stands for, is not returned to the peer. (A message that arrives
//     behind a rendezvous still waiting for its FIN is copied out, and
//     its buffer goes back at once: held, such messages could use every
//     credit the FIN needs.)
//   - Payloads over Config.EagerSize and at most Config.SplitSize (default
//     9 receive buffers' worth, 73288 bytes: a 64 KiB tensor with its ps
//     header) go split: as several eager messages (parts) in one
//     doorbell, copied into a buffer of the message's size at the
//     receiver, with no round trip before the data moves (wire.go, "Split
//     messages"). Under rxe that took a 16 KiB call from 1.41x to 1x, and
//     a 64 KiB one from 1.09x to 1x, of the same call by rendezvous
//     (docs/perf.md, "Thirty-fifth session").
//   - Larger payloads go by rendezvous: the sender RDMA
//     writes them straight into a buffer of the receiver, which a memory
//     window opens to that one peer for that one transfer (grant.go);
//     Config.SharedTargets gives that isolation up for speed among
//     trusted peers. Both ends of a connection use the same EagerSize
//     (the handshake refuses another); raising it, at the cost of larger
//     receive buffers, spares messages up to it the rendezvous's extra
//     round trip.
//   - Conn, through Endpoint.DialConn and Endpoint.Listener: a stream as a
//     net.Conn, for net/http, net/rpc or gRPC (package bx/bxgrpc). Like a
//     TCP connection it has a window of its own (256 KiB, or four
//     EagerSize messages if more): a reader that stops reading stalls its
//     writer only, and its unread data holds no receive buffer.
//
// # Lifecycle
//
//	e, err := bx.New(bx.Config{Device: "rxe0", Token: token})
//	...
//	defer e.Close()                     // disconnects every peer, releases the device
//	e.Handle(1, handler)                // a call to a stream with no handler fails (*RemoteError)
//	addr, err := e.Listen("10.0.0.1:0") // the control plane
//	p, err := e.Dial(ctx, peerAddr)
//	m, err := p.Call(ctx, 1, req)
//	...
//	m.Release()
//
// Peer.Close disconnects one peer; Stream.Close closes one stream, and the
// peer learns it (its Recv returns io.EOF once it read what was sent
// before). A Buffer passed to SendBuffer or CallBuffer belongs to bx
// whatever the result, and the caller's Buffer is emptied (it can be
// neither sent nor freed again; a Buffer of another Endpoint is refused);
// one never sent is given back with Free. Endpoint.Close makes
// calls in flight fail with ErrClosed.
//
// # Concurrency
//
// An endpoint serves all its peers at once, and a Peer is meant to be
// called from many goroutines: concurrent Calls on one Peer are the
// ordinary use (package ps and internal/cmd/chaosload do it). Blocking handlers
// run on a bounded pool of goroutines (Config.Workers); inline ones on
// the goroutine polling the CQ, so they must not block. A send that must
// wait for flow control (a credit from the peer, room in the send window)
// blocks, bounded by its context.
//
// # Errors
//
// Sentinels for errors.Is: ErrClosed (this endpoint, peer or stream was
// closed), ErrPeerGone (the peer was unreachable for Config.PeerTimeout,
// or is gone for good: Peer.Done is closed and Peer.Err says why),
// ErrRecovering (wrapped with a context's error when the peer was being
// recovered), ErrTooLarge, ErrProtocol, ErrAuth, ErrTLS, ErrConnRefused
// and ErrStreamClosed. A handler's error reaches the caller as a
// *RemoteError (IsRemote). When a peer's QPs fail, bx rebuilds them over
// the control connection and resends what the peer had not acknowledged;
// the receiver drops what it already had, so nothing is delivered twice,
// and calls in flight wait, bounded by their contexts (recovery.go).
// A QP that stops sending without failing (rxe on Linux 6.1 can, after a
// link down) is found by probing lanes whose messages wait for their
// acknowledgement and recovered the same way (Config.StallTimeout,
// stall.go; Stats.Probes and Stats.Stalls count).
//
// # Observing it
//
// Endpoint.Snapshot (counters, peers, RPC latency per stream class, pools),
// Endpoint.Stats and DumpState (every endpoint's flow-control state, for a
// stall); package metrics exports snapshots to Prometheus.
//
// README.md describes bx in its package table; docs/reliability.md has
// its fault scenarios and invariants, memory windows and the control
// plane; docs/mw.md the memory windows that open rendezvous targets;
// docs/perf.md its figures; docs/observability.md its metrics.
package bx
