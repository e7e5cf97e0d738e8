package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/wr"
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
	cmOpts
	server     string
	serverAddr netip.Addr // server resolved
	port       int
	idle       time.Duration
}

func runUcmatose(args []string, stdout, stderr io.Writer) error {
	var o ucmatoseOpts
	fs, conns := cmFlags("ucmatose", stderr, &o.cmOpts)
	fs.StringVar(&o.server, "s", "", "server address (client mode); without it, serve")
	fs.IntVar(&o.port, "p", ucmatosePort, "port number")
	ps := fs.String("P", "tcp", "port space (only tcp)")
	format := fs.String("f", "name", "address format (name or ip; both are parsed the same way)")
	tos := fs.String("t", "", "type of service (not supported)")
	ack := fs.String("a", "", "ack timeout (not supported)")
	migrate := fs.Bool("m", false, "migrate to a new event channel (not supported)")
	fs.DurationVar(&o.idle, "idle", 30*time.Second, "give up after this long without a completion (ucmatose waits forever)")
	if err := cmParse(fs, args); err != nil {
		return err
	}
	switch {
	case *conns != 1:
		return usageError("-c %d: goverbs ucmatose makes one connection", *conns)
	case !strings.HasPrefix(strings.ToLower(*ps), "tcp"):
		return usageError("-P %s: only the tcp port space is supported", *ps)
	case *tos != "" || *ack != "" || *migrate:
		return usageError("-t, -a and -m need rdma_cm options and ID migration, which goverbs' cm does not have")
	case o.count < 0 || o.count > 4096:
		return usageError("-C %d: invalid message count (0..4096)", o.count)
	case o.size < 0 || o.size > 1<<20:
		return usageError("-S %d: invalid message size (0..1048576)", o.size)
	case o.port <= 0 || o.port > 65535:
		return usageError("-p %d: invalid port (1..65535)", o.port)
	case o.idle <= 0:
		return usageError("-idle %v: must be positive", o.idle)
	case !strings.HasPrefix(strings.ToLower(*format), "name") && !strings.HasPrefix(strings.ToLower(*format), "ip"):
		// cmatose takes "ip" and "name" by prefix, and "gid" (AF_IB).
		return usageError("-f %q: address format must be name or ip (gid, AF_IB, is not supported)", *format)
	}
	var err error
	if o.serverAddr, err = o.resolve(o.server); err != nil {
		return err
	}
	if o.size == 0 {
		o.count = 0 // as cmatose
	}
	o.stdout = stdout
	return cmRun(stdout, "cmatose", &o, o.server != "", ucmatoseClient, ucmatoseServer)
}

type toseNode struct {
	cmNode
	o              *ucmatoseOpts
	sendCQ, recvCQ *cq.CQ
}

func toseSetup(o *ucmatoseOpts, id *cm.ID) (*toseNode, error) {
	n := &toseNode{o: o}
	fail := func(err error) (*toseNode, error) { n.close(); return nil, err }
	if err := n.open(id); err != nil {
		return fail(err)
	}
	cqe := max(o.count, 1)
	var err error
	if n.sendCQ, err = cq.Create(n.ctx, cqe); err == nil {
		n.recvCQ, err = cq.Create(n.ctx, cqe)
	}
	if err != nil {
		return fail(fmt.Errorf("unable to create CQ: %w", err))
	}
	if err := n.createQP(qp.Config{SendCQ: n.sendCQ, RecvCQ: n.recvCQ, MaxSendWR: uint32(cqe), MaxRecvWR: uint32(cqe), SignalAll: true}); err != nil {
		return fail(err)
	}
	if o.count == 0 {
		return n, nil
	}
	if err := n.alloc(o.size, o.size); err != nil {
		return fail(err)
	}
	if err := n.postRecvs(o.count, o.size); err != nil {
		return fail(err)
	}
	return n, nil
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
	return cmPoll(ctx, c, n.o.count, n.o.idle, what+"s", func(w cq.WC, done int) (bool, error) {
		if err := w.Err(); err != nil {
			return false, fmt.Errorf("%s %d: %w", what, done, err)
		}
		if w.Opcode == wr.WCRecv && int(w.ByteLen) != n.o.size {
			return false, fmt.Errorf("%s %d: %d bytes, want %d", what, done, w.ByteLen, n.o.size)
		}
		return true, nil
	})
}

func ucmatoseServer(ctx context.Context, o *ucmatoseOpts) error {
	ch, req, err := cmFirstRequest(ctx, cm.TCP, o.bindAddr, uint16(o.port))
	if err != nil {
		return err
	}
	defer ch.Close()
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
	ch, id, n, err := cmResolveSetup(ctx, cm.TCP, o.serverAddr, uint16(o.port), o.bindAddr, o, toseSetup)
	if err != nil {
		return err
	}
	defer ch.Close()
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
