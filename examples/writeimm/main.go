// Writeimm shows RDMA WRITE with immediate data on raw verbs (packages
// uverbs, mr, cq, qp): the server registers a buffer that peers may write
// (mr.RemoteWrite) and tells the client its address and rkey, with its QP
// number, PSN and GID, over TCP. The client writes records into that
// buffer, one after the other; the server's CPU takes no part in moving the
// bytes, but each WRITE WITH IMM also consumes a receive the server posted,
// and its completion carries the immediate value (here: the offset the
// record was written at) and the length. A last write of no bytes tells
// the server the client is done; the server then prints its buffer. The
// set-up, which sendrecv shares, is in examples/internal/rcside: the verbs
// objects (Open), the TCP exchange (Serve, Dial) and the wait for a
// completion (Next).
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
	"errors"
	"fmt"
	"io"

	"github.com/goverbs/goverbs/examples/internal/exrun"
	"github.com/goverbs/goverbs/examples/internal/rcside"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/wr"
)

// records are what the client writes, back to back, into the server's
// buffer.
var records = []string{"RDMA WRITE puts bytes ", "straight into the server's memory; ", "the immediate tells the server where."}

// bufSize is the size of each side's buffer.
const bufSize = 4096

// recvDepth is how many receives the server keeps posted, as many as its
// QP's receive queue holds: each WRITE WITH IMM consumes one.
const recvDepth = rcside.Depth

// example is this program; exrun gives it its flags (-role, -d, -addr)
// and runs both roles in one process.
var example = exrun.Verbs("writeimm", server, client)

func main() { example.Main() }

// peerInfo is what each side tells the other over TCP: its QP's address,
// and (the server) where the client may write.
type peerInfo struct {
	rcside.QPInfo
	Addr uint64 `json:"addr,omitempty"` // the buffer's address in the server's memory
	RKey uint32 `json:"rkey,omitempty"` // the key that lets the peer write it
	Len  int    `json:"len,omitempty"`  // the buffer's length
}

func server(ctx context.Context, dev, addr string, out io.Writer, ready chan<- string) (err error) {
	// The buffer and the QP allow remote writes.
	s, err := rcside.Open(dev, bufSize, mr.LocalWrite|mr.RemoteWrite)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	// Receives without a buffer: a WRITE WITH IMM needs one for its
	// completion; its bytes go where the writer said.
	recvs := make([]qp.RecvWR, recvDepth)
	if err := s.QP.PostRecv(recvs); err != nil {
		return err
	}

	peer, err := rcside.Serve(ctx, s, addr, out, ready, func(peer peerInfo) (peerInfo, error) {
		if err := s.Connect(peer.QPInfo); err != nil {
			return peerInfo{}, err
		}
		return peerInfo{QPInfo: s.Info(), Addr: s.MR.Addr(), RKey: s.MR.RKey(), Len: bufSize}, nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "server: connected to QPN %d at %s; buffer at %#x, rkey %#x\n", peer.QPN, peer.GID, s.MR.Addr(), s.MR.RKey())

	buf := s.Mem.Bytes()[:bufSize]
	for {
		wc, err := rcside.Next(ctx, s.RecvCQ)
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
		if err := s.QP.PostRecv(recvs[:1]); err != nil {
			return err
		}
	}
}

func client(ctx context.Context, dev, addr string, out io.Writer) (err error) {
	s, err := rcside.Open(dev, bufSize, mr.LocalWrite)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Close()) }()

	peer, err := rcside.Dial(ctx, addr, peerInfo{QPInfo: s.Info()})
	if err != nil {
		return err
	}
	if err := s.Connect(peer.QPInfo); err != nil {
		return err
	}
	fmt.Fprintf(out, "client: %s connected to QPN %d at %s; its buffer at %#x, rkey %#x\n", dev, peer.QPN, peer.GID, peer.Addr, peer.RKey)

	off := 0
	for _, rec := range records {
		if off+len(rec) > min(peer.Len, bufSize) {
			return fmt.Errorf("record %q does not fit in the buffer", rec)
		}
		if err := write(ctx, s, peer, off, rec); err != nil {
			return err
		}
		fmt.Fprintf(out, "client: wrote %q at offset %d\n", rec, off)
		off += len(rec)
	}
	// Done: a write of no bytes, whose immediate is the end.
	if err := write(ctx, s, peer, off, ""); err != nil {
		return err
	}
	fmt.Fprintf(out, "client: done after %d bytes\n", off)
	return nil
}

// write RDMA-WRITEs data to the peer's buffer at off, from the same offset
// of ours, with off as the immediate, and waits for its completion.
func write(ctx context.Context, s *rcside.Side, peer peerInfo, off int, data string) error {
	wr := qp.SendWR{ID: 1, Opcode: qp.OpRDMAWriteWithImm, Flags: qp.Signaled, Imm: uint32(off),
		RemoteAddr: peer.Addr + uint64(off), RKey: peer.RKey}
	if len(data) > 0 {
		copy(s.Mem.Bytes()[off:], data)
		sge, err := s.MR.SGE(off, len(data))
		if err != nil {
			return err
		}
		wr.SGEs = []qp.SGE{sge}
	}
	if err := s.QP.PostSend([]qp.SendWR{wr}); err != nil {
		return err
	}
	_, err := rcside.Next(ctx, s.SendCQ)
	return err
}
