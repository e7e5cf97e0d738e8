package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/wr"
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
	cmOpts
	group     string
	groupAddr netip.Addr // group resolved: a multicast address
	sender    bool
	sendOnly  bool
	idle      time.Duration
}

func runMckey(args []string, stdout, stderr io.Writer) error {
	o, err := parseMckey(args, stderr)
	if err != nil {
		return err
	}
	o.stdout = stdout
	return cmRun(stdout, "mckey", o, o.sender, mckey, mckey)
}

// parseMckey parses and checks mckey's command line, resolving -m (which
// must be a multicast address) and -b.
func parseMckey(args []string, stderr io.Writer) (*mckeyOpts, error) {
	o := &mckeyOpts{}
	fs, conns := cmFlags("mckey", stderr, &o.cmOpts)
	fs.StringVar(&o.group, "m", "", "multicast address (IPv4 224.0.0.0/4 or IPv6 ff00::/8)")
	fs.BoolVar(&o.sender, "s", false, "send (without it, receive)")
	fs.BoolVar(&o.sendOnly, "o", false, "join as a send-only full member")
	ps := fs.String("p", "0x111", "port space (only 0x111, UDP)")
	fs.DurationVar(&o.idle, "idle", 30*time.Second, "give up receiving after this long without a datagram (mckey waits forever)")
	if err := cmParse(fs, args); err != nil {
		return nil, err
	}
	psv, perr := strconv.ParseUint(*ps, 0, 16)
	switch {
	case o.group == "":
		return nil, usageError("-m multicast_address is required")
	case *conns != 1:
		return nil, usageError("-c %d: goverbs mckey makes one join", *conns)
	case perr != nil || psv != ioctl.RDMA_PS_UDP:
		return nil, usageError("-p %s: only the UDP port space (%#x) is supported (IPoIB is not)", *ps, ioctl.RDMA_PS_UDP)
	case o.count < 0 || o.count > 4096:
		return nil, usageError("-C %d: invalid message count (0..4096)", o.count)
	case o.size < 0:
		return nil, usageError("-S %d: invalid message size (0 or more; at most the path MTU)", o.size)
	case o.idle <= 0:
		return nil, usageError("-idle %v: must be positive", o.idle)
	case o.sendOnly && !o.sender:
		// A send-only member receives nothing from the group: the
		// receiver would wait out -idle and fail.
		return nil, usageError("-o: a send-only join receives nothing; it goes with -s")
	}
	var err error
	if o.groupAddr, err = hostFlag("-m", "multicast address", o.group); err != nil {
		return nil, err
	}
	if !o.groupAddr.IsMulticast() {
		// A unicast group failed the join later, or waited for it.
		it := ""
		if o.groupAddr.String() != o.group {
			it = fmt.Sprintf("it is %v; ", o.groupAddr)
		}
		return nil, usageError("-m %q: not a multicast address (%swant IPv4 224.0.0.0/4 or IPv6 ff00::/8)", o.group, it)
	}
	if _, err := o.resolve(""); err != nil {
		return nil, err
	}
	if o.size == 0 {
		o.count = 0 // as mckey
	}
	return o, nil
}

type mcNode struct {
	cmNode
	o  *mckeyOpts
	cq *cq.CQ
}

func mckey(ctx context.Context, o *mckeyOpts) error {
	group, src := o.groupAddr, o.bindAddr
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
	n := &mcNode{o: o}
	n.id = id
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
	if err := n.open(n.id); err != nil {
		return err
	}
	wrs := max(o.count, 1)
	var err error
	if n.cq, err = cq.Create(n.ctx, 2*wrs); err != nil {
		return fmt.Errorf("unable to create CQ: %w", err)
	}
	if err := n.createQP(qp.Config{SendCQ: n.cq, RecvCQ: n.cq, MaxSendWR: uint32(wrs), MaxRecvWR: uint32(wrs)}); err != nil {
		return err
	}
	if o.count > 0 && o.size > n.qp.MaxUDPayload() {
		return fmt.Errorf("message_size %d is larger than active mtu %d", o.size, n.qp.MaxUDPayload())
	}
	if o.count == 0 {
		return nil
	}
	if o.sender {
		return n.alloc(o.size+qp.GRHSize, o.size)
	}
	if err := n.alloc(o.size+qp.GRHSize, 0); err != nil {
		return err
	}
	return n.postRecvs(o.count, o.size+qp.GRHSize)
}

// send posts count datagrams to the group; the last one is signaled and
// waited for, so that all have left before the group is left.
func (n *mcNode) send(ctx context.Context, m *cm.Multicast) error {
	if err := n.postUD(n.o.count, n.o.size, m.QPN, m.QKey, func(i int) bool { return i == n.o.count-1 }); err != nil {
		return err
	}
	_, err := n.wait(ctx, 1, wr.WCSend)
	return err
}

// receive waits for count datagrams and reports them.
func (n *mcNode) receive(ctx context.Context) error {
	from, err := n.wait(ctx, n.o.count, wr.WCRecv)
	if err != nil {
		return err
	}
	fmt.Fprintf(n.o.stdout, "mckey: received %d messages of %d bytes from %s\n", n.o.count, n.o.size, from)
	return nil
}

// wait takes count completions of kind op; for receives it checks the
// size and returns the sender's GID from the first GRH.
func (n *mcNode) wait(ctx context.Context, count int, op wr.WCOpcode) (string, error) {
	from := ""
	err := cmPoll(ctx, n.cq, count, n.o.idle, "datagrams", func(w cq.WC, done int) (bool, error) {
		if err := w.Err(); err != nil {
			return false, err
		}
		if w.Opcode != op {
			return false, nil
		}
		if op == wr.WCRecv {
			if int(w.ByteLen) != qp.GRHSize+n.o.size {
				return false, fmt.Errorf("datagram %d: %d bytes, want %d (%d and the GRH)", done, w.ByteLen, qp.GRHSize+n.o.size, n.o.size)
			}
			if from == "" {
				if grh, err := qp.ParseGRH(n.mem.Bytes()[:qp.GRHSize]); err == nil {
					from = ntopGID(grh.SGID)
				}
			}
		}
		return true, nil
	})
	if err != nil {
		return "", err
	}
	return from, nil
}
