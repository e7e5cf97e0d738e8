package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/wr"
)

// goverbs perf -R: perftest 4.5's rdma_cm mode (-R, --rdma_cm: work_rdma_cm,
// which implies use_rdma_cm), as src/perftest_communication.c and
// perftest_resources.c do it:
//
//   - The exchange itself runs over RDMA instead of TCP (establish_connection
//     with use_rdma_cm): an RC QP connected by rdma_cm on the TCP port space
//     at the -p port (the server binds 0.0.0.0), one 56-byte receive posted
//     before the connection and reposted after each message; a step is a
//     signaled SEND of the step's bytes (rdma_write_data) and a receive
//     (rdma_read_data), the client sending first. The steps are those of
//     the TCP exchange (versions, page and cache line size, MTU, handshakes,
//     bw reports), but a handshake carries struct pingpong_dest in binary,
//     big-endian (rdma_write_keys with HAVE_ENDIAN), and the close is the
//     handshake alone, no "done".
//   - The test QPs are made by rdma_cm (create_rdma_cm_connection): a
//     handshake, then one rdma_cm connection per QP at the same port (the
//     exchange's listener is gone by then; UD tests use the UDP port space),
//     then a handshake. rdma_cm brings the QPs to RTS: no modify-QP from the
//     exchanged addresses, which only give RDMA's address and rkey. The
//     connect carries retry and RNR retry 7 and, for reads and atomics, the
//     outstanding reads as responder resources and initiator depth.
//   - UD (send_lat): the client takes the server's QPN, Q_Key and address
//     from the SIDR reply and sends a 4-byte SEND_WITH_IMM whose immediate
//     is its QPN; the server, which posted a receive for it before it
//     accepted, makes its AH from that receive's GRH and sends to that QPN
//     with its own QP's Q_Key (rdma_cm's). send_bw's server sends nothing,
//     so there the client sends nothing either.
//   - At the end perftest's client disconnects each test connection and
//     waits for DISCONNECTED; its server disconnects its last one.

// perftestKeysCM is sizeof(struct pingpong_dest) on 64-bit Linux: lid,
// out_reads, qpn, psn, rkey (4 bytes each), 4 bytes of padding, vaddr (8),
// gid (16), srqn, gid_index (4 each).
const perftestKeysCM = 56

// formatKeysCM is rdma_write_keys' message.
func formatKeysCM(a perfQPInfo, outReads, gidx int) []byte {
	b := make([]byte, perftestKeysCM)
	be := binary.BigEndian
	be.PutUint32(b[0:], uint32(a.LID))
	be.PutUint32(b[4:], uint32(outReads))
	be.PutUint32(b[8:], a.QPN)
	be.PutUint32(b[12:], a.PSN)
	be.PutUint32(b[16:], a.RKey)
	be.PutUint64(b[24:], a.Addr)
	if g := a.GID.To16(); g != nil {
		copy(b[32:48], g)
	}
	be.PutUint32(b[52:], uint32(int32(gidx)))
	return b
}

// parseKeysCM is rdma_read_keys.
func parseKeysCM(b []byte) perfQPInfo {
	be := binary.BigEndian
	return perfQPInfo{LID: uint16(be.Uint32(b[0:])), QPN: be.Uint32(b[8:]), PSN: be.Uint32(b[12:]),
		RKey: be.Uint32(b[16:]), Addr: be.Uint64(b[24:]), GID: append(net.IP(nil), b[32:48]...)}
}

// ptRDMA is the exchange over an rdma_cm-connected RC QP, with resources of
// its own (perftest's comm struct).
type ptRDMA struct {
	id       *cm.ID
	dev      string
	ctx      *uverbs.Context
	pd       *uverbs.PD
	mem      *mr.Memory
	mr       *mr.MR
	scq, rcq *cq.CQ
	qp       *qp.QP
	wc       []cq.WC
}

const (
	ptRecvOff = 0
	ptSendOff = 2048
)

func (l *ptRDMA) Close() error {
	if l.id != nil {
		l.id.Close() // the QP, then the kernel ID
	}
	if l.ctx != nil {
		l.ctx.Close()
	}
	if l.mem != nil {
		l.mem.Close()
	}
	return nil
}

// setup opens the ID's device and makes the QP (INIT) with one receive
// posted, as create_comm_struct and ctx_init do for the exchange.
func (l *ptRDMA) setup() error {
	name, _, err := l.id.Device()
	if err != nil {
		return err
	}
	l.dev = name
	if l.ctx, err = uverbs.Open(name); err != nil {
		return fmt.Errorf("couldn't get context for %s: %v", name, err)
	}
	if l.pd, err = l.ctx.AllocPD(); err != nil {
		return fmt.Errorf("couldn't allocate PD: %v", err)
	}
	if l.mem, err = mr.Alloc(4096); err != nil {
		return err
	}
	if l.mr, err = mr.Register(l.pd, l.mem.Bytes(), mr.LocalWrite); err != nil {
		return fmt.Errorf("couldn't register MR: %v", err)
	}
	if l.scq, err = cq.Create(l.ctx, 2); err != nil {
		return fmt.Errorf("couldn't create CQ: %v", err)
	}
	if l.rcq, err = cq.Create(l.ctx, 2); err != nil {
		return fmt.Errorf("couldn't create CQ: %v", err)
	}
	l.wc = make([]cq.WC, 1)
	if l.qp, err = l.id.CreateQP(l.pd, qp.Config{SendCQ: l.scq, RecvCQ: l.rcq, MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}); err != nil {
		return err
	}
	return l.postRecv()
}

func (l *ptRDMA) postRecv() error {
	g, err := l.mr.SGE(ptRecvOff, perftestKeysCM)
	if err != nil {
		return err
	}
	if err := l.qp.PostRecv([]qp.RecvWR{{ID: 5, SGEs: []qp.SGE{g}}}); err != nil {
		return fmt.Errorf("couldn't post a receive on the exchange's QP: %v", err)
	}
	return nil
}

// await polls c for one completion until bound; a completion in error
// means the peer went away (its QP is gone: retries exceeded) or broke the
// protocol.
func (l *ptRDMA) await(c *cq.CQ, bound time.Duration) (*cq.WC, error) {
	deadline := time.Now().Add(bound)
	for spins := 0; ; spins++ {
		n, err := c.Poll(l.wc)
		if err != nil {
			return nil, err
		}
		if n > 0 {
			w := &l.wc[0]
			if w.Status != wr.WCSuccess {
				return nil, fmt.Errorf("%w (completion with error: %v)", errPtClosed, w.Status)
			}
			return w, nil
		}
		if spins < 1000 {
			continue // the peer usually answers within microseconds
		}
		if time.Now().After(deadline) {
			return nil, errPtStall
		}
		time.Sleep(20 * time.Microsecond)
	}
}

func (l *ptRDMA) write(b []byte, bound time.Duration) error {
	if len(b) > perftestKeysCM {
		return fmt.Errorf("%d bytes do not fit perftest's %d-byte receive", len(b), perftestKeysCM)
	}
	copy(l.mem.Bytes()[ptSendOff:], b)
	g, err := l.mr.SGE(ptSendOff, len(b))
	if err != nil {
		return err
	}
	if err := l.qp.PostSend([]qp.SendWR{{ID: 5, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{g}}}); err != nil {
		return err
	}
	_, err = l.await(l.scq, bound)
	return err
}

func (l *ptRDMA) read(b []byte, bound time.Duration) error {
	w, err := l.await(l.rcq, bound)
	if err != nil {
		return err
	}
	if int(w.ByteLen) != len(b) {
		return fmt.Errorf("the peer sent %d bytes where %d were due (does it run the same test?)", w.ByteLen, len(b))
	}
	copy(b, l.mem.Bytes()[ptRecvOff:])
	return l.postRecv()
}

// perfCMConnParam is what perftest's connects and accepts carry.
func perfCMConnParam(outReads int) cm.ConnParam {
	return cm.ConnParam{ResponderResources: uint8(outReads), InitiatorDepth: uint8(outReads), RetryCount: 7, RNRRetryCount: 7}
}

// perfCMResolve resolves host:port for id within rdma-core's 2 s.
func perfCMResolve(id *cm.ID, dst netip.AddrPort) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := id.ResolveAddr(ctx, netip.Addr{}, dst); err != nil {
		return err
	}
	return id.ResolveRoute(ctx)
}

// perfCMDial is rdma_client_connect for the exchange: it retries while
// nobody listens yet (as perfDial does for TCP).
func perfCMDial(ch *cm.Channel, host netip.Addr, port int) (*ptRDMA, error) {
	dst := netip.AddrPortFrom(host, uint16(port))
	var err, last error
	for i := 0; i < 50; i++ {
		if i > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		l := &ptRDMA{}
		if l.id, err = ch.CreateID(cm.TCP); err != nil {
			return nil, err
		}
		err = perfCMResolve(l.id, dst)
		if err == nil {
			if err = l.setup(); err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), perfStall)
				_, err = l.id.Connect(ctx, perfCMConnParam(1))
				cancel()
				if err == nil {
					return l, nil
				}
			}
		}
		l.Close()
		last = err
		if !errors.Is(err, cm.ErrRejected) && !errors.Is(err, cm.ErrUnreachable) && !errors.Is(err, cm.ErrAddress) {
			break
		}
	}
	return nil, fmt.Errorf("couldn't connect to %v with rdma_cm: %v", dst, last)
}

// perfCMListen is rdma_server_connect for the exchange: it waits for the
// client (for ever, as over TCP), accepts it and closes the listener, so
// that the test's own listener may take the port.
func perfCMListen(ch *cm.Channel, port int) (*ptRDMA, error) {
	lis, err := ch.CreateID(cm.TCP)
	if err != nil {
		return nil, err
	}
	defer lis.Close()
	if err := lis.Bind(netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(port))); err != nil {
		return nil, fmt.Errorf("couldn't listen with rdma_cm on port %d: %v", port, err)
	}
	if err := lis.Listen(1); err != nil {
		return nil, fmt.Errorf("couldn't listen with rdma_cm on port %d: %v", port, err)
	}
	req, err := lis.GetRequest(context.Background())
	if err != nil {
		return nil, err
	}
	l := &ptRDMA{id: req.ID}
	if err := l.setup(); err != nil {
		req.ID.Reject(nil, 0)
		l.Close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), perfStall)
	defer cancel()
	if _, err := req.ID.Accept(ctx, perfCMConnParam(1)); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// perfCMExchange makes the exchange's connection (-R) and returns it and
// the device rdma_cm chose for it, which the test uses too.
func (r *perfRun) perfCMExchange(stderr io.Writer) (*ptRDMA, error) {
	o := r.o
	var err error
	if r.cmch, err = cm.Open(); err != nil {
		return nil, err
	}
	var l *ptRDMA
	if r.client {
		l, err = perfCMDial(r.cmch, o.serverAddr, o.port)
	} else {
		l, err = perfCMListen(r.cmch, o.port)
	}
	if err != nil {
		return nil, err
	}
	if o.dev != "" && o.dev != l.dev {
		fmt.Fprintf(stderr, "goverbs perf: -d %s, but rdma_cm reaches the peer through %s: using %s (as perftest does)\n", o.dev, l.dev, l.dev)
	}
	o.dev = l.dev
	return l, nil
}

// cmConnect is create_rdma_cm_connection: a handshake, one rdma_cm
// connection per QP, a handshake. The QPs are created on the IDs.
func (r *perfRun) cmConnect(p *ptConn) error {
	o := r.o
	ps := cm.TCP
	if o.conn == "UD" {
		ps = cm.UDP
	}
	var lis *cm.ID
	if !r.client {
		// Listen before the handshake that lets the client connect, so
		// that it never finds nobody there.
		var err error
		if lis, err = r.cmch.CreateID(ps); err != nil {
			return err
		}
		defer lis.Close()
		if err := lis.Bind(netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(o.port))); err != nil {
			return fmt.Errorf("couldn't bind the test's rdma_cm listener to port %d: %v", o.port, err)
		}
		if err := lis.Listen(len(r.qps)); err != nil {
			return fmt.Errorf("couldn't listen for the test's rdma_cm connections: %v", err)
		}
	}
	if _, err := p.handshake(perfQPInfo{}, r.outReads); err != nil {
		return err
	}
	for _, q := range r.qps {
		var err error
		if r.client {
			err = r.cmDialQP(q)
		} else {
			err = r.cmAcceptQP(lis, q)
		}
		if err != nil {
			return fmt.Errorf("rdma_cm connection of QP %d: %v", q.idx, err)
		}
	}
	_, err := p.handshake(perfQPInfo{}, r.outReads)
	return err
}

// udAHNeeded: send_lat's server sends to the client, so it needs the
// client's address (perftest: UD and LAT, or BW with duplex).
func (r *perfRun) udAHNeeded() bool { return r.o.conn == "UD" && !r.o.kind.bw }

func (r *perfRun) cmCheckDevice(id *cm.ID) error {
	name, _, err := id.Device()
	if err != nil {
		return err
	}
	if name != r.ctx.Name() {
		return fmt.Errorf("rdma_cm routes it through %s, the exchange went through %s", name, r.ctx.Name())
	}
	return nil
}

func (r *perfRun) cmDialQP(q *perfQP) error {
	o := r.o
	dst := netip.AddrPortFrom(o.serverAddr, uint16(o.port))
	ps := cm.TCP
	if o.conn == "UD" {
		ps = cm.UDP
	}
	deadline := time.Now().Add(perfStall)
	for {
		id, err := r.cmch.CreateID(ps)
		if err != nil {
			return err
		}
		var ev cm.Event
		err = perfCMResolve(id, dst)
		if err == nil {
			err = r.cmCheckDevice(id)
		}
		if err == nil {
			q.qp, err = id.CreateQP(r.pd, r.qpConfig())
		}
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), perfStall)
			ev, err = id.Connect(ctx, perfCMConnParam(r.outReads))
			cancel()
		}
		if err != nil {
			id.Close()
			q.qp = nil
			// perftest's client tries again while the server is not
			// listening yet (rdma_cm_client_connection).
			if errors.Is(err, cm.ErrConnRefused) && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			return err
		}
		r.cmIDs = append(r.cmIDs, id)
		if o.conn != "UD" {
			return nil
		}
		// rdma_cm_establish_ud_connection.
		if ev.AH == nil {
			return errors.New("the SIDR reply carries no address")
		}
		if q.ah, err = r.pd.CreateAH(*ev.AH); err != nil {
			return fmt.Errorf("couldn't create AH: %v", err)
		}
		q.rem.QPN, q.remQKey = ev.QPN, ev.QKey
		if !r.udAHNeeded() {
			return nil
		}
		binary.NativeEndian.PutUint32(q.buf, q.qp.QPN())
		g, err := q.mr.SGE(0, 4)
		if err != nil {
			return err
		}
		if err := q.qp.PostSend([]qp.SendWR{{ID: uint64(q.idx) << 32, Opcode: qp.OpSendWithImm, Flags: qp.Signaled, Imm: q.qp.QPN(),
			SGEs: []qp.SGE{g}, AH: q.ah.Provider(), RemoteQPN: q.rem.QPN, RemoteQKey: q.remQKey}}); err != nil {
			return fmt.Errorf("couldn't send our QP number: %v", err)
		}
		_, err = r.cmAwait(r.sendCQ, "the send of our QP number")
		return err
	}
}

func (r *perfRun) cmAcceptQP(lis *cm.ID, q *perfQP) error {
	ctx, cancel := context.WithTimeout(context.Background(), perfStall)
	defer cancel()
	req, err := lis.GetRequest(ctx)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("no connect request for %v", perfStall)
		}
		return err
	}
	id := req.ID
	if err = r.cmCheckDevice(id); err == nil {
		q.qp, err = id.CreateQP(r.pd, r.qpConfig())
	}
	if err == nil && r.udAHNeeded() {
		// rdma_cm_request_ud_connection_parameters: a receive for the
		// client's QP number, behind its GRH.
		var g qp.SGE
		if g, err = q.mr.SGE(q.half, qp.GRHSize+4); err == nil {
			err = q.qp.PostRecv([]qp.RecvWR{{ID: uint64(q.idx), SGEs: []qp.SGE{g}}})
		}
	}
	if err != nil {
		id.Reject(nil, 0)
		id.Close()
		q.qp = nil
		return err
	}
	r.cmIDs = append(r.cmIDs, id)
	if _, err := id.Accept(ctx, perfCMConnParam(r.outReads)); err != nil {
		return err
	}
	if !r.udAHNeeded() {
		return nil
	}
	// rdma_cm_initialize_ud_connection_parameters.
	w, err := r.cmAwait(r.recvCQ, "the client's QP number")
	if err != nil {
		return err
	}
	grh, err := qp.ParseGRH(q.buf[q.half : q.half+qp.GRHSize])
	if err != nil {
		return err
	}
	if q.ah, err = r.pd.CreateAH(uverbs.AHAttr{Port: uint8(r.o.ibPort), DGID: grh.SGID, SGIDIndex: uint8(r.gid.Index), UseSGID: true}); err != nil {
		return fmt.Errorf("couldn't create AH: %v", err)
	}
	a, _, err := id.InitQPAttr(qp.Init)
	if err != nil {
		return err
	}
	q.rem.QPN, q.remQKey = w.Imm, a.QKey
	return nil
}

// cmAwait waits for one completion on c, at most perfStall.
func (r *perfRun) cmAwait(c *cq.CQ, what string) (*cq.WC, error) {
	deadline := time.Now().Add(perfStall)
	for {
		n, err := c.Poll(r.wc[:1])
		if err != nil {
			return nil, err
		}
		if n > 0 {
			if err := r.wc[0].Err(); err != nil {
				return nil, fmt.Errorf("%s: %v", what, err)
			}
			return &r.wc[0], nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s: nothing for %v", what, perfStall)
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// cmClose ends the test's rdma_cm connections as perftest does: its client
// disconnects each and waits for DISCONNECTED; we do that on both sides
// (a bounded wait), then destroy the IDs (and their QPs).
func (r *perfRun) cmClose() {
	for _, id := range r.cmIDs {
		if r.o.conn != "UD" {
			id.Disconnect()
		}
	}
	if r.o.conn != "UD" {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		for _, id := range r.cmIDs {
			id.WaitDisconnect(ctx)
		}
		cancel()
	}
	for _, id := range r.cmIDs {
		id.Close()
	}
	r.cmIDs = nil
	for _, q := range r.qps {
		q.qp = nil // destroyed with its ID
	}
}
