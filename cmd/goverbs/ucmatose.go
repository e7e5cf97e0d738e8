package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/uverbs/provider"
)

// ucmatose, wire compatible with rdma-core's librdmacm/examples/cmatose.c
// (installed as ucmatose) for one connection on the TCP port space: the
// client resolves the server (port 7471), posts -C receives of -S bytes and
// connects (responder resources 1, initiator depth 1, retry count 5); the
// server posts as many receives, accepts with what the request offered,
// sends -C messages, waits for their completions and for -C messages back,
// then disconnects; the client receives the server's messages, sends as
// many back and answers the disconnect.

const ucmatosePort = 7471

type ucmatoseOpts struct {
	server, bind string
	port         int
	count, size  int
	idle         time.Duration
	stdout       io.Writer
}

func runUcmatose(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ucmatose", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o ucmatoseOpts
	fs.StringVar(&o.server, "s", "", "server address (client mode); without it, serve")
	fs.StringVar(&o.bind, "b", "", "bind address")
	fs.IntVar(&o.count, "C", 10, "message count")
	fs.IntVar(&o.size, "S", 100, "message size")
	fs.IntVar(&o.port, "p", ucmatosePort, "port number")
	conns := fs.Int("c", 1, "connections (only 1)")
	ps := fs.String("P", "tcp", "port space (only tcp)")
	fs.String("f", "name", "address format (name or ip; both are parsed the same way)")
	tos := fs.String("t", "", "type of service (not supported)")
	ack := fs.String("a", "", "ack timeout (not supported)")
	migrate := fs.Bool("m", false, "migrate to a new event channel (not supported)")
	fs.DurationVar(&o.idle, "idle", 30*time.Second, "give up after this long without a completion (ucmatose waits forever)")
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
		return usageError("-c %d: goverbs ucmatose makes one connection", *conns)
	case !strings.HasPrefix(strings.ToLower(*ps), "tcp"):
		return usageError("-P %s: only the tcp port space is supported", *ps)
	case *tos != "" || *ack != "" || *migrate:
		return usageError("-t, -a and -m need rdma_cm options and ID migration, which goverbs' cm does not have")
	case o.count < 0 || o.count > 4096:
		return usageError("invalid message count %d (0..4096)", o.count)
	case o.size < 0 || o.size > 1<<20:
		return usageError("invalid message size %d (0..1048576)", o.size)
	case o.port <= 0 || o.port > 65535:
		return usageError("invalid port %d", o.port)
	case o.idle <= 0:
		return usageError("invalid -idle %v", o.idle)
	}
	if o.size == 0 {
		o.count = 0 // as cmatose
	}
	o.stdout = stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if o.server != "" {
		fmt.Fprintln(stdout, "cmatose: starting client")
		err = ucmatoseClient(ctx, &o)
	} else {
		fmt.Fprintln(stdout, "cmatose: starting server")
		err = ucmatoseServer(ctx, &o)
	}
	fmt.Fprintln(stdout, "test complete")
	if err != nil {
		fmt.Fprintln(stdout, "return status 1")
		return err
	}
	fmt.Fprintln(stdout, "return status 0")
	return nil
}

type toseNode struct {
	o              *ucmatoseOpts
	id             *cm.ID
	ctx            *uverbs.Context
	pd             *uverbs.PD
	mem            *mr.Memory
	mr             *mr.MR
	sendCQ, recvCQ *cq.CQ
	qp             *qp.QP
}

func toseSetup(o *ucmatoseOpts, id *cm.ID) (*toseNode, error) {
	name, _, err := id.Device()
	if err != nil {
		return nil, err
	}
	n := &toseNode{o: o, id: id}
	if n.ctx, err = uverbs.Open(name); err != nil {
		return nil, err
	}
	fail := func(err error) (*toseNode, error) { n.close(); return nil, err }
	if n.pd, err = n.ctx.AllocPD(); err != nil {
		return fail(fmt.Errorf("unable to allocate PD: %w", err))
	}
	cqe := max(o.count, 1)
	if n.sendCQ, err = cq.Create(n.ctx, cqe); err == nil {
		n.recvCQ, err = cq.Create(n.ctx, cqe)
	}
	if err != nil {
		return fail(fmt.Errorf("unable to create CQ: %w", err))
	}
	if n.qp, err = id.CreateQP(n.pd, qp.Config{SendCQ: n.sendCQ, RecvCQ: n.recvCQ, MaxSendWR: uint32(cqe), MaxRecvWR: uint32(cqe), SignalAll: true}); err != nil {
		return fail(fmt.Errorf("unable to create QP: %w", err))
	}
	if o.count == 0 {
		return n, nil
	}
	if n.mem, err = mr.Alloc(o.size); err != nil {
		return fail(err)
	}
	if n.mr, err = mr.Register(n.pd, n.mem.Bytes(), mr.LocalWrite); err != nil {
		return fail(fmt.Errorf("failed to reg MR: %w", err))
	}
	b := n.mem.Bytes()[:o.size]
	for i := range b {
		b[i] = byte(i)
	}
	g, _ := n.mr.SGE(0, o.size)
	for i := 0; i < o.count; i++ {
		if err := n.qp.PostRecv([]qp.RecvWR{{ID: uint64(i), SGEs: []qp.SGE{g}}}); err != nil {
			return fail(fmt.Errorf("failed to post receives: %w", err))
		}
	}
	return n, nil
}

func (n *toseNode) close() {
	n.id.Close() // the QP, then the kernel ID
	if n.ctx != nil {
		n.ctx.Close()
	}
	if n.mem != nil {
		n.mem.Close()
	}
}

func (n *toseNode) send() error {
	g, _ := n.mr.SGE(0, n.o.size)
	for i := 0; i < n.o.count; i++ {
		if err := n.qp.PostSend([]qp.SendWR{{ID: uint64(i), Opcode: qp.OpSend, SGEs: []qp.SGE{g}}}); err != nil {
			return fmt.Errorf("failed to post sends: %w", err)
		}
	}
	return nil
}

// poll takes count successful completions off c; receives must carry
// -S bytes.
func (n *toseNode) poll(ctx context.Context, c *cq.CQ, what string) error {
	wc := make([]cq.WC, 8)
	idle := time.Now()
	for done := 0; done < n.o.count; {
		k, err := c.Poll(wc)
		if err != nil {
			return fmt.Errorf("failed polling CQ: %w", err)
		}
		for _, w := range wc[:k] {
			if err := w.Err(); err != nil {
				return fmt.Errorf("%s %d: %w", what, done, err)
			}
			if w.Opcode == provider.WCRecv && int(w.ByteLen) != n.o.size {
				return fmt.Errorf("%s %d: %d bytes, want %d", what, done, w.ByteLen, n.o.size)
			}
			done++
		}
		if k > 0 {
			idle = time.Now()
			continue
		}
		if time.Since(idle) > n.o.idle {
			return fmt.Errorf("%d of %d %ss, none for %v", done, n.o.count, what, n.o.idle)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Microsecond):
		}
	}
	return nil
}

func ucmatoseServer(ctx context.Context, o *ucmatoseOpts) error {
	ch, lis, _, err := cmListen(cm.TCP, o.bind, uint16(o.port), 1)
	if err != nil {
		return err
	}
	defer ch.Close()
	req, err := lis.GetRequest(ctx)
	if err != nil {
		return err
	}
	n, err := toseSetup(o, req.ID)
	if err != nil {
		fmt.Fprintln(o.stdout, "cmatose: failing connection request")
		req.ID.Reject(nil, 0)
		req.ID.Close()
		return err
	}
	defer n.close()
	// rdma_accept(id, NULL): the request's offer, turned around.
	p := cm.ConnParam{ResponderResources: max(req.InitiatorDepth, 1), InitiatorDepth: max(req.ResponderResources, 1)}
	if _, err := req.ID.Accept(ctx, p); err != nil {
		return fmt.Errorf("failure accepting: %w", err)
	}
	if o.count > 0 {
		fmt.Fprintln(o.stdout, "initiating data transfers")
		if err := n.send(); err != nil {
			return err
		}
		fmt.Fprintln(o.stdout, "completing sends")
		if err := n.poll(ctx, n.sendCQ, "send"); err != nil {
			return err
		}
		fmt.Fprintln(o.stdout, "receiving data transfers")
		if err := n.poll(ctx, n.recvCQ, "receive"); err != nil {
			return err
		}
		fmt.Fprintf(o.stdout, "cmatose: received %d messages of %d bytes\n", o.count, o.size)
		fmt.Fprintln(o.stdout, "data transfers complete")
	}
	fmt.Fprintln(o.stdout, "cmatose: disconnecting")
	if err := req.ID.Disconnect(); err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, o.idle)
	defer cancel()
	if err := req.ID.WaitDisconnect(dctx); err != nil {
		return err
	}
	fmt.Fprintln(o.stdout, "disconnected")
	return nil
}

func ucmatoseClient(ctx context.Context, o *ucmatoseOpts) error {
	fmt.Fprintln(o.stdout, "cmatose: connecting")
	ch, id, err := cmResolve(ctx, cm.TCP, o.server, uint16(o.port), o.bind)
	if err != nil {
		return err
	}
	defer ch.Close()
	n, err := toseSetup(o, id)
	if err != nil {
		id.Close()
		return err
	}
	defer n.close()
	if _, err := id.Connect(ctx, cm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 5}); err != nil {
		return fmt.Errorf("failure connecting: %w", err)
	}
	if o.count > 0 {
		fmt.Fprintln(o.stdout, "receiving data transfers")
		if err := n.poll(ctx, n.recvCQ, "receive"); err != nil {
			return err
		}
		fmt.Fprintf(o.stdout, "cmatose: received %d messages of %d bytes\n", o.count, o.size)
		fmt.Fprintln(o.stdout, "sending replies")
		if err := n.send(); err != nil {
			return err
		}
		if err := n.poll(ctx, n.sendCQ, "send"); err != nil {
			return err
		}
		fmt.Fprintln(o.stdout, "data transfers complete")
	}
	// The server disconnects; answer it.
	dctx, cancel := context.WithTimeout(ctx, o.idle)
	defer cancel()
	if err := id.WaitDisconnect(dctx); err != nil {
		return err
	}
	return id.Disconnect()
}
