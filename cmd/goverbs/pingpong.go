package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/wr"
)

// Work request IDs, as in rc_pingpong.c; pending is a bit set of them.
const (
	pingpongRecvWRID = 1
	pingpongSendWRID = 2
)

type ppOptions struct {
	ppCommon
	chk      bool
	json     bool
	cpuprof  string
	linger   time.Duration
	unsuppor map[string]*bool
}

func pingpongFlags(stderr io.Writer) (*flag.FlagSet, *ppOptions) {
	o := &ppOptions{unsuppor: map[string]*bool{}}
	fs := flag.NewFlagSet("goverbs rc-pingpong", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := ppFlags{fs}
	o.flags(f, 4096, true)
	f.boolVar(&o.chk, "c", "chk", "validate received buffer")
	fs.BoolVar(&o.json, "json", false, "print one JSON object {bytes, seconds, mbit_per_s, iters, usec_per_iter} instead of the summary lines (addresses go to stderr)")
	fs.StringVar(&o.cpuprof, "cpuprofile", "", "write a CPU profile of the ping-pong loop to `file` (debugging)")
	fs.DurationVar(&o.linger, "linger", 0, "keep the QP up for `duration` after the last exchange, so the peer's retransmission of a send whose ACK was lost is still answered (lossy links; rdma-core has no such option)")
	for _, u := range []struct{ short, long, what string }{
		{"o", "odp", "on-demand paging"},
		{"O", "iodp", "implicit on-demand paging"},
		{"P", "prefetch", "ODP prefetch"},
		{"t", "ts", "completion timestamps"},
		{"j", "dm", "device memory"},
		{"N", "new_send", "the new post send API"},
	} {
		p := new(bool)
		f.boolVar(p, u.short, u.long, "ibv_rc_pingpong's "+u.what+": not supported")
		o.unsuppor["-"+u.short+" ("+u.what+")"] = p
	}
	fs.Usage = func() { fmt.Fprint(stderr, pingpongUsage) }
	return fs, o
}

const pingpongUsage = `Usage:
  goverbs rc-pingpong [options]          start a server and wait for connection
  goverbs rc-pingpong [options] <host>   connect to server at <host>

Options (those of ibv_rc_pingpong, wire compatible with it):
  -p, --port=<port>      listen on/connect to port <port> (default 18515)
  -d, --ib-dev=<dev>     use IB device <dev> (default first device found)
  -i, --ib-port=<port>   use port <port> of IB device (default 1)
  -s, --size=<size>      size of message to exchange (default 4096)
  -m, --mtu=<size>       path MTU (default 1024, at most the port's active MTU)
  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)
  -n, --iters=<iters>    number of exchanges (default 1000)
  -l, --sl=<sl>          service level value
  -e, --events           sleep on CQ events (default poll)
  -g, --gid-idx=<gid index> local port gid index (default: none on InfiniBand;
                         on RoCE the port's RoCE v2 IPv4-mapped GID)
  -c, --chk              validate received buffer
      --cpuprofile=<file> write a CPU profile of the ping-pong loop (debugging)
      --json             print {"bytes","seconds","mbit_per_s","iters",
                         "usec_per_iter"} as JSON instead of the summary
  -o, -O, -P, -t, -j, -N ibv_rc_pingpong's ODP, timestamp, device memory and
                         new send API options: rejected, not supported
`

func (o *ppOptions) validate() error {
	for name, set := range o.unsuppor {
		if *set {
			return usageError("option %s of ibv_rc_pingpong is not supported by goverbs", name)
		}
	}
	if o.linger < 0 {
		return usageError("--linger %v: must not be negative", o.linger)
	}
	return o.ppCommon.validate()
}

// pingpong is one side's verbs resources.
type pingpong struct {
	ppOneQP
	o   *ppOptions
	mtu uverbs.MTU
}

func runPingpong(args []string, stdout, stderr io.Writer) error {
	defer oneP()()
	fs, o := pingpongFlags(stderr)
	if err := parseChecked(o, fs, args); err != nil {
		return err
	}
	var err error
	info := stdout
	if o.json {
		info = stderr
	}

	pp := &pingpong{o: o}
	defer pp.close()
	if err := pp.init(stderr); err != nil {
		return err
	}

	if err := pp.exchange(&o.ppCommon, info, ",", pp.connect); err != nil {
		return err
	}

	if o.server != "" && o.chk {
		pp.fillCheck()
	}
	if pp.pend, err = firstSend(pp.qp, pp.sendWR, o.server != ""); err != nil {
		return err
	}
	stopProf, err := startCPUProfile(o.cpuprof)
	if err != nil {
		return err
	}
	elapsed, err := timeLoop(stderr, "rc-pingpong", pp.poller, pp.loop)
	stopProf()
	if err != nil {
		return err
	}

	if o.json {
		usec := float64(elapsed.Nanoseconds()) / 1e3
		bytes := int64(o.size) * int64(o.iters) * 2
		out, _ := json.Marshal(struct {
			Bytes       int64   `json:"bytes"`
			Seconds     float64 `json:"seconds"`
			MbitPerS    float64 `json:"mbit_per_s"`
			Iters       int     `json:"iters"`
			USecPerIter float64 `json:"usec_per_iter"`
		}{bytes, usec / 1e6, float64(bytes) * 8 / usec, o.iters, usec / float64(o.iters)})
		fmt.Fprintf(stdout, "%s\n", out)
	} else {
		printSummary(stdout, o.size, o.iters, elapsed)
	}
	if o.linger > 0 {
		// RC retries of the peer's last send reach a live QP, whose
		// responder acknowledges the duplicate; with the QP destroyed
		// they would go unanswered and, at retry count 7 (infinite on
		// rxe), the peer would wait forever.
		time.Sleep(o.linger)
	}
	if o.server == "" && o.chk {
		if bad := pp.check(); bad > 0 {
			for _, p := range pp.badPages() {
				fmt.Fprintf(stdout, "invalid data in page %d\n", p)
			}
			return &exitError{code: 1, msg: fmt.Sprintf("-c: invalid data in %d page(s)", bad)}
		}
	}
	return nil
}

// init is pp_init_ctx plus the first receives: device, PD, buffer, MR, CQ,
// QP in INIT, rx_depth receives posted.
func (pp *pingpong) init(stderr io.Writer) error {
	o := pp.o
	var err error
	// The buffer is 0x7b, as rc_pingpong does.
	if pp.mtu, err = pp.openRC("rc-pingpong", &o.ppCommon, o.rxDepth+1, false, 0x7b, stderr); err != nil {
		return err
	}
	if err := pp.createQP(qp.RC, o.rxDepth); err != nil {
		return err
	}
	if err := pp.qp.Init(uint8(o.ibPort), 0); err != nil {
		return fmt.Errorf("failed to modify QP to INIT: %v", err)
	}

	// Everything the hot loop touches is built here, once.
	sge, err := pp.mr.SGE(0, o.size)
	if err != nil {
		return err
	}
	sges := []qp.SGE{sge}
	send := []qp.SendWR{{ID: pingpongSendWRID, Opcode: qp.OpSend, Flags: sendFlags(pp.qp, o.size), SGEs: sges}}
	return pp.prepare(send, sges, o.rxDepth)
}

// connect is pp_connect_ctx: INIT -> RTR -> RTS with rc_pingpong's values.
func (pp *pingpong) connect(myPSN uint32, rem dest) error {
	return rcConnect(pp.qp, pp.o.ibPort, pp.o.sl, pp.dev.sgid, pp.mtu, myPSN, rem)
}

// loop is rc_pingpong's main loop: poll the CQ two completions at a time,
// busy-polling, or with -e sleeping on CQ events when it is empty. It
// allocates nothing.
func (pp *pingpong) loop() error {
	return pp.runLoop(&pp.o.ppCommon, nil)
}

// pingLoop is the main loop of rc_pingpong and ud_pingpong: poll the CQ,
// post receives again when at most one is left (routs: receives posted),
// and send the next message once the last send and receive both completed
// (pend: the work request IDs still outstanding). routs and pend are
// their values when the loop starts; run keeps them in locals. It
// allocates nothing.
type pingLoop struct {
	iters, rxDepth int
	poller         *cqPoller
	wc             []cq.WC
	qp             *qp.QP
	sendWR         []qp.SendWR
	recvWR         []qp.RecvWR
	routs, pend    int
	check          func(w *cq.WC) error // vets each receive; nil: none
}

func (l *pingLoop) run() error {
	// The loop's state in locals and the busy poll written out (poll's
	// fast path, which the compiler does not inline with the CQ's Poll
	// in it): each empty poll and each completion cost fewer
	// instructions (scripts/bench-instr's rp variant against ibv).
	rcnt, scnt, iters := 0, 0, l.iters
	routs, pend := l.routs, l.pend
	c, busy, wc := l.poller.cq, !l.poller.events, l.wc
	for rcnt < iters || scnt < iters {
		n, err := c.Poll(wc)
		if err != nil || n == 0 && !busy {
			if n, err = l.poller.pollWait(wc, err); err != nil {
				return err
			}
		}
		for i := range wc[:n] {
			w := &wc[i]
			if w.Status != wr.WCSuccess {
				return fmt.Errorf("failed status %v (%d) for wr_id %d", w.Status, uint32(w.Status), w.ID)
			}
			switch w.ID {
			case pingpongSendWRID:
				scnt++
			case pingpongRecvWRID:
				if l.check != nil {
					if err := l.check(w); err != nil {
						return fmt.Errorf("receive %d: %v", rcnt, err)
					}
				}
				routs--
				if routs <= 1 {
					k := l.rxDepth - routs
					if err := l.qp.PostRecv(l.recvWR[:k]); err != nil {
						return fmt.Errorf("couldn't post receive (%d): %v", routs, err)
					}
					routs += k
				}
				rcnt++
			default:
				return fmt.Errorf("completion for unknown wr_id %d", w.ID)
			}
			pend &^= int(w.ID)
			if scnt < iters && pend == 0 {
				if err := l.qp.PostSend(l.sendWR); err != nil {
					return fmt.Errorf("couldn't post send: %v", err)
				}
				pend = pingpongRecvWRID | pingpongSendWRID
			}
		}
	}
	return nil
}

// fillCheck and check are rc_pingpong's -c: the client writes
// i/page_size % sizeof(char) at the start of each page before its first
// send and the server checks those bytes after the last receive. That
// expression is 0 in C (x % 1), so we write and expect 0 too: anything
// else would break interoperation with ibv_rc_pingpong -c. The buffer
// starts out as 0x7b, so a page that never received data is caught.
func (pp *pingpong) fillCheck() {
	ps := os.Getpagesize()
	for i := 0; i < len(pp.buf); i += ps {
		pp.buf[i] = 0
	}
}

func (pp *pingpong) badPages() []int {
	ps := os.Getpagesize()
	var bad []int
	for i := 0; i < len(pp.buf); i += ps {
		if pp.buf[i] != 0 {
			bad = append(bad, i/ps)
		}
	}
	return bad
}

func (pp *pingpong) check() int { return len(pp.badPages()) }
