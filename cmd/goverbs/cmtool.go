package main

import (
	"context"
	"net/netip"
	"time"

	"github.com/goverbs/goverbs/cm"
)

// What the rdma_cm tools (rping, udaddy) share: the active side's
// resolution and the passive side's listener.

// cmResolve opens an event channel, creates an ID in port space ps and
// resolves host:port (from src, unless empty) and the route within
// rdma-core's tools' 2 s. Closing the channel closes the ID.
func cmResolve(ctx context.Context, ps cm.PortSpace, host string, port uint16, src string) (*cm.Channel, *cm.ID, error) {
	dst, err := resolveHost(host)
	if err != nil {
		return nil, nil, err
	}
	var from netip.Addr
	if src != "" {
		if from, err = resolveHost(src); err != nil {
			return nil, nil, err
		}
	}
	ch, err := cm.Open()
	if err != nil {
		return nil, nil, err
	}
	id, err := ch.CreateID(ps)
	if err == nil {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second) // the tools' 2000 ms
		if err = id.ResolveAddr(rctx, from, netip.AddrPortFrom(dst, port)); err == nil {
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

// cmListen opens an event channel and listens in port space ps on
// host:port (every address if host is empty) with backlog. Closing the
// channel closes the listener.
func cmListen(ps cm.PortSpace, host string, port uint16, backlog int) (*cm.Channel, *cm.ID, netip.AddrPort, error) {
	bind := netip.IPv4Unspecified()
	if host != "" {
		var err error
		if bind, err = resolveHost(host); err != nil {
			return nil, nil, netip.AddrPort{}, err
		}
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
