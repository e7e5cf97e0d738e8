package ps

import (
	"bytes"
	"encoding/binary"
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
// is given, and keeps a buffer large enough.
func TestReadFrame(t *testing.T) {
	data := make([]byte, 300<<10)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, c := range []struct{ n, capacity int }{{1, 0}, {70 << 10, 0}, {300 << 10, 0}, {300 << 10, 300 << 10}, {100 << 10, 1 << 20}, {200 << 10, 65<<10 + 3}} {
		buf, err := readFrame(bytes.NewReader(data), make([]byte, 5, c.capacity+5)[5:], c.n)
		if err != nil || !bytes.Equal(buf, data[:c.n]) {
			t.Errorf("readFrame(%d into cap %d): %d bytes, %v", c.n, c.capacity, len(buf), err)
		}
		if c.capacity >= c.n && cap(buf) != c.capacity {
			t.Errorf("readFrame(%d into cap %d): grew to %d", c.n, c.capacity, cap(buf))
		}
	}
	if _, err := readFrame(bytes.NewReader(data[:1000]), nil, 100<<10); err != io.ErrUnexpectedEOF {
		t.Errorf("readFrame of a short stream: %v, want io.ErrUnexpectedEOF", err)
	}
}
