// Sendrecv shows raw RDMA verbs (packages uverbs, mr, cq, qp): two
// processes each open a device and create a protection domain, a
// registered buffer, completion queues and an RC queue pair; they exchange
// QP number, PSN and GID over a TCP connection, connect the QPs, and the
// client SENDs a few messages into receives the server posted. The server
// prints each message and sends it back; the client checks the echo.
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
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/examples/internal/exrun"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
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
// can connect.
type peerInfo struct {
	QPN uint32 `json:"qpn"` // queue pair number
	PSN uint32 `json:"psn"` // the first packet sequence number it sends
	GID net.IP `json:"gid"` // the port's RoCE v2 GID (its IP address)
}

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

	l, err := new(net.ListenConfig).Listen(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer l.Close()
	stop := context.AfterFunc(ctx, func() { l.Close() }) // Ctrl-C ends Accept
	defer stop()
	fmt.Fprintf(out, "server: listening on %s (%s, QPN %d)\n", l.Addr(), dev, s.qp.QPN())
	if ready != nil {
		ready <- l.Addr().String()
	}
	conn, err := l.Accept()
	if err != nil {
		return errors.Join(ctx.Err(), err)
	}
	defer conn.Close()
	stopConn := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopConn()

	// The client speaks first; the server connects its QP before it
	// answers, so the client's first SEND finds it ready.
	var peer peerInfo
	if err := json.NewDecoder(conn).Decode(&peer); err != nil {
		return fmt.Errorf("read the client's address: %w", err)
	}
	if err := s.connect(peer); err != nil {
		return err
	}
	if err := json.NewEncoder(conn).Encode(s.info()); err != nil {
		return fmt.Errorf("send our address: %w", err)
	}
	fmt.Fprintf(out, "server: connected to QPN %d at %s\n", peer.QPN, peer.GID)

	for {
		wc, err := next(ctx, s.recvCQ)
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

	conn, err := new(net.Dialer).DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := json.NewEncoder(conn).Encode(s.info()); err != nil {
		return fmt.Errorf("send our address: %w", err)
	}
	var peer peerInfo
	if err := json.NewDecoder(conn).Decode(&peer); err != nil {
		return fmt.Errorf("read the server's address: %w", err)
	}
	if err := s.connect(peer); err != nil {
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
		wc, err := next(ctx, s.recvCQ)
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

// side is one end's verbs objects: an open device, a protection domain,
// memory outside the Go heap registered in it (a receive slot, then a send
// slot), a send and a receive completion queue, and an RC queue pair.
type side struct {
	dev            *uverbs.Context
	pd             *uverbs.PD
	mem            *mr.Memory
	mr             *mr.MR
	sendCQ, recvCQ *cq.CQ
	qp             *qp.QP
	gid            uverbs.GID
	psn            uint32
}

func newSide(dev string) (*side, error) {
	s := &side{}
	if err := s.open(dev); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

func (s *side) open(dev string) error {
	var err error
	if s.dev, err = uverbs.Open(dev); err != nil {
		return err
	}
	if s.pd, err = s.dev.AllocPD(); err != nil {
		return err
	}
	if s.mem, err = mr.Alloc(2 * slot); err != nil {
		return err
	}
	if s.mr, err = mr.Register(s.pd, s.mem.Bytes(), mr.LocalWrite); err != nil {
		return err
	}
	// Events: next sleeps in Wait instead of spinning on Poll.
	if s.sendCQ, err = cq.CreateWith(s.dev, 4, cq.Options{Events: true}); err != nil {
		return err
	}
	if s.recvCQ, err = cq.CreateWith(s.dev, 4, cq.Options{Events: true}); err != nil {
		return err
	}
	if s.qp, err = qp.Create(s.pd, qp.Config{Type: qp.RC, SendCQ: s.sendCQ, RecvCQ: s.recvCQ, MaxSendWR: 4, MaxRecvWR: 4}); err != nil {
		return err
	}
	// INIT already takes receives; Connect keeps them.
	if err := s.qp.Init(1, 0); err != nil {
		return err
	}
	// The RoCE v2 GID with the port's IPv4 address, not index 0.
	if s.gid, err = s.dev.DefaultGID(1); err != nil {
		return err
	}
	s.psn = rand.Uint32() & 0xffffff // PSNs are 24 bits
	return nil
}

// Close destroys what open created, newest first.
func (s *side) Close() error {
	var errs []error
	if s.qp != nil {
		errs = append(errs, s.qp.Close())
	}
	if s.recvCQ != nil {
		errs = append(errs, s.recvCQ.Close())
	}
	if s.sendCQ != nil {
		errs = append(errs, s.sendCQ.Close())
	}
	if s.mr != nil {
		errs = append(errs, s.mr.Close())
	}
	if s.mem != nil {
		errs = append(errs, s.mem.Close())
	}
	if s.pd != nil {
		errs = append(errs, s.pd.Close())
	}
	if s.dev != nil {
		errs = append(errs, s.dev.Close())
	}
	return errors.Join(errs...)
}

func (s *side) info() peerInfo {
	return peerInfo{QPN: s.qp.QPN(), PSN: s.psn, GID: s.gid.GID}
}

// connect moves the QP through RTR to RTS, connected to the peer's.
func (s *side) connect(peer peerInfo) error {
	return s.qp.Connect(qp.Remote{QPN: peer.QPN, PSN: peer.PSN, GID: peer.GID}, qp.ConnectOptions{PSN: s.psn})
}

func (s *side) recvBuf() []byte { return s.mem.Bytes()[:slot] }

// postRecv posts the receive slot.
func (s *side) postRecv() error {
	sge, err := s.mr.SGE(0, slot)
	if err != nil {
		return err
	}
	return s.qp.PostRecv([]qp.RecvWR{{ID: 1, SGEs: []qp.SGE{sge}}})
}

// send SENDs msg from the send slot and waits for its completion: the
// peer acknowledged it, so the slot may be reused.
func (s *side) send(ctx context.Context, msg string) error {
	if len(msg) > slot {
		return fmt.Errorf("message of %d bytes, the slot holds %d", len(msg), slot)
	}
	copy(s.mem.Bytes()[slot:], msg)
	sge, err := s.mr.SGE(slot, len(msg))
	if err != nil {
		return err
	}
	if err := s.qp.PostSend([]qp.SendWR{{ID: 2, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{sge}}}); err != nil {
		return err
	}
	_, err = next(ctx, s.sendCQ)
	return err
}

// next returns the next completion of c, sleeping in the netpoller while
// there is none. A completion with an error status is an error.
func next(ctx context.Context, c *cq.CQ) (cq.WC, error) {
	wc := make([]cq.WC, 1)
	for {
		n, err := c.Poll(wc)
		if err != nil {
			return cq.WC{}, err
		}
		if n == 1 {
			return wc[0], wc[0].Err()
		}
		if err := c.Wait(ctx); err != nil {
			return cq.WC{}, err
		}
	}
}
