// Writeimm shows RDMA WRITE with immediate data on raw verbs (packages
// uverbs, mr, cq, qp): the server registers a buffer that peers may write
// (mr.RemoteWrite) and tells the client its address and rkey, with its QP
// number, PSN and GID, over TCP. The client writes records into that
// buffer, one after the other; the server's CPU takes no part in moving the
// bytes, but each WRITE WITH IMM also consumes a receive the server posted,
// and its completion carries the immediate value (here: the offset the
// record was written at) and the length. A last write of no bytes tells
// the server the client is done; the server then prints its buffer.
//
// In the rxe guest (docs/vm.md), both roles in one process (the server on
// rxe1 at 10.99.0.2, the client on rxe0):
//
//	scripts/vm -- go run ./examples/writeimm
//
// As two processes:
//
//	scripts/vm -- sh -c 'go build -o /tmp/writeimm ./examples/writeimm &&
//		{ /tmp/writeimm -role server & sleep 2; /tmp/writeimm -role client; wait; }'
//
// Between two machines: `writeimm -role server -d DEV -addr :18515` on
// one, `writeimm -role client -d DEV -addr SERVER:18515` on the other.
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
	"github.com/goverbs/goverbs/wr"
)

// records are what the client writes, back to back, into the server's
// buffer.
var records = []string{"RDMA WRITE puts bytes ", "straight into the server's memory; ", "the immediate tells the server where."}

// bufSize is the size of each side's buffer.
const bufSize = 4096

// recvDepth is how many receives the server keeps posted: each WRITE WITH
// IMM consumes one.
const recvDepth = 4

// example is this program; exrun gives it its flags (-role, -d, -addr)
// and runs both roles in one process.
var example = exrun.Verbs("writeimm", server, client)

func main() { example.Main() }

// peerInfo is what each side tells the other over TCP: its QP's address,
// and (the server) where the client may write.
type peerInfo struct {
	QPN  uint32 `json:"qpn"`
	PSN  uint32 `json:"psn"`
	GID  net.IP `json:"gid"`
	Addr uint64 `json:"addr,omitempty"` // the buffer's address in the server's memory
	RKey uint32 `json:"rkey,omitempty"` // the key that lets the peer write it
	Len  int    `json:"len,omitempty"`  // the buffer's length
}

func server(ctx context.Context, dev, addr string, out io.Writer, ready chan<- string) (err error) {
	// The buffer and the QP allow remote writes.
	s, err := newSide(dev, mr.LocalWrite|mr.RemoteWrite)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	// Receives without a buffer: a WRITE WITH IMM needs one for its
	// completion; its bytes go where the writer said.
	recvs := make([]qp.RecvWR, recvDepth)
	if err := s.qp.PostRecv(recvs); err != nil {
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

	var peer peerInfo
	if err := json.NewDecoder(conn).Decode(&peer); err != nil {
		return fmt.Errorf("read the client's address: %w", err)
	}
	if err := s.connect(peer); err != nil {
		return err
	}
	me := s.info()
	me.Addr, me.RKey, me.Len = s.mr.Addr(), s.mr.RKey(), bufSize
	if err := json.NewEncoder(conn).Encode(me); err != nil {
		return fmt.Errorf("send our address: %w", err)
	}
	fmt.Fprintf(out, "server: connected to QPN %d at %s; buffer at %#x, rkey %#x\n", peer.QPN, peer.GID, me.Addr, me.RKey)

	buf := s.mem.Bytes()[:bufSize]
	for {
		wc, err := next(ctx, s.recvCQ)
		if err != nil {
			return err
		}
		if wc.Opcode != wr.WCRecvRDMAImm || wc.Flags&wr.WCWithImm == 0 {
			return fmt.Errorf("completion %v, want an RDMA WRITE with immediate", wc.Opcode)
		}
		off, n := int(wc.Imm), int(wc.ByteLen)
		if off+n > len(buf) {
			return fmt.Errorf("immediate %d and length %d: outside the buffer", off, n)
		}
		if n == 0 {
			fmt.Fprintf(out, "server: empty write, immediate %d: done; buffer: %q\n", off, buf[:off])
			return nil
		}
		fmt.Fprintf(out, "server: write of %d bytes, immediate %d: %q\n", n, off, buf[off:off+n])
		if err := s.qp.PostRecv(recvs[:1]); err != nil {
			return err
		}
	}
}

func client(ctx context.Context, dev, addr string, out io.Writer) (err error) {
	s, err := newSide(dev, mr.LocalWrite)
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
	fmt.Fprintf(out, "client: %s connected to QPN %d at %s; its buffer at %#x, rkey %#x\n", dev, peer.QPN, peer.GID, peer.Addr, peer.RKey)

	off := 0
	for _, rec := range records {
		if off+len(rec) > min(peer.Len, bufSize) {
			return fmt.Errorf("record %q does not fit in the buffer", rec)
		}
		if err := s.write(ctx, peer, off, rec); err != nil {
			return err
		}
		fmt.Fprintf(out, "client: wrote %q at offset %d\n", rec, off)
		off += len(rec)
	}
	// Done: a write of no bytes, whose immediate is the end.
	if err := s.write(ctx, peer, off, ""); err != nil {
		return err
	}
	fmt.Fprintf(out, "client: done after %d bytes\n", off)
	return nil
}

// write RDMA-WRITEs data to the peer's buffer at off, from the same offset
// of ours, with off as the immediate, and waits for its completion.
func (s *side) write(ctx context.Context, peer peerInfo, off int, data string) error {
	wr := qp.SendWR{ID: 1, Opcode: qp.OpRDMAWriteWithImm, Flags: qp.Signaled, Imm: uint32(off),
		RemoteAddr: peer.Addr + uint64(off), RKey: peer.RKey}
	if len(data) > 0 {
		copy(s.mem.Bytes()[off:], data)
		sge, err := s.mr.SGE(off, len(data))
		if err != nil {
			return err
		}
		wr.SGEs = []qp.SGE{sge}
	}
	if err := s.qp.PostSend([]qp.SendWR{wr}); err != nil {
		return err
	}
	_, err := next(ctx, s.sendCQ)
	return err
}

// side is one end's verbs objects: an open device, a protection domain,
// memory outside the Go heap registered in it, a send and a receive
// completion queue, and an RC queue pair.
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

// newSide opens dev and registers the buffer with access; what access
// allows the peer to do (remote write) is allowed on the QP too.
func newSide(dev string, access mr.Access) (*side, error) {
	s := &side{}
	if err := s.open(dev, access); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

func (s *side) open(dev string, access mr.Access) error {
	var err error
	if s.dev, err = uverbs.Open(dev); err != nil {
		return err
	}
	if s.pd, err = s.dev.AllocPD(); err != nil {
		return err
	}
	if s.mem, err = mr.Alloc(bufSize); err != nil {
		return err
	}
	if s.mr, err = mr.Register(s.pd, s.mem.Bytes(), access); err != nil {
		return err
	}
	// Events: next sleeps in Wait instead of spinning on Poll.
	if s.sendCQ, err = cq.CreateWith(s.dev, recvDepth, cq.Options{Events: true}); err != nil {
		return err
	}
	if s.recvCQ, err = cq.CreateWith(s.dev, recvDepth, cq.Options{Events: true}); err != nil {
		return err
	}
	if s.qp, err = qp.Create(s.pd, qp.Config{Type: qp.RC, SendCQ: s.sendCQ, RecvCQ: s.recvCQ, MaxSendWR: 4, MaxRecvWR: recvDepth}); err != nil {
		return err
	}
	// INIT already takes receives; Connect keeps them and the access.
	if err := s.qp.Init(1, access&mr.RemoteWrite); err != nil {
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
