package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/wr"
)

// udaddy, wire compatible with rdma-core's librdmacm/examples/udaddy.c for
// one connection: the client resolves the server (port 7174, fixed there
// too), sends a SIDR request on the UDP port space, makes an AH from the
// reply and sends -C datagrams of -S bytes as SEND_WITH_IMM whose
// immediate is its QPN; the server counts them, makes its reply AH from the
// first one's GRH and sends as many back to that QPN.

const udaddyPort = 7174

type udaddyOpts struct {
	cmOpts
	server     string
	serverAddr netip.Addr // server resolved
}

func runUdaddy(args []string, stdout, stderr io.Writer) error {
	var o udaddyOpts
	fs, conns := cmFlags("udaddy", stderr, &o.cmOpts)
	fs.StringVar(&o.server, "s", "", "server address (client mode); without it, serve")
	if err := cmParse(fs, args); err != nil {
		return err
	}
	switch {
	case *conns != 1:
		return usageError("-c %d: goverbs udaddy makes one connection", *conns)
	case o.count < 1 || o.count > 4096:
		return usageError("-C %d: invalid message count (1..4096)", o.count)
	case o.size < 1:
		return usageError("-S %d: invalid message size (at least 1; at most the path MTU)", o.size)
	case o.server == "" && o.bind == "":
		return usageError("the server needs -b (the address to bind)")
	}
	var err error
	if o.serverAddr, err = o.resolve(o.server); err != nil {
		return err
	}
	o.stdout = stdout
	return cmRun(stdout, "udaddy", &o, o.server != "", udaddyClient, udaddyServer)
}

type udNode struct {
	cmNode
	o    *udaddyOpts
	cq   *cq.CQ
	qpn  uint32
	qkey uint32
}

func udSetup(o *udaddyOpts, id *cm.ID) (*udNode, error) {
	n := &udNode{o: o}
	fail := func(err error) (*udNode, error) { n.close(); return nil, err }
	if err := n.open(id); err != nil {
		return fail(err)
	}
	var err error
	if n.cq, err = cq.Create(n.ctx, 2*o.count); err != nil {
		return fail(fmt.Errorf("unable to create CQ: %w", err))
	}
	if err := n.createQP(qp.Config{SendCQ: n.cq, RecvCQ: n.cq, MaxSendWR: uint32(o.count), MaxRecvWR: uint32(o.count)}); err != nil {
		return fail(err)
	}
	if o.size > n.qp.MaxUDPayload() {
		return fail(fmt.Errorf("message_size %d is larger than active mtu %d", o.size, n.qp.MaxUDPayload()))
	}
	if err := n.alloc(o.size+qp.GRHSize, 0); err != nil {
		return fail(err)
	}
	if err := n.postRecvs(o.count, o.size+qp.GRHSize); err != nil {
		return fail(err)
	}
	return n, nil
}

func (n *udNode) send(signaled bool) error {
	return n.postUD(n.o.count, n.o.size, n.qpn, n.qkey, func(int) bool { return signaled })
}

// poll waits for count completions; the first receive, when there is no AH
// yet, gives the reply AH (udaddy's create_reply_ah).
func (n *udNode) poll(ctx context.Context) error {
	return cmPoll(ctx, n.cq, n.o.count, 30*time.Second, "completions", func(w cq.WC, _ int) (bool, error) {
		if err := w.Err(); err != nil {
			return false, err
		}
		if n.ah == nil && w.Opcode == wr.WCRecv {
			grh, err := qp.ParseGRH(n.mem.Bytes()[:qp.GRHSize])
			if err != nil {
				return false, fmt.Errorf("failed to create reply AH: %w", err)
			}
			if n.ah, err = n.pd.CreateAH(uverbs.AHAttr{DGID: grh.SGID, HopLimit: 64}); err != nil {
				return false, fmt.Errorf("failed to create reply AH: %w", err)
			}
			n.qpn = w.Imm
			a, _, err := n.id.InitQPAttr(qp.Init)
			if err != nil {
				return false, err
			}
			n.qkey = a.QKey
		}
		return true, nil
	})
}

func udaddyClient(ctx context.Context, o *udaddyOpts) error {
	fmt.Fprintln(o.stdout, "udaddy: connecting")
	ch, id, n, err := cmResolveSetup(ctx, cm.UDP, o.serverAddr, udaddyPort, o.bindAddr, o, udSetup)
	if err != nil {
		return err
	}
	defer ch.Close()
	defer n.close()
	ev, err := id.Connect(ctx, cm.ConnParam{})
	if err != nil {
		return err
	}
	if ev.AH == nil {
		return errors.New("the SIDR reply carries no address")
	}
	if n.ah, err = n.pd.CreateAH(*ev.AH); err != nil {
		return fmt.Errorf("failure creating address handle: %w", err)
	}
	n.qpn, n.qkey = ev.QPN, ev.QKey
	fmt.Fprintln(o.stdout, "initiating data transfers")
	if err := n.send(false); err != nil {
		return err
	}
	fmt.Fprintln(o.stdout, "receiving data transfers")
	if err := n.poll(ctx); err != nil {
		return err
	}
	fmt.Fprintln(o.stdout, "data transfers complete")
	return nil
}

func udaddyServer(ctx context.Context, o *udaddyOpts) error {
	ch, req, err := cmFirstRequest(ctx, cm.UDP, o.bindAddr, udaddyPort)
	if err != nil {
		return err
	}
	defer ch.Close()
	n, err := udSetup(o, req.ID)
	if err != nil {
		req.ID.Reject(nil, 0)
		req.ID.Close()
		return err
	}
	defer n.close()
	if _, err := req.ID.Accept(ctx, cm.ConnParam{}); err != nil {
		return fmt.Errorf("failure accepting: %w", err)
	}
	fmt.Fprintln(o.stdout, "receiving data transfers")
	if err := n.poll(ctx); err != nil {
		return err
	}
	fmt.Fprintln(o.stdout, "sending replies")
	if err := n.send(true); err != nil {
		return err
	}
	if err := n.poll(ctx); err != nil {
		return err
	}
	fmt.Fprintln(o.stdout, "data transfers complete")
	return nil
}
