package ps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
)

// TestAcceptSurvivesEMFILE: a TCP server whose Accept fails for want of
// descriptors (EMFILE: many workers, each with a pool of connections,
// against the default limit of 1024) goes on accepting once descriptors
// are free again. Its accept loop returned on the first error of any
// kind: the server stopped taking connections for good, silently, while
// it still looked open (a new worker's calls hung on a connection nobody
// accepted).
func TestAcceptSurvivesEMFILE(t *testing.T) {
	if os.Getenv("PS_TEST_EMFILE") == "" {
		// The descriptor limit is the whole process's: lowered in a child
		// of its own, it meets no other test's goroutine (and leaves Go's
		// own limit for exec'd children alone).
		cmd := exec.Command(os.Args[0], "-test.run=^TestAcceptSurvivesEMFILE$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "PS_TEST_EMFILE=1")
		out, err := cmd.CombinedOutput()
		switch {
		case err != nil:
			t.Fatalf("the test in a child process: %v\n%s", err, out)
		case bytes.Contains(out, []byte("--- SKIP: TestAcceptSurvivesEMFILE")):
			t.Skipf("the child skipped:\n%s", out)
		case !bytes.Contains(out, []byte("--- PASS: TestAcceptSurvivesEMFILE")):
			t.Fatalf("the child ran no test:\n%s", out)
		}
		return
	}
	srv, err := NewServer(ServerConfig{Transport: "tcp", Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	sa := srv.Addr().(*net.TCPAddr)

	// A socket made while descriptors are free, connected once none are:
	// the server's accept4 then fails with EMFILE.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	free, err := syscall.Dup(0) // the lowest free descriptor
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(free)
	low := lim
	low.Cur = uint64(free)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("cannot lower RLIMIT_NOFILE: %v", err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer restore()
	cerr := syscall.Connect(fd, &syscall.SockaddrInet4{Port: sa.Port, Addr: [4]byte{127, 0, 0, 1}})
	// Give the server's accept loop the time to meet EMFILE (a window
	// that passes when it ends: a slow machine can only miss the defect).
	time.Sleep(hang.Scale(200 * time.Millisecond))
	restore()
	if cerr != nil {
		t.Fatalf("connect: %v", cerr)
	}

	ctx, _ := hang.For(t, "a call after the server ran out of descriptors", 20*time.Second) // a hang bound: a loopback call takes milliseconds
	c, err := Dial(ClientConfig{Transport: "tcp", Servers: []string{srv.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Stats(ctx); err != nil {
		t.Fatalf("after EMFILE on accept, the server no longer serves new connections: %v", hang.Cause(ctx, err))
	}
}

// TestStatsIncarnation: ServerStats.Incarnation is the incarnation of
// the server that answered. Stats read the client's record of it while
// decoding the response, before the call recorded the response's: a
// client's first Stats said 0, and the Stats that met a restarted server
// said the old incarnation while it returned ErrStateLost for the new.
func TestStatsIncarnation(t *testing.T) {
	srv, c := tcpServerClient(t)
	ctx, _ := hang.For(t, "", 30*time.Second) // a hang bound: the calls are few, on loopback
	st, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st[0].Incarnation != srv.Incarnation() {
		t.Errorf("first Stats: incarnation %#x, the server's is %#x", st[0].Incarnation, srv.Incarnation())
	}
	// The server restarts on the same address.
	srv2 := restartTCP(ctx, t, srv, ServerConfig{})
	for range 3 { // the pooled connection to the old server fails first
		if st, err = c.Stats(ctx); errors.Is(err, ErrStateLost) {
			break
		}
	}
	if !errors.Is(err, ErrStateLost) {
		t.Fatalf("Stats after a restart: %v, want ErrStateLost", err)
	}
	if st[0].Incarnation != srv2.Incarnation() {
		t.Errorf("Stats after a restart: incarnation %#x, the new server's is %#x (the old one's %#x)", st[0].Incarnation, srv2.Incarnation(), srv.Incarnation())
	}
}

// TestRedefineFailureReported: when a client meets a restarted server it
// re-defines its parameters there; a define the new server refuses (here
// it was restarted with a smaller MaxValues) is reported with the
// ErrStateLost. It was dropped: the caller was told the state was lost
// (and, by the docs, re-defined), and every later call on the tensor
// failed with "no parameter" and nothing said why.
func TestRedefineFailureReported(t *testing.T) {
	srv, c := tcpServerClient(t)
	ctx, _ := hang.For(t, "", 30*time.Second) // a hang bound: the calls are few, on loopback
	must(t, c.Define(ctx,
		Spec{Name: "emb", Kind: Sparse, Dim: 2, Rows: 10, Opt: Optimizer{Kind: SGD, LR: 1}},
		Spec{Name: "big", Kind: Dense, Size: 1000, Opt: Optimizer{Kind: SGD, LR: 1}}))
	must(t, c.Pull(ctx, "emb", []uint64{1}, make([]float32, 2)))
	restartTCP(ctx, t, srv, ServerConfig{Store: StoreConfig{MaxValues: 100}})
	var err error
	for range 3 { // the pooled connection to the old server fails first
		if err = c.Pull(ctx, "emb", []uint64{1}, make([]float32, 2)); errors.Is(err, ErrStateLost) {
			break
		}
	}
	if !errors.Is(err, ErrStateLost) {
		t.Fatalf("after a restart: %v, want ErrStateLost", err)
	}
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), `"big"`) {
		t.Errorf("after a restart whose re-define of \"big\" failed: %v; want it to say so (ErrTooLarge, naming \"big\")", err)
	}
	t.Logf("reported: %v", err)
}

// TestPullResponseBound: a pull whose response would carry more floats
// than one message may (maxWireFloats, as for a push) is refused by the
// decoder, before the server builds it. The decoder bounded the keys and
// the dim of a pull apart, not their product: a pull of a few KiB of keys
// of a wide table made the server allocate up to 16 GiB (64 Ki keys of
// dim 64 Ki) for a response no client would take (the TCP client refuses
// a frame over 256 MiB, bx one over MaxMessage).
func TestPullResponseBound(t *testing.T) {
	keys := make([]uint64, maxWireFloats>>16+1)
	if b, err := EncodePull("wide", 1<<16, keys); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "EncodePull: 1025 keys of dim 65536") {
		t.Errorf("EncodePull of %d keys of dim %d: %d bytes, %v; want ErrMalformed naming the counts", len(keys), 1<<16, len(b), err)
	}
	// The request as a peer could send it: one key more than the bound.
	req := append(mustEncode(EncodePull("wide", 1<<16, keys[1:])), make([]byte, 8)...)
	req[headSize("wide")+4] = byte(len(keys))
	req[headSize("wide")+5] = byte(len(keys) >> 8)
	if _, err := DecodeRequest(req); !errors.Is(err, ErrMalformed) {
		t.Errorf("a pull of %d keys of dim %d (%d floats, the bound %d) decoded: %v", len(keys), 1<<16, len(keys)<<16, maxWireFloats, err)
	}
	// Served: an error, and no response of 256 MiB.
	s := &Server{store: NewStore(StoreConfig{}), inc: 1}
	must(t, s.store.Define(Spec{Name: "wide", Kind: Sparse, Dim: 1 << 16, Rows: 10, Opt: Optimizer{Kind: SGD, LR: 1}}))
	if b := s.Handle(req, nil); len(b) < 1 || b[0] != 1 || len(b) > 1<<16 {
		t.Errorf("the server answered a pull of %d floats with %d bytes, status %d", len(keys)<<16, len(b), b[0])
	}
	// At the bound it still decodes.
	if _, err := DecodeRequest(mustEncode(EncodePull("wide", 1<<16, keys[:len(keys)-1]))); err != nil {
		t.Errorf("a pull of exactly %d floats: %v", maxWireFloats, err)
	}
}

// TestNoKeysWithValues: Push of no keys with gradient values, and Pull of
// no keys into a non-empty out, are refused with ErrDim naming the counts
// (as for any other count that does not divide): they returned success,
// and the gradients were dropped without a word (a caller that lost its
// keys slice trained on nothing). No keys and no values is still a no-op.
func TestNoKeysWithValues(t *testing.T) {
	c, ctx := loopClient(t)
	must(t, c.Define(ctx, Spec{Name: "e", Kind: Sparse, Dim: 2, Rows: 10, Opt: Optimizer{Kind: SGD, LR: 1}}))
	if res, err := c.Push(ctx, "e", nil, []float32{1, 2}); !errors.Is(err, ErrDim) || !strings.Contains(fmt.Sprint(err), "0 keys") {
		t.Errorf("Push of 0 keys and 2 gradient values: %+v, %v; want ErrDim naming the counts", res, err)
	}
	if err := c.Pull(ctx, "e", nil, make([]float32, 2)); !errors.Is(err, ErrDim) || !strings.Contains(fmt.Sprint(err), "0 keys") {
		t.Errorf("Pull of 0 keys into 2 values: %v; want ErrDim naming the counts", err)
	}
	if _, err := c.Push(ctx, "e", nil, nil); err != nil {
		t.Errorf("Push of nothing: %v", err)
	}
	if err := c.Pull(ctx, "e", []uint64{}, nil); err != nil {
		t.Errorf("Pull of nothing: %v", err)
	}
}

// TestOversizedFrameAnswered: a request over the TCP server's MaxFrame
// gets the server's ErrTooLarge naming the limit, whatever its size, and
// the connection goes on serving. The server answered and closed at once,
// with the request's bytes unread: the close reset the connection, and a
// request larger than the socket buffers lost its answer (the caller got
// "EOF" for a push of 400 KB to a server of MaxFrame 1 KiB).
func TestOversizedFrameAnswered(t *testing.T) {
	srv, err := NewServer(ServerConfig{Transport: "tcp", Listen: "127.0.0.1:0", MaxFrame: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, err := Dial(ClientConfig{Transport: "tcp", Servers: []string{srv.Addr().String()}, Pool: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, _ := hang.For(t, "", 30*time.Second) // a hang bound: the calls are few, on loopback
	must(t, c.Define(ctx, Spec{Name: "d", Kind: Dense, Size: 8, Opt: Optimizer{Kind: SGD, LR: 1}}))
	for _, n := range []int{1000, 100_000, 500_000} {
		_, err := c.PushDense(ctx, "d", make([]float32, n))
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(fmt.Sprint(err), "exceeds the server's 1024-byte limit") {
			t.Errorf("a push of %d values to a server of MaxFrame 1024: %v; want ErrTooLarge naming the limit", n, err)
		}
		must(t, c.PullDense(ctx, "d", make([]float32, 8)))
	}
}

// tcpServerClient starts a TCP server on loopback and a client of it,
// both closed at the end of the test.
func tcpServerClient(t *testing.T) (*Server, *Client) {
	t.Helper()
	srv, err := NewServer(ServerConfig{Transport: "tcp", Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	c, err := Dial(ClientConfig{Transport: "tcp", Servers: []string{srv.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return srv, c
}

// restartTCP closes srv and starts a server with cfg on its address
// (closed at the end of the test), retrying while the port is not free
// yet, bounded by ctx.
func restartTCP(ctx context.Context, t *testing.T, srv *Server, cfg ServerConfig) *Server {
	t.Helper()
	cfg.Transport, cfg.Listen = "tcp", srv.Addr().String()
	must(t, srv.Close())
	for {
		srv2, err := NewServer(cfg)
		if err == nil {
			t.Cleanup(func() { srv2.Close() })
			return srv2
		}
		if ctx.Err() != nil {
			t.Fatalf("restart: %v", hang.Cause(ctx, err))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDeadlineIsContexts: a TCP call that runs out of its context's time
// returns an error that is context.DeadlineExceeded. The connection's
// deadline is set to the context's, and when its timer fired first the
// call returned the connection's "i/o timeout" instead (the context not
// done yet): errors.Is(err, context.DeadlineExceeded) missed some runs.
func TestDeadlineIsContexts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // a server that reads and never answers
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	c, err := Dial(ClientConfig{Transport: "tcp", Servers: []string{ln.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bound, _ := hang.For(t, "", 60*time.Second) // a hang bound: each call ends at its own 5 ms deadline
	for i := range 40 {
		ctx, cancel := context.WithTimeout(bound, 5*time.Millisecond)
		_, err := c.Stats(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("call %d past its deadline: %v, want context.DeadlineExceeded", i, err)
		}
	}
}
