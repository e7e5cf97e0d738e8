package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/uverbs/provider"
)

// udaddy, wire compatible with rdma-core's librdmacm/examples/udaddy.c for
// one connection: the client resolves the server (port 7174, fixed there
// too), sends a SIDR request on the UDP port space, makes an AH from the
// reply and sends -C datagrams of -S bytes as SEND_WITH_IMM whose
// immediate is its QPN; the server counts them, makes its reply AH from the
// first one's GRH and sends as many back to that QPN.

const udaddyPort = 7174

type udaddyOpts struct {
	server, bind string
	count, size  int
	stdout       io.Writer
}

func runUdaddy(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("udaddy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o udaddyOpts
	fs.StringVar(&o.server, "s", "", "server address (client mode); without it, serve")
	fs.StringVar(&o.bind, "b", "", "bind address")
	fs.IntVar(&o.count, "C", 10, "message count")
	fs.IntVar(&o.size, "S", 100, "message size")
	conns := fs.Int("c", 1, "connections (only 1)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &exitError{code: 2}
	}
	switch {
	case fs.NArg() > 0:
		return usageError("unexpected arguments %q", fs.Args())
	case *conns != 1:
		return usageError("-c %d: goverbs udaddy makes one connection", *conns)
	case o.count < 1 || o.count > 4096:
		return usageError("invalid message count %d (1..4096)", o.count)
	case o.size < 1:
		return usageError("invalid message size %d", o.size)
	case o.server == "" && o.bind == "":
		return usageError("the server needs -b (the address to bind)")
	}
	o.stdout = stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if o.server != "" {
		fmt.Fprintln(stdout, "udaddy: starting client")
		err = udaddyClient(ctx, &o)
	} else {
		fmt.Fprintln(stdout, "udaddy: starting server")
		err = udaddyServer(ctx, &o)
	}
	fmt.Fprintln(stdout, "test complete")
	if err != nil {
		fmt.Fprintln(stdout, "return status 1")
		return err
	}
	fmt.Fprintln(stdout, "return status 0")
	return nil
}

type udNode struct {
	o    *udaddyOpts
	id   *cm.ID
	ctx  *uverbs.Context
	pd   *uverbs.PD
	mem  *mr.Memory
	mr   *mr.MR
	cq   *cq.CQ
	qp   *qp.QP
	ah   *uverbs.AH
	qpn  uint32
	qkey uint32
	wc   []cq.WC
}

func udSetup(o *udaddyOpts, id *cm.ID) (*udNode, error) {
	name, _, err := id.Device()
	if err != nil {
		return nil, err
	}
	n := &udNode{o: o, id: id, wc: make([]cq.WC, 8)}
	if n.ctx, err = uverbs.Open(name); err != nil {
		return nil, err
	}
	fail := func(err error) (*udNode, error) { n.close(); return nil, err }
	if n.pd, err = n.ctx.AllocPD(); err != nil {
		return fail(err)
	}
	if n.mem, err = mr.Alloc(o.size + qp.GRHSize); err != nil {
		return fail(err)
	}
	if n.mr, err = mr.Register(n.pd, n.mem.Bytes(), mr.LocalWrite); err != nil {
		return fail(err)
	}
	if n.cq, err = cq.Create(n.ctx, 2*o.count); err != nil {
		return fail(err)
	}
	if n.qp, err = id.CreateQP(n.pd, qp.Config{SendCQ: n.cq, RecvCQ: n.cq, MaxSendWR: uint32(o.count), MaxRecvWR: uint32(o.count)}); err != nil {
		return fail(err)
	}
	if o.size > n.qp.MaxUDPayload() {
		return fail(fmt.Errorf("message_size %d is larger than active mtu %d", o.size, n.qp.MaxUDPayload()))
	}
	g, _ := n.mr.SGE(0, o.size+qp.GRHSize)
	for i := 0; i < o.count; i++ {
		if err := n.qp.PostRecv([]qp.RecvWR{{ID: uint64(i), SGEs: []qp.SGE{g}}}); err != nil {
			return fail(err)
		}
	}
	return n, nil
}

func (n *udNode) close() {
	if n.ah != nil {
		n.ah.Close()
	}
	n.id.Close()
	if n.ctx != nil {
		n.ctx.Close()
	}
	if n.mem != nil {
		n.mem.Close()
	}
}

func (n *udNode) send(signaled bool) error {
	g, _ := n.mr.SGE(0, n.o.size)
	var f qp.SendFlags
	if signaled {
		f = qp.Signaled
	}
	for i := 0; i < n.o.count; i++ {
		if err := n.qp.PostSend([]qp.SendWR{{ID: uint64(i), Opcode: qp.OpSendWithImm, Flags: f, Imm: n.qp.QPN(),
			SGEs: []qp.SGE{g}, AH: n.ah.Provider(), RemoteQPN: n.qpn, RemoteQKey: n.qkey}}); err != nil {
			return fmt.Errorf("failed to post sends: %w", err)
		}
	}
	return nil
}

// poll waits for count completions; the first receive, when there is no AH
// yet, gives the reply AH (udaddy's create_reply_ah).
func (n *udNode) poll(ctx context.Context) error {
	idle := time.Now()
	for done := 0; done < n.o.count; {
		k, err := n.cq.Poll(n.wc)
		if err != nil {
			return fmt.Errorf("failed polling CQ: %w", err)
		}
		for i := 0; i < k; i++ {
			w := n.wc[i]
			if err := w.Err(); err != nil {
				return err
			}
			if n.ah == nil && w.Opcode == provider.WCRecv {
				grh, err := qp.ParseGRH(n.mem.Bytes()[:qp.GRHSize])
				if err != nil {
					return fmt.Errorf("failed to create reply AH: %w", err)
				}
				if n.ah, err = n.pd.CreateAH(uverbs.AHAttr{DGID: grh.SGID, HopLimit: 64}); err != nil {
					return fmt.Errorf("failed to create reply AH: %w", err)
				}
				n.qpn = w.Imm
				a, _, err := n.id.InitQPAttr(qp.Init)
				if err != nil {
					return err
				}
				n.qkey = a.QKey
			}
		}
		done += k
		if k > 0 {
			idle = time.Now()
			continue
		}
		if time.Since(idle) > 30*time.Second {
			return fmt.Errorf("%d of %d completions, none for 30 s", done, n.o.count)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Microsecond):
		}
	}
	return nil
}

func udaddyClient(ctx context.Context, o *udaddyOpts) error {
	fmt.Fprintln(o.stdout, "udaddy: connecting")
	ch, id, err := cmResolve(ctx, cm.UDP, o.server, udaddyPort, o.bind)
	if err != nil {
		return err
	}
	defer ch.Close()
	n, err := udSetup(o, id)
	if err != nil {
		id.Close()
		return err
	}
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
	ch, lis, _, err := cmListen(cm.UDP, o.bind, udaddyPort, 1)
	if err != nil {
		return err
	}
	defer ch.Close()
	req, err := lis.GetRequest(ctx)
	if err != nil {
		return err
	}
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
