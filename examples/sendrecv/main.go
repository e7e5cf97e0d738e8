// Sendrecv shows raw RDMA verbs (packages uverbs, mr, cq, qp): two
// processes each open a device and create a protection domain, a
// registered buffer, completion queues and an RC queue pair; they exchange
// QP number, PSN and GID over a TCP connection, connect the QPs, and the
// client SENDs a few messages into receives the server posted. The server
// prints each message and sends it back; the client checks the echo. The
// set-up, which writeimm shares, is in examples/internal/rcside: the verbs
// objects (Open), the TCP exchange (Serve, Dial) and the wait for a
// completion (Next).
//
// In the rxe guest (docs/vm.md), both roles in one process (the server on
// rxe1 at 10.99.0.2, the client on rxe0):
//
//	scripts/vm -- go run ./examples/sendrecv
//
// As two processes:
//
//	scripts/vm -- sh -c 'go build -o /tmp/sendrecv ./examples/sendrecv &&
//		{ /tmp/sendrecv -role server & sleep 2; /tmp/sendrecv -role client; wait; }'
//
// Between two machines: `sendrecv -role server -d DEV -addr :18515` on
// one, `sendrecv -role client -d DEV -addr SERVER:18515` on the other.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/goverbs/goverbs/examples/internal/exrun"
	"github.com/goverbs/goverbs/examples/internal/rcside"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
)

// messages are what the client sends; "bye" ends the server's loop.
var messages = []string{"hello over RDMA", "a SEND lands in a RECV the peer posted", "bye"}

// slot is the size of the receive buffer and of the send buffer.
const slot = 4096

// example is this program; exrun gives it its flags (-role, -d, -addr)
// and runs both roles in one process.
var example = exrun.Verbs("sendrecv", server, client)

func main() { example.Main() }

// peerInfo is what each side tells the other over TCP so that their QPs
// can connect: QP number, PSN and GID.
type peerInfo = rcside.QPInfo

func server(ctx context.Context, dev, addr string, out io.Writer, ready chan<- string) (err error) {
	s, err := newSide(dev)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	// Post the first receive before any message can arrive.
	if err := s.postRecv(); err != nil {
		return err
	}

	// The client speaks first; the server connects its QP before it
	// answers, so the client's first SEND finds it ready.
	peer, err := rcside.Serve(ctx, s.Side, addr, out, ready, func(peer peerInfo) (peerInfo, error) {
		if err := s.Connect(peer); err != nil {
			return peerInfo{}, err
		}
		return s.Info(), nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "server: connected to QPN %d at %s\n", peer.QPN, peer.GID)

	for {
		wc, err := rcside.Next(ctx, s.RecvCQ)
		if err != nil {
			return err
		}
		msg := string(s.recvBuf()[:wc.ByteLen]) // copies out of the buffer
		fmt.Fprintf(out, "server: received %q\n", msg)
		// The buffer is free again: post it for the next message before
		// the echo lets the client send one.
		if err := s.postRecv(); err != nil {
			return err
		}
		if err := s.send(ctx, msg); err != nil {
			return err
		}
		if msg == "bye" {
			return nil
		}
	}
}

func client(ctx context.Context, dev, addr string, out io.Writer) (err error) {
	s, err := newSide(dev)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Close()) }()

	peer, err := rcside.Dial(ctx, addr, s.Info())
	if err != nil {
		return err
	}
	if err := s.Connect(peer); err != nil {
		return err
	}
	fmt.Fprintf(out, "client: %s connected to QPN %d at %s\n", dev, peer.QPN, peer.GID)

	for _, msg := range messages {
		// The receive for the echo is posted before the message goes out.
		if err := s.postRecv(); err != nil {
			return err
		}
		if err := s.send(ctx, msg); err != nil {
			return err
		}
		wc, err := rcside.Next(ctx, s.RecvCQ)
		if err != nil {
			return err
		}
		echo := string(s.recvBuf()[:wc.ByteLen])
		fmt.Fprintf(out, "client: sent %q, echo %q\n", msg, echo)
		if echo != msg {
			return fmt.Errorf("echo %q, want %q", echo, msg)
		}
	}
	return nil
}

// side is one end's verbs objects (rcside.Side) with its memory in two
// slots: a receive slot, then a send slot.
type side struct{ *rcside.Side }

func newSide(dev string) (side, error) {
	s, err := rcside.Open(dev, 2*slot, mr.LocalWrite)
	return side{s}, err
}

func (s *side) recvBuf() []byte { return s.Mem.Bytes()[:slot] }

// postRecv posts the receive slot.
func (s *side) postRecv() error {
	sge, err := s.MR.SGE(0, slot)
	if err != nil {
		return err
	}
	return s.QP.PostRecv([]qp.RecvWR{{ID: 1, SGEs: []qp.SGE{sge}}})
}

// send SENDs msg from the send slot and waits for its completion: the
// peer acknowledged it, so the slot may be reused.
func (s *side) send(ctx context.Context, msg string) error {
	if len(msg) > slot {
		return fmt.Errorf("message of %d bytes, the slot holds %d", len(msg), slot)
	}
	copy(s.Mem.Bytes()[slot:], msg)
	sge, err := s.MR.SGE(slot, len(msg))
	if err != nil {
		return err
	}
	if err := s.QP.PostSend([]qp.SendWR{{ID: 2, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{sge}}}); err != nil {
		return err
	}
	_, err = rcside.Next(ctx, s.SendCQ)
	return err
}
