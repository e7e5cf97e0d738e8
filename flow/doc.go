// Package flow is ByteExpress's flow control: receive credits, a software
// send window and duplicate filtering. It is pure logic: no syscalls, no
// clock reads in decisions (time is passed in), no allocation on the fast
// paths.
//
// # What a user holds, per peer and per endpoint
//
//   - Credits (sender side, one per peer): may I make the peer consume a
//     receive buffer? TryAcquire/Acquire before posting a SEND,
//     SEND_WITH_IMM or WRITE_WITH_IMM; Grant with every cumulative grant
//     the peer sends back.
//   - Returner (receiver side, one per peer): Consumed when a message
//     arrives, Released when the application lets go of its buffer and it
//     is re-posted, Piggyback when building any header to the peer,
//     NeedsUpdate from events and a timer to decide on an explicit update.
//   - Window (one per endpoint, a child per QP): bounds messages and bytes
//     posted but not completed; Acquire before posting, Release on the
//     send completion.
//   - Dedup (receiver side, one per peer stream): drops resends after
//     recovery by sequence number.
//
// A bx send is therefore: Window.Acquire (QP and endpoint at once),
// Credits.Acquire(1), Returner.Piggyback for the header, post; on the send
// completion Window.Release. Blocking happens only in the two Acquires,
// both context-aware; an application sees a slow peer as Send blocking (or
// its context expiring), never as a receiver-not-ready error or a drop.
//
// # Credits
//
// A credit is one receive buffer, of the size agreed at connection setup,
// that the receiver has posted (in its shared receive queue) on behalf of
// one peer. The receiver posts Grant buffers per peer and tells the peer
// that number at setup. Every message that consumes a receive takes one
// credit; the sender never posts one without a credit, so a receive buffer
// is always there (no RNR retries, no drops). The invariant checked by the
// tests: messages in flight + messages delivered but not re-posted <=
// buffers posted for that peer.
//
// # How credits return
//
// Grants are cumulative: the receiver's grant is Grant plus every buffer
// it has re-posted since the epoch began. The sender's available credits
// are grant - consumed. Because the value only grows, a duplicated,
// reordered (several QPs per peer) or lost update is harmless: the next
// one supersedes it, and Credits.Grant ignores anything not above what it
// has. A counter is a small fixed field, so every outgoing message header
// carries it (Returner.Piggyback). With no traffic to piggyback on, the
// receiver sends an explicit credit update, a small control message, when
// Returner.NeedsUpdate says so: the returnable data credits reach a
// threshold (default half the grant), or credits have waited an idle
// timeout.
//
// # The control reserve and why it prevents deadlock
//
// An explicit update consumes a receive at the peer too, so it needs a
// credit. If data could spend every credit, two peers could fill each
// other's buffers; each application releases its buffers, each side now
// owes the other credits, and neither can send the update: deadlock.
// Hence ControlReserve: data may never take a peer's last credit
// (Credits.TryAcquire leaves it), only a control message may
// (Credits.TryAcquireControl).
//
// The reserve is spent when an update goes out while data credits are
// exhausted. The update's own buffer is re-posted at once by its receiver
// (Returner.ReleasedControl) and goes back in that side's next grant. Three
// rules close the remaining gaps:
//
//   - An update is only sent when it carries at least one new credit, so
//     its receiver can send at least one message once it arrives: at most
//     one side of a pair is ever at zero credits with nothing in flight.
//     An update that carries something else only (bx's acknowledgements)
//     takes a data credit (TryAcquire), never the reserve: two such
//     updates crossing left both sides at zero, each owing the other
//     credits it could not send.
//   - The side that can send sees from its own counters when the peer has
//     no data credit left (told - consumed <= ControlReserve) and then
//     returns whatever it holds, even only re-posted control buffers,
//     after the idle timeout.
//     Otherwise re-posted control buffers never trigger an update, so idle
//     peers settle instead of ping-ponging updates.
//   - A peer is granted at least MinGrant (3) buffers. One update leaves
//     one control credit waiting at its receiver until that side next
//     sends; with 3 buffers the sender of the update still has a data
//     credit, so nothing is due and the pair goes quiet. With 2 the credit
//     would bounce between two idle peers forever.
//
// Applications must still release received buffers without waiting for
// their own sends to the same peer to complete; flow control cannot undo
// an application-level cycle.
//
// # Epochs and recovery
//
// Counters are cumulative within an epoch, and each grant travels with its
// epoch. When the QPs to a peer fail, the bx recovery RPC (over TCP) moves
// both sides to a new epoch: the receiver's Returner.Resync returns its
// cumulative grant G and consumed count C, and the sender's Credits.Resync
// adopts them, so available = G - C: messages lost with the old QPs never
// consumed a buffer (the SRQ keeps them posted) and are forgiven. Resync
// requires that no message of the old epoch can still arrive (every QP to
// the peer was reset first). Grants from an older epoch still in flight
// are ignored; a grant from a newer epoch than the sender knows is an
// error. If the receiver lost its state altogether, Reset on both sides
// starts the new epoch from the initial grant.
//
// Lost messages are resent with their original sequence numbers, and some
// of them had arrived after all; Dedup, per peer stream, delivers each
// sequence once. On a single RC QP delivery is in order and Dedup only
// drops the resent prefix. When a stream is striped over several QPs,
// messages interleave across QPs; Dedup's bitmap window covers that
// reordering and must be at least the stream's send window.
//
// # Send window
//
// Window bounds what is posted but not completed, in messages and bytes,
// per QP (the send queue depth, the NIC's outstanding reads) and per
// endpoint (memory pinned in flight). Windows form a tree, and an acquire
// takes its QP window and the endpoint window atomically (one lock per
// tree: all or nothing, no lock ordering to get wrong). Waiters are served
// FIFO per window without head-of-line blocking between sibling QPs; a
// message larger than the byte limit is admitted alone when the window is
// empty rather than rejected.
package flow
