package ps

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
)

// TestFrameBufferFollowsBytes: a TCP server's buffer for a large request
// grows with the bytes that arrive, not with the length the peer claims.
// It was made whole on the frame's 4-byte length: a peer that claimed
// MaxFrame and sent nothing more held that much of the server's memory,
// on each of as many connections as it opened.
func TestFrameBufferFollowsBytes(t *testing.T) {
	const claim, sent = 64 << 20, 200 << 10
	s := &Server{store: NewStore(StoreConfig{}), inc: 1, cfg: ServerConfig{MaxFrame: claim}, conns: map[net.Conn]struct{}{}}
	srv, peer := net.Pipe()
	s.wg.Add(1)
	go s.serveTCP(srv)
	defer func() { peer.Close(); s.wg.Wait() }()
	peer.SetDeadline(time.Now().Add(hang.Scale(30 * time.Second))) // a hang bound: a pipe write of 200 KB
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var lb [4]byte
	binary.LittleEndian.PutUint32(lb[:], claim)
	// A pipe's Write returns once the server has read it all: its
	// buffer is then made.
	if _, err := peer.Write(lb[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Write(make([]byte, sent)); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 8<<20 {
		t.Errorf("a frame claiming %d bytes, %d of them sent: the server allocated %d bytes", claim, sent, got)
	}
}

// TestReadFrame: readFrame reads exactly n bytes whatever the buffer it
// is given, and keeps a buffer large enough; one it grows is no larger
// than n (append's rounding took 1 MiB past the 1 MiB a connection
// keeps: a client or server made it again for each frame of that size).
func TestReadFrame(t *testing.T) {
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, c := range []struct{ n, capacity int }{{1, 0}, {70 << 10, 0}, {300 << 10, 0}, {300 << 10, 300 << 10}, {100 << 10, 1 << 20}, {200 << 10, 65<<10 + 3}, {1 << 20, 0}} {
		buf, err := readFrame(bytes.NewReader(data), make([]byte, 5, c.capacity+5)[5:], c.n)
		if err != nil || !bytes.Equal(buf, data[:c.n]) {
			t.Errorf("readFrame(%d into cap %d): %d bytes, %v", c.n, c.capacity, len(buf), err)
		}
		if c.capacity >= c.n && cap(buf) != c.capacity {
			t.Errorf("readFrame(%d into cap %d): grew to %d", c.n, c.capacity, cap(buf))
		}
		if c.capacity < c.n && cap(buf) > c.n {
			t.Errorf("readFrame(%d into cap %d): grew to %d, more than the frame", c.n, c.capacity, cap(buf))
		}
	}
	if _, err := readFrame(bytes.NewReader(data[:1000]), nil, 100<<10); err != io.ErrUnexpectedEOF {
		t.Errorf("readFrame of a short stream: %v, want io.ErrUnexpectedEOF", err)
	}
}

// pipeClient is a TCP client of one server whose one connection is c
// (the client's end of a pipe): calls take it from the pool.
func pipeClient(c net.Conn) *tcpClient {
	t := newTCPClient(ClientConfig{Servers: []string{"pipe"}, Pool: 1})
	t.pools[0] <- &tcpConn{c: c, br: bufio.NewReaderSize(c, 64<<10), pool: t.pools[0]}
	return t
}

// readRequest reads one request frame from the client's peer into buf
// (a small request's room), allocating nothing.
func readRequest(c net.Conn, buf []byte) error {
	if _, err := io.ReadFull(c, buf[:4]); err != nil {
		return err
	}
	n := int(binary.LittleEndian.Uint32(buf))
	if n > len(buf) {
		return fmt.Errorf("a request of %d bytes", n)
	}
	_, err := io.ReadFull(c, buf[:n])
	return err
}

// TestClientFrameBufferFollowsBytes: a TCP client's buffer for a large
// response grows with the bytes that arrive, not with the length the
// server claims. It was made whole on the frame's 4-byte length: a server
// (or anything listening on its address) that claimed 64 MiB and sent
// 200 KiB made each call allocate 64 MiB.
func TestClientFrameBufferFollowsBytes(t *testing.T) {
	const claim, sent = 64 << 20, 200 << 10
	cli, peer := net.Pipe()
	tc := pipeClient(cli)
	defer tc.close()
	bound := time.Now().Add(hang.Scale(30 * time.Second)) // a hang bound: a pipe write of 200 KB
	peer.SetDeadline(bound)
	cli.SetDeadline(bound)
	errc := make(chan error, 1)
	go func() {
		defer peer.Close()
		if err := readRequest(peer, make([]byte, 64)); err != nil {
			errc <- err
			return
		}
		var lb [4]byte
		binary.LittleEndian.PutUint32(lb[:], claim)
		if _, err := peer.Write(lb[:]); err != nil {
			errc <- err
			return
		}
		_, err := peer.Write(make([]byte, sent))
		errc <- err // a pipe's Write returns once the client has read it all
	}()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := tc.call(context.Background(), 0, &call{isRaw: true, raw: []byte{1, byte(OpStats), 0, 0}})
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("a call whose response ended 200 KiB into a 64 MiB frame succeeded")
	}
	if werr := <-errc; werr != nil {
		t.Fatalf("fake server: %v", werr)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 8<<20 {
		t.Errorf("a response frame claiming %d bytes, %d of them sent: the client allocated %d bytes", claim, sent, got)
	}
}

// TestClientLargeResponse: responses larger than the connection's reader
// (64 KiB) arrive whole over the reused buffer, which in steady state
// allocates nothing.
func TestClientLargeResponse(t *testing.T) {
	for _, size := range []int{300 << 10, 900 << 10, 1<<20 - respHeader} {
		t.Run(fmt.Sprint(size), func(t *testing.T) { clientLargeResponse(t, size) })
	}
}

func clientLargeResponse(t *testing.T, size int) {
	cli, peer := net.Pipe()
	tc := pipeClient(cli)
	defer tc.close()
	bound := time.Now().Add(hang.Scale(60 * time.Second))
	peer.SetDeadline(bound)
	cli.SetDeadline(bound)
	body := make([]byte, size)
	for i := range body {
		body[i] = byte(i * 13)
	}
	resp := append(appendRespHead(make([]byte, 4, 4+respHeader+size), 7), body...)
	binary.LittleEndian.PutUint32(resp, uint32(len(resp)-4))
	stop := make(chan struct{})
	go func() {
		defer peer.Close()
		buf := make([]byte, 64)
		for {
			if readRequest(peer, buf) != nil {
				return
			}
			select {
			case <-stop:
				return
			default:
			}
			if _, err := peer.Write(resp); err != nil {
				return
			}
		}
	}()
	defer close(stop)
	k := &call{isRaw: true, raw: []byte{1, byte(OpStats), 0, 0}, read: func(b []byte) error {
		if !bytes.Equal(b, body) {
			return fmt.Errorf("a body of %d bytes, want the %d sent", len(b), len(body))
		}
		return nil
	}}
	do := func() {
		if err := tc.call(context.Background(), 0, k); err != nil || k.err != nil {
			t.Fatalf("a response of %d bytes: %v, %v", len(resp)-4, err, k.err)
		}
	}
	do()
	if n := testing.AllocsPerRun(20, do); n != 0 {
		t.Errorf("a %d-byte response: %v allocations per call, want 0", len(resp)-4, n)
	}
}
