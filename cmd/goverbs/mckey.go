package main

import (
	"context"
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
	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/uverbs/provider"
)

// mckey, wire compatible with rdma-core's librdmacm/examples/mckey.c for
// one join: both sides resolve the multicast address (from -b) on the UDP
// port space and join the group; after mckey's 3 s pause the sender (-s)
// sends -C datagrams of -S bytes to the group (QPN 0xFFFFFF, the join's
// Q_Key) as SEND_WITH_IMM whose immediate is its QPN, and the receiver
// counts -C of them. Both leave the group at the end.

// mckeyPause is mckey's wait between the join and the data ("give SM
// chance to configure switches").
const mckeyPause = 3 * time.Second

type mckeyOpts struct {
	group, bind string
	sender      bool
	sendOnly    bool
	count, size int
	idle        time.Duration
	stdout      io.Writer
}

func runMckey(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mckey", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o mckeyOpts
	fs.StringVar(&o.group, "m", "", "multicast address")
	fs.StringVar(&o.bind, "b", "", "bind address")
	fs.BoolVar(&o.sender, "s", false, "send (without it, receive)")
	fs.BoolVar(&o.sendOnly, "o", false, "join as a send-only full member")
	fs.IntVar(&o.count, "C", 10, "message count")
	fs.IntVar(&o.size, "S", 100, "message size")
	conns := fs.Int("c", 1, "connections (only 1)")
	ps := fs.String("p", "0x111", "port space (only 0x111, UDP)")
	fs.DurationVar(&o.idle, "idle", 30*time.Second, "give up receiving after this long without a datagram (mckey waits forever)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &exitError{code: 2}
	}
	psv, perr := strconv.ParseUint(*ps, 0, 16)
	switch {
	case fs.NArg() > 0:
		return usageError("unexpected arguments %q", fs.Args())
	case o.group == "":
		return usageError("-m multicast_address is required")
	case *conns != 1:
		return usageError("-c %d: goverbs mckey makes one join", *conns)
	case perr != nil || psv != ioctl.RDMA_PS_UDP:
		return usageError("-p %s: only the UDP port space (%#x) is supported (IPoIB is not)", *ps, ioctl.RDMA_PS_UDP)
	case o.count < 0 || o.count > 4096:
		return usageError("invalid message count %d (0..4096)", o.count)
	case o.size < 0:
		return usageError("invalid message size %d", o.size)
	case o.idle <= 0:
		return usageError("invalid -idle %v", o.idle)
	}
	if o.size == 0 {
		o.count = 0 // as mckey
	}
	o.stdout = stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	who := "server"
	if o.sender {
		who = "client"
	}
	fmt.Fprintf(stdout, "mckey: starting %s\n", who)
	err := mckey(ctx, &o)
	fmt.Fprintln(stdout, "test complete")
	if err != nil {
		fmt.Fprintln(stdout, "return status 1")
		return err
	}
	fmt.Fprintln(stdout, "return status 0")
	return nil
}

type mcNode struct {
	o   *mckeyOpts
	id  *cm.ID
	ctx *uverbs.Context
	pd  *uverbs.PD
	mem *mr.Memory
	mr  *mr.MR
	cq  *cq.CQ
	qp  *qp.QP
	ah  *uverbs.AH
}

func (n *mcNode) close() {
	if n.ah != nil {
		n.ah.Close()
	}
	n.id.Close() // leaves the group, destroys the QP
	if n.ctx != nil {
		n.ctx.Close()
	}
	if n.mem != nil {
		n.mem.Close()
	}
}

func mckey(ctx context.Context, o *mckeyOpts) error {
	group, err := resolveHost(o.group)
	if err != nil {
		return err
	}
	var src netip.Addr
	if o.bind != "" {
		if src, err = resolveHost(o.bind); err != nil {
			return err
		}
	}
	fmt.Fprintln(o.stdout, "mckey: joining")
	ch, err := cm.Open()
	if err != nil {
		return err
	}
	defer ch.Close()
	id, err := ch.CreateID(cm.UDP)
	if err != nil {
		return err
	}
	n := &mcNode{o: o, id: id}
	defer n.close()
	if src.IsValid() {
		if err := id.Bind(netip.AddrPortFrom(src, 0)); err != nil {
			return fmt.Errorf("addr bind failure: %w", err)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second) // mckey's 2000 ms
	err = id.ResolveAddr(rctx, src, netip.AddrPortFrom(group, 0))
	cancel()
	if err != nil {
		return fmt.Errorf("resolve addr failure: %w", err)
	}
	if err := n.setup(); err != nil {
		return err
	}
	m, err := id.JoinMulticast(ctx, group, cm.JoinOptions{SendOnly: o.sendOnly})
	if err != nil {
		return fmt.Errorf("failure joining: %w", err)
	}
	fmt.Fprintf(o.stdout, "mckey: joined dgid: %s mlid 0x%x sl %d\n", ntopGID(m.MGID()), m.MLID, m.AH.SL)
	if n.ah, err = n.pd.CreateAH(m.AH); err != nil {
		return fmt.Errorf("failure creating address handle: %w", err)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(mckeyPause):
	}
	if o.count > 0 {
		if o.sender {
			fmt.Fprintln(o.stdout, "initiating data transfers")
			err = n.send(ctx, m)
		} else {
			fmt.Fprintln(o.stdout, "receiving data transfers")
			err = n.receive(ctx)
		}
		if err != nil {
			return err
		}
		fmt.Fprintln(o.stdout, "data transfers complete")
	}
	if err := id.LeaveMulticast(group); err != nil {
		return fmt.Errorf("failure leaving: %w", err)
	}
	return nil
}

// ntopGID prints a GID as inet_ntop(AF_INET6) does (::ffff:a.b.c.d).
func ntopGID(g net.IP) string {
	if v4 := g.To4(); v4 != nil && len(g) == net.IPv6len {
		return "::ffff:" + v4.String()
	}
	return g.String()
}

func (n *mcNode) setup() error {
	o := n.o
	name, _, err := n.id.Device()
	if err != nil {
		return err
	}
	if n.ctx, err = uverbs.Open(name); err != nil {
		return err
	}
	if n.pd, err = n.ctx.AllocPD(); err != nil {
		return fmt.Errorf("unable to allocate PD: %w", err)
	}
	wrs := max(o.count, 1)
	if n.cq, err = cq.Create(n.ctx, 2*wrs); err != nil {
		return fmt.Errorf("unable to create CQ: %w", err)
	}
	if n.qp, err = n.id.CreateQP(n.pd, qp.Config{SendCQ: n.cq, RecvCQ: n.cq, MaxSendWR: uint32(wrs), MaxRecvWR: uint32(wrs)}); err != nil {
		return fmt.Errorf("unable to create QP: %w", err)
	}
	if o.count > 0 && o.size > n.qp.MaxUDPayload() {
		return fmt.Errorf("message_size %d is larger than active mtu %d", o.size, n.qp.MaxUDPayload())
	}
	if o.count == 0 {
		return nil
	}
	if n.mem, err = mr.Alloc(o.size + qp.GRHSize); err != nil {
		return err
	}
	if n.mr, err = mr.Register(n.pd, n.mem.Bytes(), mr.LocalWrite); err != nil {
		return fmt.Errorf("failed to reg MR: %w", err)
	}
	if o.sender {
		b := n.mem.Bytes()[:o.size]
		for i := range b {
			b[i] = byte(i)
		}
		return nil
	}
	g, _ := n.mr.SGE(0, o.size+qp.GRHSize)
	for i := 0; i < o.count; i++ {
		if err := n.qp.PostRecv([]qp.RecvWR{{ID: uint64(i), SGEs: []qp.SGE{g}}}); err != nil {
			return fmt.Errorf("failed to post receives: %w", err)
		}
	}
	return nil
}

// send posts count datagrams to the group; the last one is signaled and
// waited for, so that all have left before the group is left.
func (n *mcNode) send(ctx context.Context, m *cm.Multicast) error {
	g, _ := n.mr.SGE(0, n.o.size)
	for i := 0; i < n.o.count; i++ {
		var f qp.SendFlags
		if i == n.o.count-1 {
			f = qp.Signaled
		}
		if err := n.qp.PostSend([]qp.SendWR{{ID: uint64(i), Opcode: qp.OpSendWithImm, Flags: f, Imm: n.qp.QPN(),
			SGEs: []qp.SGE{g}, AH: n.ah.Provider(), RemoteQPN: m.QPN, RemoteQKey: m.QKey}}); err != nil {
			return fmt.Errorf("failed to post sends: %w", err)
		}
	}
	_, err := n.wait(ctx, 1, provider.WCSend)
	return err
}

// receive waits for count datagrams and reports them.
func (n *mcNode) receive(ctx context.Context) error {
	from, err := n.wait(ctx, n.o.count, provider.WCRecv)
	if err != nil {
		return err
	}
	fmt.Fprintf(n.o.stdout, "mckey: received %d messages of %d bytes from %s\n", n.o.count, n.o.size, from)
	return nil
}

// wait takes count completions of kind op; for receives it checks the
// size and returns the sender's GID from the first GRH.
func (n *mcNode) wait(ctx context.Context, count int, op provider.WCOpcode) (string, error) {
	wc := make([]cq.WC, 8)
	idle := time.Now()
	from := ""
	for done := 0; done < count; {
		k, err := n.cq.Poll(wc)
		if err != nil {
			return "", fmt.Errorf("failed polling CQ: %w", err)
		}
		for _, w := range wc[:k] {
			if err := w.Err(); err != nil {
				return "", err
			}
			if w.Opcode != op {
				continue
			}
			if op == provider.WCRecv {
				if int(w.ByteLen) != qp.GRHSize+n.o.size {
					return "", fmt.Errorf("datagram %d: %d bytes, want %d (%d and the GRH)", done, w.ByteLen, qp.GRHSize+n.o.size, n.o.size)
				}
				if from == "" {
					if grh, err := qp.ParseGRH(n.mem.Bytes()[:qp.GRHSize]); err == nil {
						from = ntopGID(grh.SGID)
					}
				}
			}
			done++
		}
		if k > 0 {
			idle = time.Now()
			continue
		}
		if time.Since(idle) > n.o.idle {
			return "", fmt.Errorf("%d of %d datagrams, none for %v", done, count, n.o.idle)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(50 * time.Microsecond):
		}
	}
	return from, nil
}
