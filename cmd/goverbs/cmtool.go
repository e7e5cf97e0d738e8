package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

// What the rdma_cm tools (rping, udaddy, ucmatose, mckey) share: the
// active side's resolution, the passive side's listener, the frame of
// their output, the verbs resources on an ID and the completion loop.

// cmResolve opens an event channel, creates an ID in port space ps and
// resolves dst:port (from src, unless it is the zero Addr) and the route
// within rdma-core's tools' 2 s. Closing the channel closes the ID. The
// tools resolve their addresses (hostFlag) as they check their flags.
func cmResolve(ctx context.Context, ps cm.PortSpace, dst netip.Addr, port uint16, src netip.Addr) (*cm.Channel, *cm.ID, error) {
	ch, err := cm.Open()
	if err != nil {
		return nil, nil, err
	}
	id, err := ch.CreateID(ps)
	if err == nil {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second) // the tools' 2000 ms
		if err = id.ResolveAddr(rctx, src, netip.AddrPortFrom(dst, port)); err == nil {
			err = id.ResolveRoute(rctx)
		}
		cancel()
	}
	if err != nil {
		ch.Close()
		return nil, nil, err
	}
	return ch, id, nil
}

// cmResolveSetup is the active side's start in ucmatose and udaddy: the
// ID resolved (cmResolve) and its verbs resources made (setup on o), the
// ID closed if that fails. Closing the channel closes the ID.
func cmResolveSetup[O, N any](ctx context.Context, ps cm.PortSpace, dst netip.Addr, port uint16, src netip.Addr,
	o *O, setup func(*O, *cm.ID) (N, error)) (*cm.Channel, *cm.ID, N, error) {
	var n N
	ch, id, err := cmResolve(ctx, ps, dst, port, src)
	if err != nil {
		return nil, nil, n, err
	}
	if n, err = setup(o, id); err != nil {
		id.Close()
		ch.Close()
		return nil, nil, n, err
	}
	return ch, id, n, nil
}

// cmListen opens an event channel and listens in port space ps on
// bind:port (every address if bind is the zero Addr) with backlog.
// Closing the channel closes the listener.
func cmListen(ps cm.PortSpace, bind netip.Addr, port uint16, backlog int) (*cm.Channel, *cm.ID, netip.AddrPort, error) {
	if !bind.IsValid() {
		bind = netip.IPv4Unspecified()
	}
	at := netip.AddrPortFrom(bind, port)
	ch, err := cm.Open()
	if err != nil {
		return nil, nil, at, err
	}
	lis, err := ch.CreateID(ps)
	if err == nil {
		if err = lis.Bind(at); err == nil {
			err = lis.Listen(backlog)
		}
	}
	if err != nil {
		ch.Close()
		return nil, nil, at, err
	}
	return ch, lis, at, nil
}

// hostFlag resolves s, the value of flag name (as the messages name it:
// "-b"), which is the tool's what ("bind address"). A bad value is a usage
// error naming the flag, the value and what it is for, as the other flag
// errors do, before the tool starts.
func hostFlag(name, what, s string) (netip.Addr, error) {
	a, err := lookupHost(s)
	if err != nil {
		return netip.Addr{}, usageError("%s %q: invalid %s: %v", name, s, what, err)
	}
	return a, nil
}

// cmOpts are the options udaddy, ucmatose and mckey have in common.
type cmOpts struct {
	bind        string
	bindAddr    netip.Addr // bind resolved (resolve); the zero Addr without -b
	count, size int
	stdout      io.Writer
}

// resolve resolves the tools' addresses: server, the client's -s (the
// server's address; "" on the server side), which it returns, and -b, if
// given, into bindAddr.
func (o *cmOpts) resolve(server string) (netip.Addr, error) {
	var dst netip.Addr
	var err error
	if server != "" {
		if dst, err = hostFlag("-s", "server address", server); err != nil {
			return dst, err
		}
	}
	if o.bind != "" {
		o.bindAddr, err = hostFlag("-b", "bind address", o.bind)
	}
	return dst, err
}

// cmFirstRequest listens in port space ps on bind:port (every address if
// bind is the zero Addr) with backlog 1 and takes the first connection
// request. Closing the channel closes the listener.
func cmFirstRequest(ctx context.Context, ps cm.PortSpace, bind netip.Addr, port uint16) (*cm.Channel, cm.Event, error) {
	ch, lis, _, err := cmListen(ps, bind, port, 1)
	if err != nil {
		return nil, cm.Event{}, err
	}
	req, err := lis.GetRequest(ctx)
	if err != nil {
		ch.Close()
		return nil, cm.Event{}, err
	}
	return ch, req, nil
}

// cmFlags makes the flag set of tool name with the common options (-b, -C,
// -S) and -c, the connection count, which it returns.
func cmFlags(name string, stderr io.Writer, o *cmOpts) (*flag.FlagSet, *int) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.bind, "b", "", "bind address")
	fs.IntVar(&o.count, "C", 10, "message count")
	fs.IntVar(&o.size, "S", 100, "message size")
	return fs, fs.Int("c", 1, "connections (only 1)")
}

// cmParse parses a tool's args: -h is flag.ErrHelp, another bad flag exit
// status 2 (the flag set has said why), arguments after the flags a usage
// error.
func cmParse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &exitError{code: 2}
	}
	if fs.NArg() > 0 {
		return usageError("unexpected arguments %q", fs.Args())
	}
	return nil
}

// cmRun runs client (if isClient) or server on o in the frame of
// rdma-core's rdma_cm examples: "<tool>: starting client" (or server), then
// "test complete" and "return status N". The run's context ends on SIGINT
// or SIGTERM.
func cmRun[O any](stdout io.Writer, tool string, o *O, isClient bool, client, server func(context.Context, *O) error) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run, who := server, "server"
	if isClient {
		run, who = client, "client"
	}
	fmt.Fprintf(stdout, "%s: starting %s\n", tool, who)
	err := run(ctx, o)
	fmt.Fprintln(stdout, "test complete")
	if err != nil {
		fmt.Fprintln(stdout, "return status 1")
		return err
	}
	fmt.Fprintln(stdout, "return status 0")
	return nil
}

// cmNode is the verbs side of one rdma_cm ID in the tools: the device the
// ID is on, a PD, memory with its MR, the QP made on the ID and, for UD,
// the peer's AH. The tools make their own CQs.
type cmNode struct {
	id  *cm.ID
	ctx *uverbs.Context
	pd  *uverbs.PD
	mem *mr.Memory
	mr  *mr.MR
	qp  *qp.QP
	ah  *uverbs.AH
}

// open opens the device the ID is on and allocates the PD.
func (n *cmNode) open(id *cm.ID) error {
	n.id = id
	name, _, err := id.Device()
	if err != nil {
		return err
	}
	if n.ctx, err = uverbs.Open(name); err != nil {
		return err
	}
	if n.pd, err = n.ctx.AllocPD(); err != nil {
		return fmt.Errorf("unable to allocate PD: %w", err)
	}
	return nil
}

// createQP makes the ID's QP.
func (n *cmNode) createQP(c qp.Config) error {
	var err error
	if n.qp, err = n.id.CreateQP(n.pd, c); err != nil {
		return fmt.Errorf("unable to create QP: %w", err)
	}
	return nil
}

// alloc allocates size bytes and registers them for local writes; fill
// writes rdma-core's pattern (byte i is i) into the first fill bytes.
func (n *cmNode) alloc(size, fill int) error {
	var err error
	if n.mem, err = mr.Alloc(size); err != nil {
		return err
	}
	if n.mr, err = mr.Register(n.pd, n.mem.Bytes(), mr.LocalWrite); err != nil {
		return fmt.Errorf("failed to reg MR: %w", err)
	}
	b := n.mem.Bytes()[:fill]
	for i := range b {
		b[i] = byte(i)
	}
	return nil
}

// postRecvs posts count receives of the first size bytes.
func (n *cmNode) postRecvs(count, size int) error {
	g, _ := n.mr.SGE(0, size)
	for i := 0; i < count; i++ {
		if err := n.qp.PostRecv([]qp.RecvWR{{ID: uint64(i), SGEs: []qp.SGE{g}}}); err != nil {
			return fmt.Errorf("failed to post receives: %w", err)
		}
	}
	return nil
}

// postUD posts count datagrams of size bytes to qpn through the AH as
// SEND_WITH_IMM whose immediate is the QPN; signaled(i) says which are
// signaled.
func (n *cmNode) postUD(count, size int, qpn, qkey uint32, signaled func(i int) bool) error {
	g, _ := n.mr.SGE(0, size)
	for i := 0; i < count; i++ {
		var f qp.SendFlags
		if signaled(i) {
			f = qp.Signaled
		}
		if err := n.qp.PostSend([]qp.SendWR{{ID: uint64(i), Opcode: qp.OpSendWithImm, Flags: f, Imm: n.qp.QPN(),
			SGEs: []qp.SGE{g}, AH: n.ah.Provider(), RemoteQPN: qpn, RemoteQKey: qkey}}); err != nil {
			return fmt.Errorf("failed to post sends: %w", err)
		}
	}
	return nil
}

// close frees the AH, the ID (with its QP), the device (with the PD, CQs
// and MR) and the memory.
func (n *cmNode) close() {
	if n.ah != nil {
		n.ah.Close()
	}
	if n.id != nil {
		n.id.Close()
	}
	if n.ctx != nil {
		n.ctx.Close()
	}
	if n.mem != nil {
		n.mem.Close()
	}
}

// cmPoll takes completions off c until want of them have counted; each
// says whether a completion counts (and fails the poll with an error). It
// gives up after idle without a completion, saying how many of want
// (what) came.
func cmPoll(ctx context.Context, c *cq.CQ, want int, idle time.Duration, what string, each func(w cq.WC, done int) (bool, error)) error {
	wc := make([]cq.WC, 8)
	last := time.Now()
	for done := 0; done < want; {
		k, err := c.Poll(wc)
		if err != nil {
			return fmt.Errorf("failed polling CQ: %w", err)
		}
		for _, w := range wc[:k] {
			counts, err := each(w, done)
			if err != nil {
				return err
			}
			if counts {
				done++
			}
		}
		if k > 0 {
			last = time.Now()
			continue
		}
		if time.Since(last) > idle {
			return fmt.Errorf("%d of %d %s, none for %v", done, want, what, idle)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Microsecond):
		}
	}
	return nil
}
