package main

import (
	"flag"
	"fmt"
	"io"
	"math/rand/v2"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/wr"
)

// srqMaxQP is srq_pingpong.c's MAX_QP: the exchange always carries this
// many addresses each way, the ones past -q all zero.
const srqMaxQP = 256

type srqOptions struct {
	ppCommon
	numQP int
}

const srqUsage = `Usage:
  goverbs srq-pingpong [options]          start a server and wait for connection
  goverbs srq-pingpong [options] <host>   connect to server at <host>

Options (those of ibv_srq_pingpong, wire compatible with it):
  -p, --port=<port>      listen on/connect to port <port> (default 18515)
  -d, --ib-dev=<dev>     use IB device <dev> (default first device found)
  -i, --ib-port=<port>   use port <port> of IB device (default 1)
  -s, --size=<size>      size of message to exchange (default 4096)
  -m, --mtu=<size>       path MTU (default 1024, at most the port's active MTU)
  -q, --num-qp=<num>     number of QPs to use (default 16, at most 256);
                         both sides must give the same number
  -r, --rx-depth=<dep>   number of receives to post at a time, in the one
                         shared receive queue (default 500, at least -q)
  -n, --iters=<iters>    number of exchanges, in total over all QPs (default 1000)
  -l, --sl=<sl>          service level value
  -e, --events           sleep on CQ events (default poll)
  -g, --gid-idx=<gid index> local port gid index (default: none on InfiniBand;
                         on RoCE the port's RoCE v2 IPv4-mapped GID)
`

func srqFlags(stderr io.Writer) (*flag.FlagSet, *srqOptions) {
	o := &srqOptions{}
	fs := flag.NewFlagSet("goverbs srq-pingpong", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.flags(ppFlags{fs}, 4096, true)
	ppFlags{fs}.intVar(&o.numQP, "q", "num-qp", 16, "number of QPs to use")
	fs.Usage = func() { fmt.Fprint(stderr, srqUsage) }
	return fs, o
}

func (o *srqOptions) validate() error {
	if err := o.ppCommon.validate(); err != nil {
		return err
	}
	switch {
	case o.numQP < 1 || o.numQP > srqMaxQP:
		return usageError("-q %d: number of QPs must be 1..%d", o.numQP, srqMaxQP)
	case o.numQP > o.rxDepth:
		return usageError("-r %d: rx_depth %d is too small for %d QPs -- must have at least one receive per QP", o.rxDepth, o.rxDepth, o.numQP)
	}
	return nil
}

// srqPingpong is one side of srq_pingpong.c: -q RC QPs that all receive
// from one SRQ into one buffer and share one CQ.
type srqPingpong struct {
	ppBase
	o      *srqOptions
	srq    *qp.SRQ
	qps    []*qp.QP
	index  map[uint32]int // QPN -> index in qps
	mtu    uverbs.MTU
	sendWR [][]qp.SendWR // one single-WR batch per QP
	recvWR []qp.RecvWR
	wc     []cq.WC
	pend   []int
	routs  int
}

func runSRQPingpong(args []string, stdout, stderr io.Writer) error {
	defer oneP()()
	fs, o := srqFlags(stderr)
	if err := parseChecked(o, fs, args); err != nil {
		return err
	}
	pp := &srqPingpong{o: o}
	defer pp.close()
	if err := pp.init(stderr); err != nil {
		return err
	}
	var err error
	my := make([]dest, srqMaxQP) // past -q: zero, as srq_pingpong sends them
	for i, q := range pp.qps {
		if my[i], err = pp.dev.localDest(o.ibPort, q.QPN(), rand.Uint32()&0xffffff); err != nil {
			return err
		}
		printDest(stdout, "local address: ", ",", my[i])
	}
	x := exchange{server: o.server, port: o.port}
	rem, err := x.run(my, func(rem []dest) error { return pp.connect(my, rem) })
	if err != nil {
		return err
	}
	for i := range pp.qps {
		printDest(stdout, "remote address:", ",", rem[i])
	}
	if o.server != "" {
		if err := pp.connect(my, rem); err != nil {
			return err
		}
	}
	for i, q := range pp.qps {
		if pp.pend[i], err = firstSend(q, pp.sendWR[i], o.server != ""); err != nil {
			return err
		}
	}
	return o.timeLoopSummary(stdout, stderr, "srq-pingpong", pp.poller, pp.loop)
}

// init is srq_pingpong's pp_init_ctx and first receives.
func (pp *srqPingpong) init(stderr io.Writer) error {
	o := pp.o
	var err error
	// srq_pingpong zeroes its buffer.
	if pp.mtu, err = pp.openRC("srq-pingpong", &o.ppCommon, o.rxDepth+o.numQP, true, 0, stderr); err != nil {
		return err
	}
	if pp.srq, err = qp.CreateSRQ(pp.pd, qp.SRQConfig{MaxWR: uint32(o.rxDepth), MaxSGE: 1}); err != nil {
		return fmt.Errorf("couldn't create SRQ: %v", err)
	}
	sge, err := pp.mr.SGE(0, o.size)
	if err != nil {
		return err
	}
	sges := []qp.SGE{sge}
	flags := qp.Signaled
	pp.index = make(map[uint32]int, o.numQP)
	for i := 0; i < o.numQP; i++ {
		q, err := qp.Create(pp.pd, qp.Config{Type: qp.RC, SendCQ: pp.cq, RecvCQ: pp.cq, SRQ: pp.srq, MaxSendWR: 1, MaxSendSGE: 1})
		if err != nil {
			return fmt.Errorf("couldn't create QP[%d]: %v", i, err)
		}
		// As in C, one QP's inline capacity decides for all.
		flags |= sendFlags(q, o.size)
		pp.qps = append(pp.qps, q)
		pp.index[q.QPN()] = i
	}
	for i, q := range pp.qps {
		if err := q.Init(uint8(o.ibPort), 0); err != nil {
			return fmt.Errorf("failed to modify QP[%d] to INIT: %v", i, err)
		}
	}
	pp.sendWR = make([][]qp.SendWR, o.numQP)
	for i := range pp.sendWR {
		pp.sendWR[i] = []qp.SendWR{{ID: pingpongSendWRID, Opcode: qp.OpSend, Flags: flags, SGEs: sges}}
	}
	pp.wc = make([]cq.WC, o.numQP+o.rxDepth) // srq_pingpong polls num_qp + rx_depth at a time
	pp.pend = make([]int, o.numQP)
	if pp.recvWR, err = firstRecvs(pp.srq, sges, o.rxDepth); err != nil {
		return err
	}
	pp.routs = o.rxDepth
	return nil
}

// connect is srq_pingpong's pp_connect_ctx: QP i to the peer's address i.
// srq_pingpong takes the GID (and whether there is one) of the peer's
// first address for every QP; goverbs uses each address's own GID, which
// is the same when the peer is one port.
func (pp *srqPingpong) connect(my, rem []dest) error {
	o := pp.o
	for i, q := range pp.qps {
		if rem[i].QPN == 0 {
			return fmt.Errorf("the peer sent no QP for address %d: it has fewer QPs than -q %d (both sides need the same -q)", i, o.numQP)
		}
		if err := rcConnect(q, o.ibPort, o.sl, pp.dev.sgid, pp.mtu, my[i].PSN, rem[i]); err != nil {
			return fmt.Errorf("QP[%d]: %v", i, err)
		}
	}
	if n := len(pp.qps); n < len(rem) && rem[n].QPN != 0 {
		return fmt.Errorf("the peer sent more QPs than -q %d (both sides need the same -q)", o.numQP)
	}
	return nil
}

// loop is srq_pingpong's main loop; it allocates nothing. -n counts
// exchanges over all QPs together, as in C.
func (pp *srqPingpong) loop() error {
	iters, numQP := pp.o.iters, len(pp.qps)
	rcnt, scnt := 0, 0
	for rcnt < iters || scnt < iters {
		n, err := pp.poller.poll(pp.wc)
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			w := &pp.wc[i]
			if w.Status != wr.WCSuccess {
				return fmt.Errorf("failed status %v (%d) for wr_id %d", w.Status, uint32(w.Status), w.ID)
			}
			qi, ok := pp.index[w.QPNum]
			if !ok {
				return fmt.Errorf("couldn't find QPN %06x", w.QPNum)
			}
			switch w.ID {
			case pingpongSendWRID:
				scnt++
			case pingpongRecvWRID:
				pp.routs--
				if pp.routs <= numQP {
					k := pp.o.rxDepth - pp.routs
					if err := pp.srq.PostRecv(pp.recvWR[:k]); err != nil {
						return fmt.Errorf("couldn't post receive (%d): %v", pp.routs, err)
					}
					pp.routs += k
				}
				rcnt++
			default:
				return fmt.Errorf("completion for unknown wr_id %d", w.ID)
			}
			pp.pend[qi] &^= int(w.ID)
			if scnt < iters && pp.pend[qi] == 0 {
				if err := pp.qps[qi].PostSend(pp.sendWR[qi]); err != nil {
					return fmt.Errorf("couldn't post send: %v", err)
				}
				pp.pend[qi] = pingpongRecvWRID | pingpongSendWRID
			}
		}
	}
	return nil
}
