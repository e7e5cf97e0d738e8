package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"time"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

// What the three ping-pongs (rc-pingpong, ud-pingpong, srq-pingpong)
// share: options, device and resource setup, the TCP exchange, the first
// receives and sends, and the summary.

// ppDevice is an opened device port and the GID a ping-pong uses.
type ppDevice struct {
	ctx  *uverbs.Context
	name string
	port uverbs.PortAttr
	sgid int // -1: no GID (InfiniBand without -g)
}

// pickDevice is the device the rdma-core tools use: dev, which must
// exist, or else the first one listed.
func pickDevice(dev string) (string, error) {
	if dev != "" {
		if _, err := uverbs.LookupWithoutGIDs(dev); err != nil {
			return "", &exitError{code: 1, msg: fmt.Sprintf("IB device %s not found (%v)", dev, err)}
		}
		return dev, nil
	}
	devs, err := uverbs.ListWithoutGIDs()
	if err != nil {
		return "", err
	}
	if len(devs) == 0 {
		return "", errors.New("no IB devices found")
	}
	return devs[0].Name, nil
}

// openPPDevice is the device part of pp_init_ctx: the named device (or the
// first one), its port, and the GID index: -g, or on RoCE without -g the
// port's default GID (the rdma-core tools send a zero GID then, which
// cannot work on RoCE).
func openPPDevice(cmd, dev string, ibPort, gidx int, stderr io.Writer) (*ppDevice, error) {
	name, err := pickDevice(dev)
	if err != nil {
		return nil, err
	}
	d := &ppDevice{name: name, sgid: gidx}
	if d.ctx, err = uverbs.Open(name); err != nil {
		return nil, fmt.Errorf("couldn't get context for %s: %v", name, err)
	}
	if ibPort > int(d.ctx.Attr().PhysPortCnt) {
		d.ctx.Close()
		return nil, fmt.Errorf("-i %d: %s has ports 1..%d", ibPort, name, d.ctx.Attr().PhysPortCnt)
	}
	if d.port, err = d.ctx.QueryPort(ibPort); err != nil {
		d.ctx.Close()
		return nil, fmt.Errorf("unable to query port info for port %d: %v", ibPort, err)
	}
	if d.sgid < 0 && d.port.LinkLayer == 2 {
		g, err := d.ctx.DefaultGID(ibPort)
		if err != nil {
			d.ctx.Close()
			return nil, fmt.Errorf("no -g given and no usable GID on %s port %d: %v", name, ibPort, err)
		}
		d.sgid = g.Index
		fmt.Fprintf(stderr, "goverbs %s: RoCE port and no -g: using GID index %d (%s, %s)\n", cmd, g.Index, g.GID, g.Type)
	}
	return d, nil
}

// checkMsgSize checks -s against the port's max message size (rc and srq;
// a UD message is checked against the active MTU instead).
func (d *ppDevice) checkMsgSize(size int) error {
	if m := d.port.MaxMsgSize; m != 0 && uint64(size) > uint64(m) {
		return usageError("-s %d: larger than the port's max message size %d", size, m)
	}
	return nil
}

// pathMTU is -m (mtu bytes, validated) capped at the port's active MTU,
// which cmd says on stderr when it caps.
func (d *ppDevice) pathMTU(cmd string, mtu, ibPort int, stderr io.Writer) uverbs.MTU {
	m, _ := uverbs.MTUFromBytes(mtu)
	if a := d.port.ActiveMTU; a >= uverbs.MTU256 && m > a {
		fmt.Fprintf(stderr, "goverbs %s: -m %d is above %s port %d's active MTU %d; using %d\n", cmd, mtu, d.name, ibPort, a.Bytes(), a.Bytes())
		m = a
	}
	return m
}

// checkRxDepth checks -r against the device: rxDepth receive WRs in one
// queue (the QP's, or the SRQ's with srq) and cqe CQ entries, which the
// device would refuse with a message that does not name -r.
func (d *ppDevice) checkRxDepth(rxDepth, cqe int, srq bool) error {
	a := d.ctx.Attr()
	maxWR, what := int(a.MaxQPWR), "max_qp_wr"
	if srq {
		maxWR, what = int(a.MaxSRQWR), "max_srq_wr"
	}
	if maxWR > 0 && rxDepth > maxWR {
		return usageError("-r %d: larger than %s's %s %d", rxDepth, d.name, what, maxWR)
	}
	if m := int(a.MaxCQE); m > 0 && cqe > m {
		return usageError("-r %d: needs %d CQ entries, %s has max_cqe %d", rxDepth, cqe, d.name, m)
	}
	return nil
}

// localDest is our address as the exchange carries it: the port's LID,
// qpn, psn and the GID at d.sgid (zero without one).
func (d *ppDevice) localDest(ibPort int, qpn, psn uint32) (dest, error) {
	if d.port.LinkLayer != 2 && d.port.LID == 0 {
		return dest{}, errors.New("couldn't get local LID (InfiniBand port without a LID: is a subnet manager running?)")
	}
	my := dest{LID: d.port.LID, QPN: qpn, PSN: psn}
	if d.sgid >= 0 {
		g, err := d.ctx.GID(ibPort, d.sgid)
		if err != nil {
			return dest{}, fmt.Errorf("could not get local gid for gid index %d: %v", d.sgid, err)
		}
		copy(my.GID[:], g.GID.To16())
	}
	return my, nil
}

// ppBase is what every ping-pong sets up alike after its checks: the
// opened device, a PD, the message buffer and its MR, and the CQ with its
// poller.
type ppBase struct {
	dev    *ppDevice
	pd     *uverbs.PD
	mem    *mr.Memory
	buf    []byte
	mr     *mr.MR
	cq     *cq.CQ
	poller *cqPoller
}

// open opens the device of the options c (openPPDevice).
func (b *ppBase) open(cmd string, c *ppCommon, stderr io.Writer) error {
	var err error
	b.dev, err = openPPDevice(cmd, c.dev, c.ibPort, c.gidx, stderr)
	return err
}

// openRC is the set-up of rc-pingpong and srq-pingpong (RC QPs, -m): the
// device opened, -s checked against the port's max message size, -r
// against the device (cqe CQ entries, the receive WRs in the QP's queue or
// with srq the SRQ's), and alloc's resources, the buffer filled with fill.
// It returns the path MTU.
func (b *ppBase) openRC(cmd string, c *ppCommon, cqe int, srq bool, fill byte, stderr io.Writer) (uverbs.MTU, error) {
	if err := b.open(cmd, c, stderr); err != nil {
		return 0, err
	}
	if err := b.dev.checkMsgSize(c.size); err != nil {
		return 0, err
	}
	if err := b.dev.checkRxDepth(c.rxDepth, cqe, srq); err != nil {
		return 0, err
	}
	mtu := b.dev.pathMTU(cmd, c.mtu, c.ibPort, stderr)
	return mtu, b.alloc(c.size, fill, cqe, c.events)
}

// alloc is that part of pp_init_ctx: the PD, an n-byte buffer with every
// byte fill (0x7b in rc_pingpong and ud_pingpong, 0 in srq_pingpong)
// registered for local write, and a CQ of cqe entries, on a completion
// channel with events (-e).
func (b *ppBase) alloc(n int, fill byte, cqe int, events bool) error {
	var err error
	if b.pd, err = b.dev.ctx.AllocPD(); err != nil {
		return fmt.Errorf("couldn't allocate PD: %v", err)
	}
	if b.mem, err = mr.Alloc(n); err != nil {
		return fmt.Errorf("couldn't allocate work buf: %v", err)
	}
	b.buf = b.mem.Bytes()[:n]
	for i := range b.buf {
		b.buf[i] = fill
	}
	if b.mr, err = mr.Register(b.pd, b.buf, mr.LocalWrite); err != nil {
		return fmt.Errorf("couldn't register MR: %v", err)
	}
	if b.cq, err = newPingpongCQ(b.dev.ctx, cqe, events); err != nil {
		return fmt.Errorf("couldn't create CQ: %v", err)
	}
	b.poller = newCQPoller(b.cq, events)
	return nil
}

// close closes the device, which destroys what was made on it (AH, QPs,
// SRQ, CQ, MR and PD, newest first), and frees the buffer.
func (b *ppBase) close() {
	if b.dev != nil {
		b.dev.ctx.Close()
	}
	if b.mem != nil {
		b.mem.Close()
	}
}

// sendFlags is the ping-pongs' send flags: signaled, and inline when q
// can inline size bytes.
func sendFlags(q *qp.QP, size int) qp.SendFlags {
	if int64(q.Caps().MaxInline) >= int64(size) {
		return qp.Signaled | qp.Inline
	}
	return qp.Signaled
}

// firstSend is the client's first send (client: a HOST was given) and
// the work request IDs outstanding then: the receive, and the send if
// posted.
func firstSend(q *qp.QP, wrs []qp.SendWR, client bool) (pend int, err error) {
	if !client {
		return pingpongRecvWRID, nil
	}
	if err := q.PostSend(wrs); err != nil {
		return 0, fmt.Errorf("couldn't post send: %v", err)
	}
	return pingpongRecvWRID | pingpongSendWRID, nil
}

// ppOneQP is what rc-pingpong and ud-pingpong have on top of ppBase: the
// one QP, its work requests, built once, and the state its loop starts
// from.
type ppOneQP struct {
	ppBase
	qp     *qp.QP
	sendWR []qp.SendWR
	recvWR []qp.RecvWR
	wc     []cq.WC
	routs  int
	pend   int
}

// createQP creates the QP, of type t, on the CQ: one send WR, rxDepth
// receive WRs, one SGE each.
func (p *ppOneQP) createQP(t qp.Type, rxDepth int) error {
	var err error
	if p.qp, err = qp.Create(p.pd, qp.Config{Type: t, SendCQ: p.cq, RecvCQ: p.cq,
		MaxSendWR: 1, MaxRecvWR: uint32(rxDepth), MaxSendSGE: 1, MaxRecvSGE: 1}); err != nil {
		return fmt.Errorf("couldn't create QP: %v", err)
	}
	return nil
}

// prepare keeps send, the loop's send batch, and posts the first rxDepth
// receives on recvSGEs.
func (p *ppOneQP) prepare(send []qp.SendWR, recvSGEs []qp.SGE, rxDepth int) error {
	p.sendWR = send
	p.wc = make([]cq.WC, 2) // rc_pingpong and ud_pingpong poll 2 at a time
	var err error
	if p.recvWR, err = firstRecvs(p.qp, recvSGEs, rxDepth); err != nil {
		return err
	}
	p.routs = rxDepth
	return nil
}

// exchange is the exchange of one address each way: ours (the QP's QPN, a
// random PSN) printed to w first (gidSep as printDest's), then the peer's,
// and connect called with our PSN and the peer's address, the server's
// within the exchange, the client's after printing (as in C).
func (p *ppOneQP) exchange(c *ppCommon, w io.Writer, gidSep string, connect func(myPSN uint32, rem dest) error) error {
	my, err := p.dev.localDest(c.ibPort, p.qp.QPN(), rand.Uint32()&0xffffff)
	if err != nil {
		return err
	}
	printDest(w, "local address: ", gidSep, my)
	x := exchange{server: c.server, port: c.port}
	rems, err := x.run([]dest{my}, func(rem []dest) error { return connect(my.PSN, rem[0]) })
	if err != nil {
		return err
	}
	rem := rems[0]
	printDest(w, "remote address:", ",", rem)
	if x.server != "" {
		return connect(my.PSN, rem)
	}
	return nil
}

// runLoop runs pingLoop from the state prepare and the first send left,
// with check (nil: none) vetting each receive.
func (p *ppOneQP) runLoop(c *ppCommon, check func(w *cq.WC) error) error {
	l := pingLoop{iters: c.iters, rxDepth: c.rxDepth, poller: p.poller, wc: p.wc, qp: p.qp,
		sendWR: p.sendWR, recvWR: p.recvWR, routs: p.routs, pend: p.pend, check: check}
	return l.run()
}

// printDest prints an address line of the rdma-core ping-pongs: what is
// "local address: " or "remote address:", gidSep the "," before GID (":"
// in ud_pingpong's local line).
func printDest(w io.Writer, what, gidSep string, d dest) {
	fmt.Fprintf(w, "  %s LID 0x%04x, QPN 0x%06x, PSN 0x%06x%s GID %s\n", what, d.LID, d.QPN, d.PSN, gidSep, ntop(d.GID))
}

// rcConnect is the RTR and RTS part of pp_connect_ctx of rc_pingpong and
// srq_pingpong, with their values.
func rcConnect(q *qp.QP, ibPort, sl, sgid int, mtu uverbs.MTU, myPSN uint32, rem dest) error {
	av := qp.AV{DLID: rem.LID, SL: uint8(sl), Port: uint8(ibPort)}
	if rem.global() {
		if sgid < 0 {
			return errors.New("the peer sent a GID but we have none: give -g")
		}
		av.IsGlobal, av.HopLimit, av.DGID, av.SGIDIndex = true, 1, net.IP(rem.GID[:]), uint8(sgid)
	}
	if err := q.Modify(&qp.Attr{State: qp.RTR, PathMTU: mtu, DestQPN: rem.QPN, RQPSN: rem.PSN,
		MaxDestRdAtomic: 1, MinRNRTimer: 12, AV: av},
		qp.MaskState|qp.MaskAV|qp.MaskPathMTU|qp.MaskDestQPN|qp.MaskRQPSN|qp.MaskMaxDestRdAtomic|qp.MaskMinRNRTimer); err != nil {
		return fmt.Errorf("failed to modify QP to RTR: %v", err)
	}
	if err := q.Modify(&qp.Attr{State: qp.RTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, SQPSN: myPSN, MaxRdAtomic: 1},
		qp.MaskState|qp.MaskTimeout|qp.MaskRetryCnt|qp.MaskRNRRetry|qp.MaskSQPSN|qp.MaskMaxQPRdAtomic); err != nil {
		return fmt.Errorf("failed to modify QP to RTS: %v", err)
	}
	return nil
}

// timeLoopSummary runs loop (timeLoop) and prints the summary of the -s
// and -n of c.
func (c *ppCommon) timeLoopSummary(stdout, stderr io.Writer, cmd string, p *cqPoller, loop func() error) error {
	elapsed, err := timeLoop(stderr, cmd, p, loop)
	if err != nil {
		return err
	}
	printSummary(stdout, c.size, c.iters, elapsed)
	return nil
}

// printSummary prints the two summary lines of every rdma-core ping-pong.
func printSummary(w io.Writer, size, iters int, elapsed time.Duration) {
	usec := float64(elapsed.Nanoseconds()) / 1e3
	bytes := int64(size) * int64(iters) * 2
	fmt.Fprintf(w, "%d bytes in %.2f seconds = %.2f Mbit/sec\n", bytes, usec/1e6, float64(bytes)*8/usec)
	fmt.Fprintf(w, "%d iters in %.2f seconds = %.2f usec/iter\n", iters, usec/1e6, usec/float64(iters))
}

// exchange is the TCP address exchange of the rdma-core ping-pongs for n
// addresses each way (1 for rc and ud, MAX_QP = 256 for srq):
//
//	client -> server  n 52-byte messages
//	server            connects (connect is called with the peer's addresses)
//	server -> client  n 52-byte messages
//	client -> server  "done" and a NUL; then the client connects
//
// The client returns without connecting; it connects after printing the
// remote addresses, as in C.
type exchange struct {
	server string // "" on the server side
	port   int
}

func (x exchange) run(my []dest, connect func(rem []dest) error) ([]dest, error) {
	if x.server != "" {
		return x.client(my)
	}
	return x.serve(my, connect)
}

func encodeDests(ds []dest) []byte {
	out := make([]byte, 0, len(ds)*wireMsgLen)
	for _, d := range ds {
		out = append(out, d.encode()...)
	}
	return out
}

func readDests(c net.Conn, n int) ([]dest, error) {
	rem := make([]dest, n)
	for i := range rem {
		msg, err := readMsg(c, wireMsgLen)
		if err != nil {
			return nil, fmt.Errorf("couldn't read remote address [%d]: %v", i, err)
		}
		if rem[i], err = decodeDest(msg); err != nil {
			return nil, fmt.Errorf("remote address [%d]: %v", i, err)
		}
	}
	return rem, nil
}

func (x exchange) client(my []dest) ([]dest, error) {
	addr := net.JoinHostPort(x.server, strconv.Itoa(x.port))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("couldn't connect to %s: %v", addr, err)
	}
	defer c.Close()
	if err := writeMsg(c, encodeDests(my)); err != nil {
		return nil, fmt.Errorf("couldn't send local address: %v", err)
	}
	rem, err := readDests(c, len(my))
	if err != nil {
		return nil, err
	}
	if err := writeMsg(c, wireDone); err != nil {
		return nil, fmt.Errorf("couldn't write \"done\": %v", err)
	}
	return rem, nil
}

func (x exchange) serve(my []dest, connect func(rem []dest) error) ([]dest, error) {
	l, err := net.Listen("tcp", ":"+strconv.Itoa(x.port))
	if err != nil {
		return nil, fmt.Errorf("couldn't listen to port %d: %v", x.port, err)
	}
	c, err := l.Accept()
	l.Close()
	if err != nil {
		return nil, fmt.Errorf("accept() failed: %v", err)
	}
	defer c.Close()
	rem, err := readDests(c, len(my))
	if err != nil {
		return nil, err
	}
	if err := connect(rem); err != nil {
		return nil, fmt.Errorf("couldn't connect to remote QP: %v", err)
	}
	if err := writeMsg(c, encodeDests(my)); err != nil {
		return nil, fmt.Errorf("couldn't send local address: %v", err)
	}
	done, err := readMsg(c, len(wireDone))
	if err != nil {
		return nil, fmt.Errorf("couldn't recv \"done\": %v", err)
	}
	if string(done) != string(wireDone) {
		return nil, fmt.Errorf("peer sent %q, want \"done\"", done)
	}
	return rem, nil
}

// ppFlags registers the short and long names of the rdma-core ping-pong
// options on fs.
type ppFlags struct{ fs *flag.FlagSet }

func (f ppFlags) intVar(p *int, short, long string, def int, usage string) {
	f.fs.IntVar(p, short, def, usage)
	f.fs.IntVar(p, long, def, usage)
}

func (f ppFlags) boolVar(p *bool, short, long string, usage string) {
	f.fs.BoolVar(p, short, false, usage)
	f.fs.BoolVar(p, long, false, usage)
}

func (f ppFlags) stringVar(p *string, short, long string, usage string) {
	f.fs.StringVar(p, short, "", usage)
	f.fs.StringVar(p, long, "", usage)
}

// ppCommon is what the three ping-pongs (rc, ud, srq: rdma-core's
// ibv_rc_pingpong, ibv_ud_pingpong, ibv_srq_pingpong) share of their
// options, flags and checks; each tool's options embed it.
type ppCommon struct {
	port, ibPort, size, rxDepth, iters, sl, gidx int
	mtu                                          int // -m (rc, srq); 0 without it
	dev, server                                  string
	events                                       bool
	withMTU                                      bool // the tool has -m
	devGiven                                     bool // -d was on the command line
}

// ppMaxInt32 bounds the options rdma-core keeps in a C int: -r and -n
// (a larger -r also wrapped in the uint32 of the QP's receive queue size,
// and -r + 1 CQ entries overflowed at 2^63-1).
const ppMaxInt32 = 1<<31 - 1

// flags registers the shared flags with their rdma-core names; defSize is
// the tool's default -s, withMTU adds -m.
func (c *ppCommon) flags(f ppFlags, defSize int, withMTU bool) {
	f.intVar(&c.port, "p", "port", 18515, "listen on/connect to TCP `port`")
	f.stringVar(&c.dev, "d", "ib-dev", "use IB device `dev` (default first device found)")
	f.intVar(&c.ibPort, "i", "ib-port", 1, "use `port` of IB device")
	f.intVar(&c.size, "s", "size", defSize, "`size` of message to exchange")
	c.withMTU = withMTU
	if withMTU {
		f.intVar(&c.mtu, "m", "mtu", 1024, "path MTU: 256, 512, 1024, 2048 or 4096 (capped at the port's active MTU)")
	}
	f.intVar(&c.rxDepth, "r", "rx-depth", 500, "number of receives to post at a time")
	f.intVar(&c.iters, "n", "iters", 1000, "number of exchanges")
	f.intVar(&c.sl, "l", "sl", 0, "service level value")
	f.intVar(&c.gidx, "g", "gid-idx", -1, "local port GID `index` (default: none on InfiniBand; on RoCE the RoCE v2 IPv4 GID, see docs)")
	f.boolVar(&c.events, "e", "events", "sleep on CQ events (default poll)")
}

// parse reads args (getopt style) and the optional server HOST.
func (c *ppCommon) parse(fs *flag.FlagSet, args []string) error {
	rest, err := parseGetopt(fs, args)
	if err != nil {
		return err
	}
	given := givenFlags(fs)
	c.devGiven = given["d"] || given["ib-dev"]
	c.server, err = hostArg(rest)
	return err
}

// hostArg is the optional HOST operand of a client/server tool: "" for
// the server.
func hostArg(rest []string) (string, error) {
	switch len(rest) {
	case 0:
		return "", nil
	case 1:
		return rest[0], nil
	}
	return "", usageError("want at most one HOST argument, have %q", rest)
}

// validate checks the shared options as rdma-core would refuse them, and
// sooner (an empty message: ibv_*_pingpong fail to register an empty MR).
func (c *ppCommon) validate() error {
	switch {
	case c.port < 0 || c.port > 65535:
		return usageError("-p %d: TCP port must be 0..65535", c.port)
	case c.ibPort < 1 || c.ibPort > 255:
		return usageError("-i %d: IB port must be 1..255", c.ibPort)
	case c.size < 1:
		return usageError("-s %d: message size must be at least 1", c.size)
	case c.rxDepth < 1 || c.rxDepth > ppMaxInt32:
		return usageError("-r %d: rx depth must be 1..%d", c.rxDepth, ppMaxInt32)
	case c.iters < 1 || c.iters > ppMaxInt32:
		return usageError("-n %d: iterations must be 1..%d", c.iters, ppMaxInt32)
	case c.sl < 0 || c.sl > 15:
		return usageError("-l %d: service level must be 0..15", c.sl)
	case c.gidx < -1 || c.gidx > 255:
		return usageError("-g %d: GID index must be 0..255", c.gidx)
	case c.devGiven && c.dev == "":
		return usageError("-d \"\": empty device name (leave -d out for the first device)")
	}
	// -m 0 is no MTU: it used to pass here as "no -m" and reach RTR as
	// path MTU 0.
	if c.withMTU || c.mtu != 0 {
		if _, err := uverbs.MTUFromBytes(c.mtu); err != nil {
			return usageError("-m %d: path MTU must be 256, 512, 1024, 2048 or 4096", c.mtu)
		}
	}
	return nil
}

// firstRecvs is the tools' first pp_post_recv: rxDepth receive WRs, each
// on sges, built once (the loop re-posts slices of them) and posted to q
// (a QP, or the SRQ).
func firstRecvs(q interface{ PostRecv([]qp.RecvWR) error }, sges []qp.SGE, rxDepth int) ([]qp.RecvWR, error) {
	wrs := make([]qp.RecvWR, rxDepth)
	for i := range wrs {
		wrs[i] = qp.RecvWR{ID: pingpongRecvWRID, SGEs: sges}
	}
	if err := q.PostRecv(wrs); err != nil {
		return nil, fmt.Errorf("couldn't post receive (0): %v", err)
	}
	return wrs, nil
}

// oneP gives the process one P unless GOMAXPROCS is set, and returns what
// restores it: a ping-pong is one busy-polling goroutine, like rdma-core's
// one thread, and a second P only lets the runtime's other threads
// compete with the peer and the kernel's rxe work for the CPUs.
func oneP() (restore func()) {
	if os.Getenv("GOMAXPROCS") != "" {
		return func() {}
	}
	prev := runtime.GOMAXPROCS(1)
	return func() { runtime.GOMAXPROCS(prev) }
}

// ppParser is a ping-pong command's options.
type ppParser interface {
	parse(fs *flag.FlagSet, args []string) error
	validate() error
}

// parseChecked parses args into o and checks them.
func parseChecked(o ppParser, fs *flag.FlagSet, args []string) error {
	if err := o.parse(fs, args); err != nil {
		return err
	}
	return o.validate()
}

// startCPUProfile starts a CPU profile into the file path (none if path
// is empty) and returns what stops it and closes the file.
func startCPUProfile(path string) (stop func(), err error) {
	return startToFile(path, pprof.StartCPUProfile, pprof.StopCPUProfile)
}

// startExecTrace is startCPUProfile for a Go execution trace
// (runtime/trace).
func startExecTrace(path string) (stop func(), err error) {
	return startToFile(path, trace.Start, trace.Stop)
}

// startToFile runs start on the file path (made; none if path is empty)
// and returns what runs stop and closes the file.
func startToFile(path string, start func(io.Writer) error, stop func()) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := start(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { stop(); f.Close() }, nil
}
