package bx_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
)

// connTest sets up a Conn test: a pair of endpoints (mod changes their
// Config), the server's Listener, and a hang bound of idle (no progress),
// not a speed bound. The Listener closes and the watchdog stops when the
// test ends.
func connTest(t *testing.T, idle time.Duration, mod func(*bx.Config)) (srv, cli *bx.Endpoint, ln net.Listener, ctx context.Context, wd *hang.Watchdog) {
	t.Helper()
	srv, cli, _, _ = pair(t, mod)
	ln = srv.Listener()
	t.Cleanup(func() { ln.Close() })
	ctx, wd = hang.For(t, "", idle)
	t.Cleanup(wd.Stop)
	return srv, cli, ln, ctx, wd
}

// dialConn dials a Conn from cli to srv and accepts it on srv's Listener
// ln.
func dialConn(t *testing.T, ctx context.Context, cli, srv *bx.Endpoint, ln net.Listener) (c, sc net.Conn) {
	t.Helper()
	c, err := cli.DialConn(ctx, srv.ListenAddrs()[0].String())
	if err != nil {
		t.Fatal(err)
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() }) // Accept has no context
	sc, err = ln.Accept()
	stop()
	if err != nil {
		c.Close()
		t.Fatal(hang.Cause(ctx, err))
	}
	boundConn(ctx, c)
	boundConn(ctx, sc)
	return c, sc
}

// boundConn makes ctx's end (a hang.For watchdog firing) end c's blocked
// reads and writes: a hang fails the test with a timeout instead of
// holding it until go test's -timeout (a net.Conn takes no context).
func boundConn(ctx context.Context, c net.Conn) {
	context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
}

// fillCredits sends 100-byte messages on stream s, which the peer does not
// read, until a send waits for a credit (its context of 2 s, scaled to
// the machine's speed, ends), and returns how many went.
func fillCredits(t *testing.T, wd *hang.Watchdog, s *bx.Stream) int {
	t.Helper()
	msg := make([]byte, 100)
	for n := 0; ; n++ {
		ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(2*time.Second))
		err := s.Send(ctx, msg)
		cancel()
		if err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("send after %d messages: %v", n, err)
			}
			return n
		}
		wd.Progress()
	}
}

// fillWindow writes 1 KiB pieces of streamBytes(off) on c until a write
// waits (its write deadline, 2 s scaled to the machine's speed, passes:
// the peer reads nothing) and returns the bytes written.
func fillWindow(t *testing.T, wd *hang.Watchdog, c net.Conn) int {
	t.Helper()
	sent := 0
	for {
		c.SetWriteDeadline(time.Now().Add(hang.Scale(2 * time.Second)))
		n, err := c.Write(streamBytes(sent, 1024))
		sent += n
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("write after %d bytes: %v", sent, err)
			}
			c.SetWriteDeadline(time.Time{})
			return sent
		}
		if sent > 4<<20 {
			t.Fatalf("wrote %d bytes unread and no write waited: no window", sent)
		}
		wd.Progress()
	}
}

// streamBytes is n bytes of a stream's content from offset off on.
func streamBytes(off, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		x := off + i
		b[i] = byte(x ^ x>>8 ^ x>>16)
	}
	return b
}

// TestConnUnreadHoldsNoBuffer: a Conn's messages that no Read waits for
// give their receive buffers (the peer's credits) back on arrival, and so
// does the rest of a message a Read took part of; their bytes are read
// whole after, and Conn.Close lets go of what is left unread. (Before,
// the 6 messages held 6 buffers until read or closed.)
func TestConnUnreadHoldsNoBuffer(t *testing.T) {
	srv, cli, ln, ctx, _ := connTest(t, 30*time.Second, nil)
	c, sc := dialConn(t, ctx, cli, srv, ln)
	defer c.Close()
	// DialConn dialed a peer connection of its own.
	sp, err := srv.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	live := srv.LiveMsgsForTest()
	spilled := srv.Stats().Spilled.Load()
	var want []byte
	for i := range 6 {
		part := fmt.Appendf(nil, "part %d;", i)
		want = append(want, part...)
		if _, err := c.Write(part); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "6 messages arrived and spilled", func() bool { return srv.Stats().Spilled.Load()-spilled == 6 })
	// Eventually: a control message being received counts as held
	// between its arrival and its re-post.
	eventually(t, "no receive buffer held by the unread messages", func() bool { return sp.HeldForTest() == 0 })
	if n := srv.LiveMsgsForTest() - live; n != 6 {
		t.Errorf("%d messages waiting for Read, want 6", n)
	}
	got := make([]byte, len(want)-5)
	if _, err := io.ReadFull(sc, got); err != nil || !bytes.Equal(got, want[:len(got)]) {
		t.Fatalf("read %q, %v; want %q", got, err, want[:len(got)])
	}
	if err := sc.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the unread message let go at Close", func() bool { return srv.LiveMsgsForTest() == live })
	eventually(t, "no receive buffer held after Close", func() bool { return sp.HeldForTest() == 0 })
	b := make([]byte, 3)
	if _, err := sc.Read(b); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close: %v, want net.ErrClosed", err)
	}
	if _, err := c.Read(b); err != io.EOF {
		t.Errorf("dialer's Read after the peer closed: %v, want io.EOF", err)
	}
	// A Read that takes part of a message: the rest leaves its buffer.
	c2, sc2 := dialConn(t, ctx, cli, srv, ln)
	defer c2.Close()
	defer sc2.Close()
	msg := streamBytes(0, 3000)
	reading := make(chan []byte, 1)
	go func() {
		b := make([]byte, 1000) // a Read waits: the message comes unspilled
		n, _ := io.ReadFull(sc2, b)
		reading <- b[:n]
	}()
	eventually(t, "the reader waits", func() bool { return bx.ConnReadersForTest(sc2) > 0 })
	spilled = srv.Stats().Spilled.Load()
	if _, err := c2.Write(msg); err != nil {
		t.Fatal(err)
	}
	first := <-reading
	eventually(t, "the rest of the message spilled", func() bool { return srv.Stats().Spilled.Load()-spilled == 1 })
	eventually(t, "no receive buffer held by the rest", func() bool { return sp.HeldForTest() == 0 })
	rest := make([]byte, 2000)
	if _, err := io.ReadFull(sc2, rest); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(append(first, rest...), msg) {
		t.Fatal("the message read in two parts is not what was written")
	}
}

// TestConnAcceptQueueFull: a Conn the acceptor cannot queue is refused
// with an error naming why, not dropped; so is one to an endpoint without
// a Listener. Closing the Listener closes the Conns it did not accept.
func TestConnAcceptQueueFull(t *testing.T) {
	srv, cli, _, _ := pair(t, nil)
	ctx, wd := hang.For(t, "", 30*time.Second) // a hang bound (no progress), not a speed bound
	defer wd.Stop()
	addr := srv.ListenAddrs()[0].String()
	_, err := cli.DialConn(ctx, addr)
	if !errors.Is(err, bx.ErrConnRefused) || !strings.Contains(err.Error(), "no Listener") {
		t.Fatalf("DialConn without a Listener: %v, want ErrConnRefused naming the missing Listener", err)
	}
	ln := srv.Listener()
	var conns []net.Conn
	for i := range 64 {
		c, err := cli.DialConn(ctx, addr)
		if err != nil {
			t.Fatalf("conn %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	_, err = cli.DialConn(ctx, addr)
	if !errors.Is(err, bx.ErrConnRefused) || !strings.Contains(err.Error(), "accept queue full") {
		t.Fatalf("65th DialConn: %v, want ErrConnRefused naming the full accept queue", err)
	}
	t.Logf("refused: %v", err)
	// Accepting one makes room for one.
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	c, err := cli.DialConn(ctx, addr)
	if err != nil {
		t.Fatalf("DialConn after an Accept: %v", err)
	}
	conns = append(conns, c)
	// The Conns never accepted are closed with the Listener.
	ln.Close()
	b := make([]byte, 1)
	for i, c := range conns[1:] {
		c.SetReadDeadline(time.Now().Add(hang.Scale(10 * time.Second)))
		if _, err := c.Read(b); err != io.EOF {
			t.Fatalf("conn %d after the Listener closed: %v, want io.EOF", i+1, err)
		}
		c.Close()
	}
	conns[0].Close()
}

// TestConnCloseDoesNotWait: Conn.Close returns while the peer holds every
// credit (here a stream of the same peer that it does not read), as a TCP
// Close does; the close message goes out once a credit comes back, and
// the peer then reads what was written and io.EOF. Before, Close waited
// for a credit up to HandshakeTimeout (here 30 minutes, past the hang
// bound however slow the machine; nettest's PresentTimeout showed the
// default 10 s).
func TestConnCloseDoesNotWait(t *testing.T) {
	srv, cli, ln, ctx, wd := connTest(t, 30*time.Second, func(c *bx.Config) { c.HandshakeTimeout = 30 * time.Minute })
	c, sc := dialConn(t, ctx, cli, srv, ln)
	defer sc.Close()
	data := streamBytes(0, 5000)
	if _, err := c.Write(data); err != nil {
		t.Fatal(err)
	}
	sp, err := srv.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const id = 99
	n := fillCredits(t, wd, bx.ConnPeerForTest(c).Stream(id)) // the server does not read stream 99
	done := make(chan error, 1)
	go func() { done <- c.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-ctx.Done():
		t.Fatalf("Close did not return with the peer's credits exhausted: %v", hang.Cause(ctx, ctx.Err()))
	}
	type result struct {
		b   []byte
		err error
	}
	read := make(chan result, 1)
	go func() { b, err := io.ReadAll(sc); read <- result{b, err} }()
	// The close cannot go out before a credit comes back: the read waits.
	select {
	case r := <-read:
		t.Fatalf("the peer's read ended (%d bytes, %v) while every credit was held", len(r.b), r.err)
	case <-time.After(300 * time.Millisecond):
	}
	st := sp.Stream(id)
	for range n {
		m, err := st.Recv(ctx)
		if err != nil {
			t.Fatalf("server stream %d: %v", id, hang.Cause(ctx, err))
		}
		m.Release()
	}
	// The peer reads everything, then io.EOF: the close went out behind it.
	select {
	case r := <-read:
		if r.err != nil || !bytes.Equal(r.b, data) {
			t.Fatalf("peer read %d of %d bytes (same: %v), then %v", len(r.b), len(data), bytes.Equal(r.b, data), r.err)
		}
	case <-ctx.Done():
		sc.Close()
		t.Fatalf("the peer's read did not end (no close message behind the data): %v", hang.Cause(ctx, ctx.Err()))
	}
}

// TestConnIsolation: a Conn whose reader reads nothing stalls only its own
// writer, as a TCP connection does, though every Conn to the peer shares
// its credits: the writer stops at the Conn's window, the unread data
// holds no receive buffer, a sibling Conn's write goes through, and once
// the reader reads, the writer goes on. Before, the unread data held the
// peer's credits and the sibling's Write waited for them (the hang bound
// ended the test).
func TestConnIsolation(t *testing.T) {
	srv, cli, ln, ctx, wd := connTest(t, 30*time.Second, nil)
	c1, sc1 := dialConn(t, ctx, cli, srv, ln)
	defer c1.Close()
	defer sc1.Close()
	c2, sc2 := dialConn(t, ctx, cli, srv, ln)
	defer c2.Close()
	defer sc2.Close()
	sp, err := srv.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	win := cli.ConnWindowForTest()
	sent := fillWindow(t, wd, c1) // sc1 reads nothing
	if sent > win || sent <= win-1024 {
		t.Fatalf("c1 wrote %d bytes before it waited, want the window: %d (less at most one 1 KiB write)", sent, win)
	}
	eventually(t, "no receive buffer held by c1's unread data", func() bool { return sp.HeldForTest() == 0 })
	data := streamBytes(7, 3*8192+17)
	if _, err := c2.Write(data); err != nil {
		t.Fatalf("c2 write beside c1's unread data: %v", hang.Cause(ctx, err))
	}
	got := make([]byte, len(data))
	if _, err := io.ReadFull(sc2, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("sc2 read %v (same bytes: %v)", hang.Cause(ctx, err), bytes.Equal(got, data))
	}
	// The reader reads what waited and twice a window more, which the
	// writer can send only as the reader tells it what it read.
	more := 2 * win
	wrote := make(chan error, 1)
	go func() { _, err := c1.Write(streamBytes(sent, more)); wrote <- err }()
	all := make([]byte, sent+more)
	if _, err := io.ReadFull(sc1, all); err != nil {
		t.Fatalf("sc1 read: %v", hang.Cause(ctx, err))
	}
	if !bytes.Equal(all, streamBytes(0, sent+more)) {
		t.Fatal("sc1 read other bytes than c1 wrote")
	}
	if err := <-wrote; err != nil {
		t.Fatalf("c1's second write: %v", err)
	}
	if n := srv.Stats().Spilled.Load(); n == 0 {
		t.Error("no message spilled, though sc1 read nothing for a window")
	}
}

// TestConnWindowRecovery: the reader's counts (flagRead) are sequenced
// messages, resent after a QP failure like data: with the lanes forced to
// ERR while a writer streams through its window and the reader reads,
// every byte arrives once and in order and the writer does not wait
// forever for a count lost with the QP.
func TestConnWindowRecovery(t *testing.T) {
	srv, cli, ln, ctx, wd := connTest(t, 60*time.Second, nil)
	c, sc := dialConn(t, ctx, cli, srv, ln)
	defer c.Close()
	defer sc.Close()
	win := cli.ConnWindowForTest()
	total := 6 * win
	wrote := make(chan error, 1)
	go func() {
		for off := 0; off < total; off += 8 << 10 {
			if _, err := c.Write(streamBytes(off, min(8<<10, total-off))); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	got := make([]byte, 0, total)
	buf := make([]byte, 5000)
	broken := 0
	for len(got) < total {
		n, err := sc.Read(buf)
		if err != nil {
			t.Fatalf("read after %d of %d bytes: %v", len(got), total, hang.Cause(ctx, err))
		}
		got = append(got, buf[:n]...)
		wd.Progress()
		// Twice, a window apart: the writer waits for counts then.
		if broken < 2 && len(got) >= (broken+1)*2*win {
			p := bx.ConnPeerForTest(c)
			for p.BreakLanesForTest() != nil { // a recovery under way: again
				time.Sleep(10 * time.Millisecond)
			}
			broken++
		}
	}
	if err := <-wrote; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, streamBytes(0, total)) {
		t.Fatal("the bytes read are not the bytes written, in order")
	}
	if r := cli.Stats().Recoveries.Load(); r == 0 {
		t.Error("no recovery counted: the lanes did not fail")
	}
}

// TestConnWindowPeerGone: a Write waiting for its window (the reader
// reads nothing) returns an error when the peer's endpoint closes; it
// does not wait for a count that cannot come.
func TestConnWindowPeerGone(t *testing.T) {
	srv, cli, ln, ctx, wd := connTest(t, 30*time.Second, nil)
	c, _ := dialConn(t, ctx, cli, srv, ln)
	defer c.Close()
	sent := fillWindow(t, wd, c)
	wrote := make(chan error, 1)
	go func() { _, err := c.Write(streamBytes(sent, 4096)); wrote <- err }()
	select {
	case err := <-wrote:
		t.Fatalf("a write past the window returned (%v) while the reader read nothing", err)
	case <-time.After(300 * time.Millisecond):
	}
	ln.Close()
	srv.Close()
	select {
	case err := <-wrote:
		if err == nil {
			t.Fatal("the write past the window succeeded with the peer gone")
		}
		t.Logf("write with the peer gone: %v", err)
	case <-ctx.Done():
		t.Fatalf("the write waiting for its window did not end with the peer gone: %v", hang.Cause(ctx, ctx.Err()))
	}
}
