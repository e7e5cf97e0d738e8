package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/wr"
)

// rping, wire compatible with rdma-core's librdmacm/examples/rping.c: over
// an rdma_cm RC connection the client advertises its source buffer in a
// 16-byte SEND (struct rping_rdma_info: be64 addr, be32 rkey, be32 size),
// the server RDMA READs it and answers with a SEND, the client advertises
// its sink buffer, the server RDMA WRITEs the data back (strlen + 1 bytes)
// and answers again; the client checks the data (-V) and goes on.

const (
	rpingInfoSize = 16
	rpingMaxSize  = 64*1024 - 1
	// sizeof(stringify(INT_MAX)) + sizeof("rdma-ping-%d: ") in rping.c.
	rpingMinSize = 11 + 15
)

type rpingOpts struct {
	server, client bool
	addr, src      string
	at, from       netip.Addr // addr and src resolved; the zero Addr if not given
	port           int
	count, size    int
	verbose, valid bool
	debug          bool
	stdout, stderr io.Writer
}

func runRping(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rping", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o rpingOpts
	fs.BoolVar(&o.server, "s", false, "server side")
	fs.BoolVar(&o.client, "c", false, "client side")
	fs.StringVar(&o.addr, "a", "", "address (server: to bind, default any; client: of the server)")
	fs.StringVar(&o.src, "I", "", "source address to bind to (client)")
	fs.IntVar(&o.port, "p", 7174, "port")
	fs.IntVar(&o.count, "C", 0, "ping count (0: until interrupted)")
	fs.IntVar(&o.size, "S", 64, fmt.Sprintf("ping data size (%d..%d)", rpingMinSize, rpingMaxSize))
	fs.BoolVar(&o.verbose, "v", false, "display ping data to stdout")
	fs.BoolVar(&o.valid, "V", false, "validate ping data")
	fs.BoolVar(&o.debug, "d", false, "debug output on stderr")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: goverbs rping -s [-v -V -d] [-S size] [-C count] [-a addr] [-p port]\n"+
			"       goverbs rping -c [-v -V -d] [-S size] [-C count] [-I addr] -a addr [-p port]\n"+
			"RDMA ping-pong over rdma_cm, wire compatible with rdma-core's rping.\n\n")
		fs.PrintDefaults()
	}
	if err := cmParse(fs, args); err != nil {
		return err
	}
	switch {
	case o.server == o.client:
		return usageError("give exactly one of -s (server) and -c (client)")
	case o.size < rpingMinSize || o.size > rpingMaxSize:
		return usageError("-S %d: invalid size (valid range is %d to %d)", o.size, rpingMinSize, rpingMaxSize)
	case o.count < 0:
		return usageError("-C %d: invalid count (0 or more; 0: until interrupted)", o.count)
	case o.port <= 0 || o.port > 65535:
		return usageError("-p %d: invalid port (1..65535)", o.port)
	case o.client && o.addr == "":
		return usageError("the client needs -a (the server's address)")
	case o.server && o.src != "":
		return usageError("-I %q: the source address is the client's (-c); the server binds -a", o.src)
	}
	var err error
	if o.addr != "" {
		what := "server address"
		if o.server {
			what = "bind address"
		}
		if o.at, err = hostFlag("-a", what, o.addr); err != nil {
			return err
		}
	}
	if o.src != "" {
		if o.from, err = hostFlag("-I", "source address", o.src); err != nil {
			return err
		}
	}
	o.stdout, o.stderr = stdout, stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.server {
		return rpingServer(ctx, &o)
	}
	return rpingClient(ctx, &o)
}

// lookupHost parses an address or looks a name up (IPv4 first, as
// rping's getaddrinfo use mostly does).
func lookupHost(s string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip", s)
	if err != nil {
		return netip.Addr{}, err
	}
	if len(ips) == 0 {
		return netip.Addr{}, fmt.Errorf("lookup %s: no address", s)
	}
	for _, ip := range ips {
		if ip.Unmap().Is4() {
			return ip.Unmap(), nil
		}
	}
	return ips[0], nil
}

func (o *rpingOpts) logf(format string, a ...any) {
	if o.debug {
		fmt.Fprintf(o.stderr, format+"\n", a...)
	}
}

// rpingConn holds one connection's verbs objects. Buffers live in one
// registered region: recv info at 0, send info at 64, the RDMA buffer at
// 4096 and (client) the start buffer after it.
type rpingConn struct {
	o     *rpingOpts
	id    *cm.ID
	ctx   *uverbs.Context
	pd    *uverbs.PD
	mem   *mr.Memory
	mr    *mr.MR
	cq    *cq.CQ
	qp    *qp.QP
	wc    []cq.WC
	disc  chan struct{} // closed on DISCONNECTED
	recvd []byte
}

const (
	rpingRecvOff  = 0
	rpingSendOff  = 64
	rpingRDMAOff  = 4096
	rpingStartOff = 4096 + 64*1024
)

func rpingSetup(o *rpingOpts, id *cm.ID) (*rpingConn, error) {
	name, port, err := id.Device()
	if err != nil {
		return nil, err
	}
	o.logf("device %s port %d", name, port)
	c := &rpingConn{o: o, id: id, wc: make([]cq.WC, 8), disc: make(chan struct{})}
	if c.ctx, err = uverbs.Open(name); err != nil {
		return nil, err
	}
	fail := func(err error) (*rpingConn, error) { c.close(); return nil, err }
	if c.pd, err = c.ctx.AllocPD(); err != nil {
		return fail(err)
	}
	if c.mem, err = mr.Alloc(rpingStartOff + 64*1024); err != nil {
		return fail(err)
	}
	if c.mr, err = mr.Register(c.pd, c.mem.Bytes(), mr.LocalWrite|mr.RemoteRead|mr.RemoteWrite); err != nil {
		return fail(err)
	}
	if c.cq, err = cq.Create(c.ctx, 32); err != nil {
		return fail(err)
	}
	if c.qp, err = id.CreateQP(c.pd, qp.Config{SendCQ: c.cq, RecvCQ: c.cq, MaxSendWR: 16, MaxRecvWR: 2}); err != nil {
		return fail(err)
	}
	if err := c.postRecv(); err != nil {
		return fail(err)
	}
	return c, nil
}

// watch reports the ID's DISCONNECTED (after the connection is made).
func (c *rpingConn) watch(ctx context.Context) {
	go func() {
		if err := c.id.WaitDisconnect(ctx); err == nil {
			c.o.logf("DISCONNECTED")
			close(c.disc)
		}
	}()
}

func (c *rpingConn) close() {
	c.id.Close() // the QP first, then the kernel ID
	if c.ctx != nil {
		c.ctx.Close()
	}
	if c.mem != nil {
		c.mem.Close()
	}
}

func (c *rpingConn) sge(off, n int) qp.SGE {
	g, _ := c.mr.SGE(off, n)
	return g
}

func (c *rpingConn) postRecv() error {
	return c.qp.PostRecv([]qp.RecvWR{{ID: 1, SGEs: []qp.SGE{c.sge(rpingRecvOff, rpingInfoSize)}}})
}

// sendInfo SENDs the 16-byte info (addr, rkey, size of the buffer at off;
// all zeros for off < 0, the server's go-ahead).
func (c *rpingConn) sendInfo(off, size int) error {
	b := c.mem.Bytes()[rpingSendOff : rpingSendOff+rpingInfoSize]
	clear(b)
	if off >= 0 {
		binary.BigEndian.PutUint64(b[0:], c.mr.Addr()+uint64(off))
		binary.BigEndian.PutUint32(b[8:], c.mr.RKey())
		binary.BigEndian.PutUint32(b[12:], uint32(size))
		c.o.logf("RDMA addr %x rkey %x len %d", c.mr.Addr()+uint64(off), c.mr.RKey(), size)
	}
	return c.qp.PostSend([]qp.SendWR{{ID: 2, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{c.sge(rpingSendOff, rpingInfoSize)}}})
}

var errRpingDisconnected = errors.New("disconnected")

// await polls the CQ for a completion of op (SEND completions are taken
// in passing), or returns errRpingDisconnected once the peer left.
func (c *rpingConn) await(ctx context.Context, op wr.WCOpcode) (cq.WC, error) {
	for {
		n, err := c.cq.Poll(c.wc)
		if err != nil {
			return cq.WC{}, err
		}
		var got *cq.WC
		for i := 0; i < n; i++ {
			w := c.wc[i]
			if w.Status != wr.WCSuccess {
				select {
				case <-c.disc:
					return cq.WC{}, errRpingDisconnected
				default:
				}
				if w.Status == wr.WCWRFlushErr {
					continue
				}
				return cq.WC{}, fmt.Errorf("cq completion failed status %d (%v)", w.Status, w.Status)
			}
			if w.Opcode == op && got == nil {
				wc := w
				got = &wc
			}
		}
		if got != nil {
			if op == wr.WCRecv {
				if got.ByteLen != rpingInfoSize {
					return cq.WC{}, fmt.Errorf("received bogus data, size %d", got.ByteLen)
				}
				c.recvd = append(c.recvd[:0], c.mem.Bytes()[rpingRecvOff:rpingRecvOff+rpingInfoSize]...)
				if err := c.postRecv(); err != nil {
					return cq.WC{}, fmt.Errorf("post recv: %w", err)
				}
			}
			return *got, nil
		}
		if n == 0 {
			select {
			case <-c.disc:
				return cq.WC{}, errRpingDisconnected
			case <-ctx.Done():
				return cq.WC{}, ctx.Err()
			case <-time.After(20 * time.Microsecond):
			}
		}
	}
}

func rpingConnParam() cm.ConnParam {
	return cm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7}
}

func rpingServer(ctx context.Context, o *rpingOpts) error {
	ch, lis, at, err := cmListen(cm.TCP, o.at, uint16(o.port), 3)
	if err != nil {
		return err
	}
	defer ch.Close()
	o.logf("listening on %v", at)
	req, err := lis.GetRequest(ctx)
	if err != nil {
		return err
	}
	o.logf("connect request")
	c, err := rpingSetup(o, req.ID)
	if err != nil {
		req.ID.Reject(nil, 0)
		req.ID.Close()
		return err
	}
	defer c.close()
	if _, err := req.ID.Accept(ctx, rpingConnParam()); err != nil {
		return err
	}
	_, err = c.established(ctx, "server", c.serve)
	// Answer the client's disconnect (or start ours after a failure).
	req.ID.Disconnect()
	return err
}

// established is each side once connected: it starts watching for the
// peer's disconnect and runs loop (serve or ping), which the peer's
// disconnect ends without an error, said on stderr as "side DISCONNECT
// EVENT..." (peerGone).
func (c *rpingConn) established(ctx context.Context, side string, loop func(context.Context) error) (peerGone bool, err error) {
	c.o.logf("ESTABLISHED")
	c.watch(ctx)
	if err := loop(ctx); !errors.Is(err, errRpingDisconnected) {
		return false, err
	}
	fmt.Fprintln(c.o.stderr, side+" DISCONNECT EVENT...")
	return true, nil
}

func (c *rpingConn) serve(ctx context.Context) error {
	buf := c.mem.Bytes()
	for {
		if _, err := c.await(ctx, wr.WCRecv); err != nil {
			return err
		}
		addr, rkey, n := binary.BigEndian.Uint64(c.recvd[0:]), binary.BigEndian.Uint32(c.recvd[8:]), binary.BigEndian.Uint32(c.recvd[12:])
		c.o.logf("received rkey %x addr %x len %d from peer", rkey, addr, n)
		if int(n) > c.o.size {
			return fmt.Errorf("the client's buffer (%d bytes) is larger than ours (-S %d)", n, c.o.size)
		}
		if err := c.qp.PostSend([]qp.SendWR{{ID: 3, Opcode: qp.OpRDMARead, Flags: qp.Signaled,
			SGEs: []qp.SGE{c.sge(rpingRDMAOff, int(n))}, RemoteAddr: addr, RKey: rkey}}); err != nil {
			return fmt.Errorf("post send: %w", err)
		}
		if _, err := c.await(ctx, wr.WCRDMARead); err != nil {
			return err
		}
		data := buf[rpingRDMAOff : rpingRDMAOff+c.o.size]
		if i := bytes.IndexByte(data, 0); i >= 0 {
			data = data[:i]
		}
		if c.o.verbose {
			fmt.Fprintf(c.o.stdout, "server ping data: %s\n", data)
		}
		if err := c.sendInfo(-1, 0); err != nil {
			return fmt.Errorf("post send: %w", err)
		}
		if _, err := c.await(ctx, wr.WCRecv); err != nil {
			return err
		}
		addr, rkey = binary.BigEndian.Uint64(c.recvd[0:]), binary.BigEndian.Uint32(c.recvd[8:])
		if err := c.qp.PostSend([]qp.SendWR{{ID: 4, Opcode: qp.OpRDMAWrite, Flags: qp.Signaled,
			SGEs: []qp.SGE{c.sge(rpingRDMAOff, len(data)+1)}, RemoteAddr: addr, RKey: rkey}}); err != nil {
			return fmt.Errorf("post send: %w", err)
		}
		if _, err := c.await(ctx, wr.WCRDMAWrite); err != nil {
			return err
		}
		if err := c.sendInfo(-1, 0); err != nil {
			return fmt.Errorf("post send: %w", err)
		}
	}
}

func rpingClient(ctx context.Context, o *rpingOpts) error {
	ch, id, err := cmResolve(ctx, cm.TCP, o.at, uint16(o.port), o.from)
	if err != nil {
		return err
	}
	defer ch.Close()
	o.logf("address and route resolved")
	c, err := rpingSetup(o, id)
	if err != nil {
		return err
	}
	defer c.close()
	if _, err := id.Connect(ctx, rpingConnParam()); err != nil {
		return err
	}
	peerGone, err := c.established(ctx, "client", c.ping)
	if peerGone {
		return nil
	}
	if derr := id.Disconnect(); derr == nil {
		select {
		case <-c.disc:
		case <-time.After(5 * time.Second):
		}
	}
	return err
}

func (c *rpingConn) ping(ctx context.Context) error {
	size := c.o.size
	buf := c.mem.Bytes()
	start := byte(65)
	for ping := 0; c.o.count == 0 || ping < c.o.count; ping++ {
		sb := buf[rpingStartOff : rpingStartOff+size]
		cc := copy(sb, "rdma-ping-"+strconv.Itoa(ping)+": ")
		ch := start
		for i := cc; i < size; i++ {
			sb[i] = ch
			ch++
			if ch > 122 {
				ch = 65
			}
		}
		start++
		if start > 122 {
			start = 65
		}
		sb[size-1] = 0
		if err := c.sendInfo(rpingStartOff, size); err != nil {
			return fmt.Errorf("post send: %w", err)
		}
		if _, err := c.await(ctx, wr.WCRecv); err != nil {
			return err
		}
		if err := c.sendInfo(rpingRDMAOff, size); err != nil {
			return fmt.Errorf("post send: %w", err)
		}
		if _, err := c.await(ctx, wr.WCRecv); err != nil {
			return err
		}
		rb := buf[rpingRDMAOff : rpingRDMAOff+size]
		if c.o.valid && !bytes.Equal(sb, rb) {
			return errors.New("data mismatch")
		}
		if c.o.verbose {
			d := rb
			if i := bytes.IndexByte(d, 0); i >= 0 {
				d = d[:i]
			}
			fmt.Fprintf(c.o.stdout, "ping data: %s\n", d)
		}
	}
	return nil
}
