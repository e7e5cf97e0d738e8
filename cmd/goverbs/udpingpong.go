package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

// udQKey is the QKey of ud_pingpong.c, on both sides.
const udQKey = 0x11111111

type udOptions struct{ ppCommon }

const udUsage = `Usage:
  goverbs ud-pingpong [options]          start a server and wait for connection
  goverbs ud-pingpong [options] <host>   connect to server at <host>

Options (those of ibv_ud_pingpong, wire compatible with it):
  -p, --port=<port>      listen on/connect to port <port> (default 18515)
  -d, --ib-dev=<dev>     use IB device <dev> (default first device found)
  -i, --ib-port=<port>   use port <port> of IB device (default 1)
  -s, --size=<size>      size of message to exchange (default 2048; at most
                         the port's active MTU: rxe on a 1500-byte link has 1024)
  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)
  -n, --iters=<iters>    number of exchanges (default 1000)
  -l, --sl=<sl>          service level value
  -e, --events           sleep on CQ events (default poll)
  -g, --gid-idx=<gid index> local port gid index (default: none on InfiniBand;
                         on RoCE the port's RoCE v2 IPv4-mapped GID)

Every receive is checked: 40 bytes of GRH and -s bytes of payload, sent by
the peer's QP from the peer's GID.
`

func udFlags(stderr io.Writer) (*flag.FlagSet, *udOptions) {
	o := &udOptions{}
	fs := flag.NewFlagSet("goverbs ud-pingpong", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.flags(ppFlags{fs}, 2048, false)
	fs.Usage = func() { fmt.Fprint(stderr, udUsage) }
	return fs, o
}

// udPingpong is one side of ud_pingpong.c. Its buffer has the GRH (40
// bytes) in front of the payload: receives land there, sends go from
// buf[40:].
type udPingpong struct {
	ppOneQP
	o   *udOptions
	ah  *uverbs.AH
	rem dest
}

func runUDPingpong(args []string, stdout, stderr io.Writer) error {
	defer oneP()()
	fs, o := udFlags(stderr)
	if err := parseChecked(o, fs, args); err != nil {
		return err
	}
	pp := &udPingpong{o: o}
	defer pp.close()
	if err := pp.init(stderr); err != nil {
		return err
	}
	// ud_pingpong.c prints ": GID" in the local line (and ", GID" in the
	// remote line).
	if err := pp.exchange(&o.ppCommon, stdout, ":", pp.connect); err != nil {
		return err
	}
	var err error
	if pp.pend, err = firstSend(pp.qp, pp.sendWR, o.server != ""); err != nil {
		return err
	}
	return o.timeLoopSummary(stdout, stderr, "ud-pingpong", pp.poller, pp.loop)
}

// init is ud_pingpong's pp_init_ctx and first receives: the size is checked
// against the port's active MTU (a UD message is one packet), the buffer
// has 40 bytes for the GRH in front, the QP is in INIT with the QKey.
func (pp *udPingpong) init(stderr io.Writer) error {
	o := pp.o
	if err := pp.open("ud-pingpong", &o.ppCommon, stderr); err != nil {
		return err
	}
	if mtu := pp.dev.port.ActiveMTU.Bytes(); o.size > mtu {
		return usageError("-s %d: requested size larger than %s port %d's active MTU (%d): a UD message must fit in one packet",
			o.size, pp.dev.name, o.ibPort, mtu)
	}
	if err := pp.dev.checkRxDepth(o.rxDepth, o.rxDepth+1, false); err != nil {
		return err
	}
	n := qp.GRHSize + o.size
	if err := pp.alloc(n, 0x7b, o.rxDepth+1, o.events); err != nil { // 0x7b as ud_pingpong does
		return err
	}
	if err := pp.createQP(qp.UD, o.rxDepth); err != nil {
		return err
	}
	if err := pp.qp.Modify(&qp.Attr{State: qp.Init, Port: uint8(o.ibPort), QKey: udQKey},
		qp.MaskState|qp.MaskPKeyIndex|qp.MaskPort|qp.MaskQKey); err != nil {
		return fmt.Errorf("failed to modify QP to INIT: %v", err)
	}

	recvSGE, err := pp.mr.SGE(0, n)
	if err != nil {
		return err
	}
	sendSGE, err := pp.mr.SGE(qp.GRHSize, o.size)
	if err != nil {
		return err
	}
	// The AH and remote QPN are filled in by connect.
	send := []qp.SendWR{{ID: pingpongSendWRID, Opcode: qp.OpSend, Flags: sendFlags(pp.qp, o.size), SGEs: []qp.SGE{sendSGE}, RemoteQKey: udQKey}}
	return pp.prepare(send, []qp.SGE{recvSGE}, o.rxDepth)
}

// connect is ud_pingpong's pp_connect_ctx: RTR, RTS with our PSN, and an
// address handle to the peer with hop limit 1. ud_pingpong makes the AH
// global only when the peer's GID has an interface ID; goverbs' AHs are
// always global (RoCE), so a peer without a GID is refused.
func (pp *udPingpong) connect(myPSN uint32, rem dest) error {
	o := pp.o
	if err := pp.qp.ToRTS(qp.UDOptions{Port: uint8(o.ibPort), QKey: udQKey, PSN: myPSN}); err != nil {
		return fmt.Errorf("failed to modify QP to RTR/RTS: %v", err)
	}
	if !rem.global() {
		return errors.New("failed to create AH: the peer sent no GID (goverbs makes global AHs only: give the peer -g)")
	}
	if pp.dev.sgid < 0 {
		return errors.New("failed to create AH: the peer sent a GID but we have none: give -g")
	}
	ah, err := pp.pd.CreateAH(uverbs.AHAttr{Port: uint8(o.ibPort), DGID: net.IP(rem.GID[:]), SGIDIndex: uint8(pp.dev.sgid),
		UseSGID: true, HopLimit: 1, DLID: rem.LID, SL: uint8(o.sl)})
	if err != nil {
		return fmt.Errorf("failed to create AH: %v", err)
	}
	pp.ah, pp.rem = ah, rem
	pp.sendWR[0].AH = ah.Provider()
	pp.sendWR[0].RemoteQPN = rem.QPN
	return nil
}

// loop is ud_pingpong's main loop; it allocates nothing. Unlike
// ud_pingpong, each receive is checked: its length must be the GRH and -s
// bytes, it must come from the peer's QP, and its GRH must name the peer's
// GID as the source.
func (pp *udPingpong) loop() error {
	want := uint32(qp.GRHSize + pp.o.size)
	return pp.runLoop(&pp.o.ppCommon, func(w *cq.WC) error { return pp.checkRecv(w, want) })
}

func (pp *udPingpong) checkRecv(w *cq.WC, want uint32) error {
	if w.ByteLen != want {
		return fmt.Errorf("%d bytes, want %d (the %d-byte GRH and -s %d)", w.ByteLen, want, qp.GRHSize, pp.o.size)
	}
	if w.SrcQP != pp.rem.QPN {
		return fmt.Errorf("from QP 0x%06x, want the peer's QP 0x%06x", w.SrcQP, pp.rem.QPN)
	}
	sgid, ok := grhSGID(pp.buf[:qp.GRHSize])
	if !ok {
		return fmt.Errorf("no GRH in front of the payload (% x)", pp.buf[:qp.GRHSize])
	}
	if sgid != pp.rem.GID {
		return fmt.Errorf("GRH source GID %s, want the peer's %s", ntop(sgid), ntop(pp.rem.GID))
	}
	return nil
}

// grhSGID is qp.ParseGRH's source GID without allocating: an IPv6-format
// GRH (InfiniBand, RoCE v1 and v2 over IPv6) carries it in bytes 8..23; on
// RoCE v2 over IPv4 the device writes the IPv4 header into the last 20
// bytes, and the source address maps to ::ffff:a.b.c.d.
func grhSGID(b []byte) (g [16]byte, ok bool) {
	if len(b) < qp.GRHSize {
		return g, false
	}
	if b[0]>>4 == 6 {
		copy(g[:], b[8:24])
		return g, true
	}
	if ip := b[20:40]; ip[0] == 0x45 {
		g[10], g[11] = 0xff, 0xff
		copy(g[12:], ip[12:16])
		return g, true
	}
	return g, false
}
