// Package rcside is the set-up the raw-verbs examples (sendrecv, writeimm)
// share: one side's verbs objects for an RC queue pair (an open device, a
// protection domain, a registered buffer, a send and a receive completion
// queue, the QP), the TCP exchange of QP number, PSN and GID that connects
// two of them, and the wait for a completion. What each example does with
// the connected QP, the part worth reading, stays in its main.go.
package rcside

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

// Depth is how many work requests each queue holds: the QP's send and
// receive queues and each CQ.
const Depth = 4

// Side is one end's verbs objects: an open device, a protection domain,
// memory outside the Go heap registered in it, a send and a receive
// completion queue, and an RC queue pair.
type Side struct {
	Name           string // the device's
	Dev            *uverbs.Context
	PD             *uverbs.PD
	Mem            *mr.Memory
	MR             *mr.MR
	SendCQ, RecvCQ *cq.CQ
	QP             *qp.QP
	GID            uverbs.GID
	PSN            uint32
}

// Open opens dev and registers a buffer of size bytes with access; what
// access allows the peer to do (remote write) is allowed on the QP too.
func Open(dev string, size int, access mr.Access) (*Side, error) {
	s := &Side{Name: dev}
	if err := s.open(size, access); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

func (s *Side) open(size int, access mr.Access) error {
	var err error
	if s.Dev, err = uverbs.Open(s.Name); err != nil {
		return err
	}
	if s.PD, err = s.Dev.AllocPD(); err != nil {
		return err
	}
	if s.Mem, err = mr.Alloc(size); err != nil {
		return err
	}
	if s.MR, err = mr.Register(s.PD, s.Mem.Bytes(), access); err != nil {
		return err
	}
	// Events: Next sleeps in Wait instead of spinning on Poll.
	if s.SendCQ, err = cq.CreateWith(s.Dev, Depth, cq.Options{Events: true}); err != nil {
		return err
	}
	if s.RecvCQ, err = cq.CreateWith(s.Dev, Depth, cq.Options{Events: true}); err != nil {
		return err
	}
	if s.QP, err = qp.Create(s.PD, qp.Config{Type: qp.RC, SendCQ: s.SendCQ, RecvCQ: s.RecvCQ, MaxSendWR: Depth, MaxRecvWR: Depth}); err != nil {
		return err
	}
	// INIT already takes receives; Connect keeps them and the access.
	if err := s.QP.Init(1, access&mr.RemoteWrite); err != nil {
		return err
	}
	// The RoCE v2 GID with the port's IPv4 address, not index 0.
	if s.GID, err = s.Dev.DefaultGID(1); err != nil {
		return err
	}
	s.PSN = rand.Uint32() & 0xffffff // PSNs are 24 bits
	return nil
}

// Close destroys what Open created, newest first.
func (s *Side) Close() error {
	var errs []error
	if s.QP != nil {
		errs = append(errs, s.QP.Close())
	}
	if s.RecvCQ != nil {
		errs = append(errs, s.RecvCQ.Close())
	}
	if s.SendCQ != nil {
		errs = append(errs, s.SendCQ.Close())
	}
	if s.MR != nil {
		errs = append(errs, s.MR.Close())
	}
	if s.Mem != nil {
		errs = append(errs, s.Mem.Close())
	}
	if s.PD != nil {
		errs = append(errs, s.PD.Close())
	}
	if s.Dev != nil {
		errs = append(errs, s.Dev.Close())
	}
	return errors.Join(errs...)
}

// QPInfo is what each side tells the other over TCP so that their QPs can
// connect.
type QPInfo struct {
	QPN uint32 `json:"qpn"` // queue pair number
	PSN uint32 `json:"psn"` // the first packet sequence number it sends
	GID net.IP `json:"gid"` // the port's RoCE v2 GID (its IP address)
}

// Info is this side's QPInfo.
func (s *Side) Info() QPInfo {
	return QPInfo{QPN: s.QP.QPN(), PSN: s.PSN, GID: s.GID.GID}
}

// Connect moves the QP through RTR to RTS, connected to the peer's.
func (s *Side) Connect(peer QPInfo) error {
	return s.QP.Connect(qp.Remote{QPN: peer.QPN, PSN: peer.PSN, GID: peer.GID}, qp.ConnectOptions{PSN: s.PSN})
}

// Serve is the server's half of the exchange: it listens on addr, says
// "server: listening on ADDR (DEV, QPN N)" on out and sends ADDR on ready
// (if not nil), accepts one client and reads its T. The client speaks
// first; answer connects the QP before it returns the server's T, which
// Serve sends, so the client's first message finds the QP ready. The end
// of ctx ends the wait.
func Serve[T any](ctx context.Context, s *Side, addr string, out io.Writer, ready chan<- string, answer func(peer T) (T, error)) (peer T, err error) {
	l, err := new(net.ListenConfig).Listen(ctx, "tcp", addr)
	if err != nil {
		return peer, err
	}
	defer l.Close()
	stop := context.AfterFunc(ctx, func() { l.Close() }) // Ctrl-C ends Accept
	defer stop()
	fmt.Fprintf(out, "server: listening on %s (%s, QPN %d)\n", l.Addr(), s.Name, s.QP.QPN())
	if ready != nil {
		ready <- l.Addr().String()
	}
	conn, err := l.Accept()
	if err != nil {
		return peer, errors.Join(ctx.Err(), err)
	}
	defer conn.Close()
	stopConn := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopConn()

	if err := json.NewDecoder(conn).Decode(&peer); err != nil {
		return peer, fmt.Errorf("read the client's address: %w", err)
	}
	me, err := answer(peer)
	if err != nil {
		return peer, err
	}
	if err := json.NewEncoder(conn).Encode(me); err != nil {
		return peer, fmt.Errorf("send our address: %w", err)
	}
	return peer, nil
}

// Dial is the client's half: it connects to the server at addr, sends
// me and returns the server's T. The end of ctx ends the wait.
func Dial[T any](ctx context.Context, addr string, me T) (peer T, err error) {
	conn, err := new(net.Dialer).DialContext(ctx, "tcp", addr)
	if err != nil {
		return peer, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := json.NewEncoder(conn).Encode(me); err != nil {
		return peer, fmt.Errorf("send our address: %w", err)
	}
	if err := json.NewDecoder(conn).Decode(&peer); err != nil {
		return peer, fmt.Errorf("read the server's address: %w", err)
	}
	return peer, nil
}

// Next returns the next completion of c, sleeping in the netpoller while
// there is none. A completion with an error status is an error.
func Next(ctx context.Context, c *cq.CQ) (cq.WC, error) {
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
