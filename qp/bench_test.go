package qp_test

import (
	"errors"
	"testing"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/qp"
	wcs "github.com/goverbs/goverbs/wr" // (wr is a local name in this package's tests)
)

// BenchmarkPostSendPoll posts one signaled 64-byte RDMA WRITE and polls
// until it completes: the post, doorbell and poll path of a request.
func BenchmarkPostSendPoll(b *testing.B) {
	a, peer := connectedPair(b, pairOpts{})
	wrs := []qp.SendWR{{ID: 1, Opcode: qp.OpRDMAWrite, Flags: qp.Signaled,
		SGEs: []qp.SGE{a.sge(b, 0, 64)}, RemoteAddr: peer.addr(dstOff), RKey: peer.mr.RKey()}}
	wc := make([]cq.WC, 8)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := a.qp.PostSend(wrs); err != nil {
			b.Fatal(err)
		}
		for {
			n, err := a.cq.Poll(wc)
			if err != nil {
				b.Fatal(err)
			}
			if n > 0 {
				if wc[0].Status != wcs.WCSuccess {
					b.Fatal(wc[0].Err())
				}
				break
			}
		}
	}
}

// BenchmarkPostRecv posts receives one at a time; when the queue is full
// the peer consumes them, outside the timed part.
func BenchmarkPostRecv(b *testing.B) {
	a, peer := connectedPair(b, pairOpts{cfg: qp.Config{MaxSendWR: 256, MaxRecvWR: 256}})
	rwr := []qp.RecvWR{{ID: 1, SGEs: []qp.SGE{peer.sge(b, dstOff, 64)}}}
	send := make([]qp.SendWR, 16)
	for i := range send {
		send[i] = qp.SendWR{Opcode: qp.OpSend, SGEs: []qp.SGE{a.sge(b, 0, 8)}}
	}
	send[len(send)-1].Flags = qp.Signaled
	posted := 0
	drain := func() {
		for posted > 0 {
			n := min(posted, len(send))
			ws := send[len(send)-n:]
			if err := a.qp.PostSend(ws); err != nil {
				b.Fatal(err)
			}
			a.waitOK(b, 1)
			peer.waitOK(b, n)
			posted -= n
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		err := peer.qp.PostRecv(rwr)
		if errors.Is(err, qp.ErrQueueFull) {
			b.StopTimer()
			drain()
			b.StartTimer()
			err = peer.qp.PostRecv(rwr)
		}
		if err != nil {
			b.Fatal(err)
		}
		posted++
	}
	b.StopTimer()
	drain()
}

// BenchmarkPollEmpty is the cost of looking at an empty CQ.
func BenchmarkPollEmpty(b *testing.B) {
	a, _ := connectedPair(b, pairOpts{})
	wc := make([]cq.WC, 16)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if n, err := a.cq.Poll(wc); n != 0 || err != nil {
			b.Fatal(n, err)
		}
	}
}
