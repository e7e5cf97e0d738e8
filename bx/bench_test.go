package bx_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
)

// The RPC benchmarks compare a bx Call with the same request/response
// protocol (a 48-byte header, then the payload) over one Go net TCP
// connection per caller between the same two addresses in the guest: echo
// of N bytes each way.

var rpcSizes = []int{64, 4 << 10, 64 << 10, 1 << 20, 4 << 20}

func BenchmarkRPC(b *testing.B) {
	spin := time.Duration(0)
	if v := os.Getenv("GOVERBS_BX_SPIN"); v != "" {
		spin, _ = time.ParseDuration(v)
	}
	srv, _, p, _ := pair(b, func(c *bx.Config) { c.MaxMessage = 4 << 20; c.Spin = spin })
	srv.Handle(1, func(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		return req.Data(), nil // copied into the response before req is released
	})
	tcpAddr := tcpEchoServer(b)
	for _, n := range rpcSizes {
		req := make([]byte, n)
		for i := range req {
			req[i] = byte(i)
		}
		b.Run(fmt.Sprintf("bx/%d", n), func(b *testing.B) {
			ctx := context.Background()
			b.SetBytes(int64(2 * n))
			b.ReportAllocs()
			for range b.N {
				m, err := p.Call(ctx, 1, req)
				if err != nil {
					b.Fatal(err)
				}
				if len(m.Data()) != n {
					b.Fatalf("response of %d bytes", len(m.Data()))
				}
				m.Release()
			}
		})
		b.Run(fmt.Sprintf("tcp/%d", n), func(b *testing.B) {
			c, err := net.Dial("tcp", tcpAddr)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			cl := newTCPClient(c)
			b.SetBytes(int64(2 * n))
			b.ReportAllocs()
			for range b.N {
				resp, err := cl.call(req)
				if err != nil {
					b.Fatal(err)
				}
				if len(resp) != n {
					b.Fatalf("response of %d bytes", len(resp))
				}
			}
		})
	}
}

const tcpHeader = bx.HeaderSize

type tcpClient struct {
	c    net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	hdr  [4 + tcpHeader]byte
	resp []byte
}

func newTCPClient(c net.Conn) *tcpClient {
	return &tcpClient{c: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10)}
}

// call sends one frame (length, header, payload) and reads the answer.
func (t *tcpClient) call(req []byte) ([]byte, error) {
	binary.LittleEndian.PutUint32(t.hdr[:4], uint32(tcpHeader+len(req)))
	t.w.Write(t.hdr[:])
	t.w.Write(req)
	if err := t.w.Flush(); err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(t.r, t.hdr[:]); err != nil {
		return nil, err
	}
	n := int(binary.LittleEndian.Uint32(t.hdr[:4])) - tcpHeader
	if cap(t.resp) < n {
		t.resp = make([]byte, n)
	}
	t.resp = t.resp[:n]
	_, err := io.ReadFull(t.r, t.resp)
	return t.resp, err
}

// tcpEchoServer listens on the second device's address and echoes frames.
func tcpEchoServer(b *testing.B) string {
	l, err := net.Listen("tcp", "10.99.0.2:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	b.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				cl := newTCPClient(c)
				for {
					if _, err := io.ReadFull(cl.r, cl.hdr[:]); err != nil {
						return
					}
					n := int(binary.LittleEndian.Uint32(cl.hdr[:4])) - tcpHeader
					if cap(cl.resp) < n {
						cl.resp = make([]byte, n)
					}
					cl.resp = cl.resp[:n]
					if _, err := io.ReadFull(cl.r, cl.resp); err != nil {
						return
					}
					cl.w.Write(cl.hdr[:])
					cl.w.Write(cl.resp)
					if cl.w.Flush() != nil {
						return
					}
				}
			}()
		}
	}()
	// The client dials from the first device's address side of the veth.
	return l.Addr().String()
}

// BenchmarkConn streams N bytes a write over one Conn to a reader that
// reads as fast as it can (32 KiB reads, as gRPC's transport does), and
// reports the throughput; allocs/op are per write, both sides.
func BenchmarkConn(b *testing.B) {
	srv, cli, _, _ := pair(b, nil)
	ln := srv.Listener()
	defer ln.Close()
	ctx := context.Background()
	for _, n := range []int{1 << 10, 8 << 10, 64 << 10} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			c, err := cli.DialConn(ctx, srv.ListenAddrs()[0].String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			sc, err := ln.Accept()
			if err != nil {
				b.Fatal(err)
			}
			defer sc.Close()
			data := make([]byte, n)
			b.SetBytes(int64(n))
			b.ReportAllocs()
			done := make(chan error, 1)
			go func() {
				buf := make([]byte, 32<<10)
				var err error
				left := b.N * n
				for err == nil && left > 0 {
					var k int
					k, err = sc.Read(buf[:min(len(buf), left)])
					left -= k
				}
				done <- err
			}()
			spilled := srv.Stats().Spilled.Load()
			for range b.N {
				if _, err := c.Write(data); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			// Messages no Read waited for (copied to the heap).
			b.ReportMetric(float64(srv.Stats().Spilled.Load()-spilled)/float64(b.N), "spills/op")
		})
	}
}
