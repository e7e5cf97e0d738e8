package qp_test

import (
	"fmt"
	"log"
	"math/rand/v2"
	"testing"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

// endpoint is one side of a reliable connection: its QP and what the peer
// must learn to connect to it (QPN, PSN, GID), which two processes
// exchange out of band, over TCP for example (examples/sendrecv does).
type endpoint struct {
	ctx *uverbs.Context
	mem *mr.Memory
	q   *qp.QP
	c   *cq.CQ
	m   *mr.MR
	buf []byte
	psn uint32
	gid uverbs.GID
}

func open(dev string) *endpoint {
	ctx, err := uverbs.Open(dev)
	if err != nil {
		log.Fatal(err)
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		log.Fatal(err)
	}
	mem, err := mr.Alloc(4096)
	if err != nil {
		log.Fatal(err)
	}
	m, err := mr.Register(pd, mem.Bytes(), mr.LocalWrite)
	if err != nil {
		log.Fatal(err)
	}
	c, err := cq.Create(ctx, 16)
	if err != nil {
		log.Fatal(err)
	}
	q, err := qp.Create(pd, qp.Config{Type: qp.RC, SendCQ: c, RecvCQ: c, MaxSendWR: 8, MaxRecvWR: 8})
	if err != nil {
		log.Fatal(err)
	}
	if err := q.Init(1, 0); err != nil { // INIT takes receives already
		log.Fatal(err)
	}
	gid, err := ctx.DefaultGID(1)
	if err != nil {
		log.Fatal(err)
	}
	return &endpoint{ctx: ctx, mem: mem, q: q, c: c, m: m, buf: mem.Bytes(), psn: rand.Uint32() & 0xffffff, gid: gid}
}

// close destroys the QP, CQ, MR and PD (the context's Close destroys what
// it still holds, newest first), then unmaps the memory.
func (e *endpoint) close() {
	if err := e.ctx.Close(); err != nil {
		log.Print(err)
	}
	if err := e.mem.Close(); err != nil {
		log.Print(err)
	}
}

func (e *endpoint) connect(peer *endpoint) {
	err := e.q.Connect(qp.Remote{QPN: peer.q.QPN(), PSN: peer.psn, GID: peer.gid.GID}, qp.ConnectOptions{PSN: e.psn})
	if err != nil {
		log.Fatal(err)
	}
}

func (e *endpoint) poll() cq.WC {
	wc := make([]cq.WC, 1)
	for {
		n, err := e.c.Poll(wc)
		if err != nil {
			log.Fatal(err)
		}
		if n == 1 {
			if err := wc[0].Err(); err != nil {
				log.Fatal(err)
			}
			return wc[0]
		}
	}
}

// Two RC QPs, one on each rxe device of the guest, connected to each
// other; one SENDs, the other RECVs into a posted buffer.
func ExampleQP_Connect() {
	a, b := open("rxe0"), open("rxe1")
	defer a.close()
	defer b.close()
	a.connect(b)
	b.connect(a)

	rsge, err := b.m.SGE(0, len(b.buf))
	if err != nil {
		log.Fatal(err)
	}
	if err := b.q.PostRecv([]qp.RecvWR{{ID: 7, SGEs: []qp.SGE{rsge}}}); err != nil {
		log.Fatal(err)
	}
	n := copy(a.buf, "hello over RC")
	ssge, err := a.m.SGE(0, n)
	if err != nil {
		log.Fatal(err)
	}
	if err := a.q.PostSend([]qp.SendWR{{ID: 1, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{ssge}}}); err != nil {
		log.Fatal(err)
	}
	a.poll() // the send completed: the peer acknowledged it
	wc := b.poll()
	fmt.Printf("receive %d: %q\n", wc.ID, b.buf[:wc.ByteLen])
}

// TestExamples runs this package's examples on the guest's devices and
// checks what they print (they have no Output comment: see rxetest.Example).
func TestExamples(t *testing.T) {
	rxetest.RunExamples(t, []rxetest.ExampleCase{
		{Name: "ExampleQP_Connect", F: ExampleQP_Connect, Want: "receive 7: \"hello over RC\""},
	})
}
