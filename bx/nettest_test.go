package bx_test

import (
	"context"
	"net"
	"testing"
	"time"

	"golang.org/x/net/nettest"
)

// TestConnConformance holds bx.Conn to the standard library's net.Conn
// conformance suite (golang.org/x/net/nettest: basic I/O, ping-pong,
// racing reads and writes, deadlines past, future and moving, close while
// blocked, concurrent methods) on rxe devices. Each pipe is a DialConn /
// Listener.Accept pair over one endpoint pair.
func TestConnConformance(t *testing.T) {
	srv, cli, _, _ := pair(t, nil)
	ln := srv.Listener()
	defer ln.Close()
	addr := srv.ListenAddrs()[0].String()
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang bound for the dial
		defer cancel()
		type accepted struct {
			c   net.Conn
			err error
		}
		ch := make(chan accepted, 1)
		go func() {
			c, err := ln.Accept()
			ch <- accepted{c, err}
		}()
		c1, err = cli.DialConn(ctx, addr)
		if err != nil {
			return nil, nil, nil, err
		}
		a := <-ch
		if a.err != nil {
			c1.Close()
			return nil, nil, nil, a.err
		}
		return c1, a.c, func() { c1.Close(); a.c.Close() }, nil
	})
}
