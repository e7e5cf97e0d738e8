package qp_test

import (
	"testing"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	wcs "github.com/goverbs/goverbs/wr" // (wr is a local name in this package's tests)
)

// pollN polls c until n completions arrived, failing on an error status.
// It allocates nothing.
func pollN(b *testing.B, c *cq.CQ, wc []cq.WC, n int) {
	for n > 0 {
		k, err := c.Poll(wc[:min(n, len(wc))])
		if err != nil {
			b.Fatal(err)
		}
		for i := range k {
			if wc[i].Status != wcs.WCSuccess {
				b.Fatal(wc[i].Err())
			}
		}
		n -= k
	}
}

// BenchmarkMWBindInvalidate is the cost of one window's life on rxe: Bind
// (describe), post BIND_MW and poll its completion, post LOCAL_INV and poll
// its completion (two doorbells, as a target that binds per request and
// invalidates when the transfer is done would do).
func BenchmarkMWBindInvalidate(b *testing.B) {
	_, t := mwPair(b)
	w := allocMW(b, t, mr.MWType2)
	wc := make([]cq.WC, 4)
	wrs := make([]qp.SendWR, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		req, err := w.Bind(t.mr, mwOff, mwLen, mr.RemoteWrite, uint8(w.RKey())+1)
		if err != nil {
			b.Fatal(err)
		}
		wrs[0] = qp.SendWR{ID: 1, Opcode: qp.OpBindMW, Flags: qp.Signaled, Bind: req}
		if err := t.qp.PostSend(wrs); err != nil {
			b.Fatal(err)
		}
		pollN(b, t.cq, wc, 1)
		wrs[0] = qp.SendWR{ID: 2, Opcode: qp.OpLocalInv, Flags: qp.Signaled, InvRKey: req.RKey}
		if err := t.qp.PostSend(wrs); err != nil {
			b.Fatal(err)
		}
		pollN(b, t.cq, wc, 1)
	}
}

// BenchmarkRendezvous is one rendezvous transfer of 4 KiB as bx runs it:
// the target sends a clear-to-send (CTS) naming an rkey, the writer
// RDMA-WRITEs the payload and sends a "done" message behind it in one
// doorbell, the target receives it. Variants:
//
//	mr:          the CTS names the target MR's own rkey (what bx does today)
//	mw-localinv: the target binds a type 2 window per transfer (the bind
//	             rides in the CTS doorbell) and invalidates it with LOCAL_INV
//	             after "done"
//	mw-sendinv:  the same, but "done" is a SEND_WITH_INV that invalidates the
//	             window at the target; no LOCAL_INV
func BenchmarkRendezvous(b *testing.B) {
	const n = 4096
	for _, mode := range []string{"mr", "mw-localinv", "mw-sendinv"} {
		b.Run(mode, func(b *testing.B) {
			wr, tg := mwPair(b)
			w := allocMW(b, tg, mr.MWType2)
			wc := make([]cq.WC, 8)
			ctsRecv := []qp.RecvWR{{ID: 10, SGEs: []qp.SGE{wr.sge(b, 1<<20, 64)}}}
			doneRecv := []qp.RecvWR{{ID: 20, SGEs: []qp.SGE{tg.sge(b, 1<<20, 64)}}}
			cts := make([]qp.SendWR, 0, 2)
			ctsSGE := []qp.SGE{tg.sge(b, 1<<20+64, 16)}
			data := []qp.SGE{wr.sge(b, 0, n)}
			doneSGE := []qp.SGE{wr.sge(b, 1<<20+64, 8)}
			xfer := make([]qp.SendWR, 2)
			inv := make([]qp.SendWR, 1)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := wr.qp.PostRecv(ctsRecv); err != nil {
					b.Fatal(err)
				}
				if err := tg.qp.PostRecv(doneRecv); err != nil {
					b.Fatal(err)
				}
				rkey := tg.mr.RKey()
				cts = cts[:0]
				if mode != "mr" {
					req, err := w.Bind(tg.mr, mwOff, n, mr.RemoteWrite, uint8(w.RKey())+1)
					if err != nil {
						b.Fatal(err)
					}
					rkey = req.RKey
					cts = append(cts, qp.SendWR{ID: 1, Opcode: qp.OpBindMW, Bind: req})
				}
				// The CTS payload would carry rkey; its bytes do not matter here.
				cts = append(cts, qp.SendWR{ID: 2, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: ctsSGE})
				if err := tg.qp.PostSend(cts); err != nil {
					b.Fatal(err)
				}
				pollN(b, wr.cq, wc, 1) // the writer receives the CTS
				xfer[0] = qp.SendWR{ID: 3, Opcode: qp.OpRDMAWrite, SGEs: data, RemoteAddr: tg.addr(mwOff), RKey: rkey}
				xfer[1] = qp.SendWR{ID: 4, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: doneSGE}
				if mode == "mw-sendinv" {
					xfer[1].Opcode, xfer[1].InvRKey = qp.OpSendWithInv, rkey
				}
				if err := wr.qp.PostSend(xfer); err != nil {
					b.Fatal(err)
				}
				pollN(b, wr.cq, wc, 1) // the writer's "done" completes
				pollN(b, tg.cq, wc, 2) // the target: CTS sent, "done" received
				if mode == "mw-localinv" {
					inv[0] = qp.SendWR{ID: 5, Opcode: qp.OpLocalInv, Flags: qp.Signaled, InvRKey: rkey}
					if err := tg.qp.PostSend(inv); err != nil {
						b.Fatal(err)
					}
					pollN(b, tg.cq, wc, 1)
				}
			}
		})
	}
}
