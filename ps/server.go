package ps

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goverbs/goverbs/bx"
)

// ServerConfig configures a Server.
type ServerConfig struct {
	Transport string // "rdma" (bx) or "tcp"
	Listen    string // host:port; for rdma, the bx control plane
	// Device is the RDMA device (rdma only; default: the ACTIVE device
	// whose RoCE v2 GID is the Listen address's IP).
	Device string
	Token  []byte // rdma: bx authentication token (at least 16 bytes)
	Store  StoreConfig
	// BX tunes the rdma endpoint; Device and Token are filled in. Zero
	// values take DefaultServerBX's.
	BX bx.Config
	// MaxFrame bounds a TCP request (default: MaxMessage of the bx
	// config, 4 MiB), as bx bounds an RDMA one.
	MaxFrame int
}

// check refuses what no default stands for: a negative bound, an unknown
// NaN policy or transport.
func (cfg *ServerConfig) check() error {
	switch {
	case cfg.Transport != "rdma" && cfg.Transport != "tcp":
		return fmt.Errorf("ps: transport %q: want rdma or tcp", cfg.Transport)
	case cfg.Store.MaxBatch < 0:
		return fmt.Errorf("ps: server: Store.MaxBatch %d: want keys per request > 0 (0: the default, 65536)", cfg.Store.MaxBatch)
	case cfg.Store.MaxValues < 0:
		return fmt.Errorf("ps: server: Store.MaxValues %d: want values per tensor > 0 (0: the default, 16 Mi)", cfg.Store.MaxValues)
	case cfg.Store.MaxBytes < 0:
		return fmt.Errorf("ps: server: Store.MaxBytes %d: want bytes of parameter storage > 0 (0: the default, DefaultMaxBytes)", cfg.Store.MaxBytes)
	case cfg.Store.NaN > NaNSkip:
		return fmt.Errorf("ps: server: Store.NaN %d: want NaNReject or NaNSkip", cfg.Store.NaN)
	case cfg.MaxFrame < 0:
		return fmt.Errorf("ps: server: MaxFrame %d: want bytes > 0 (0: the default)", cfg.MaxFrame)
	}
	return nil
}

// Streams is the number of bx stream ids a server serves on its worker
// pool (0..Streams-1), and again on its progress goroutine
// (Streams..2*Streams-1, bx.HandleInline: no hand-off to a worker and
// back); clients spread their calls over them (and so over the endpoint's
// lanes), and send a small pull or push to an inline one.
const Streams = 8

// DefaultServerBX is a server endpoint's bx configuration: large messages
// (MiB tensors) go by rendezvous above the 8 KiB eager size, up to 4 MiB.
var DefaultServerBX = bx.Config{Lanes: 2, Credits: 64, MaxPeers: 32, MaxMessage: 4 << 20}

// bxDefaults is c with its zero Lanes, Credits, MaxPeers and MaxMessage
// taken from def.
func bxDefaults(c, def bx.Config) bx.Config {
	if c.Lanes == 0 {
		c.Lanes = def.Lanes
	}
	if c.Credits == 0 {
		c.Credits = def.Credits
	}
	if c.MaxPeers == 0 {
		c.MaxPeers = def.MaxPeers
	}
	if c.MaxMessage == 0 {
		c.MaxMessage = def.MaxMessage
	}
	return c
}

// Server serves one shard over one transport. Make one with NewServer:
// a nil or zero Server serves nothing, and its Close returns an error that
// is goverbs.ErrNil.
type Server struct {
	store *Store
	inc   uint64
	cfg   ServerConfig
	addr  net.Addr

	ep *bx.Endpoint
	// respMax (rdma): bx's MaxMessage, the largest response the
	// endpoint sends; a pull whose response is larger is refused before
	// it is built (ErrTooLarge). 0: no bound (tcp).
	respMax int
	ln      net.Listener

	requests, errs atomic.Uint64
	ops            opStats // per operation (metrics.go)
	mu             sync.Mutex
	conns          map[net.Conn]struct{}
	wg             sync.WaitGroup
	closed         atomic.Bool
	done           chan struct{} // tcp: closed by Close (ends acceptTCP's back-off)
}

// NewServer starts a server with an empty store.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	s := &Server{store: NewStore(cfg.Store), cfg: cfg, conns: map[net.Conn]struct{}{}}
	var b [8]byte
	rand.Read(b[:])
	s.inc = binary.LittleEndian.Uint64(b[:]) | 1
	if s.cfg.MaxFrame <= 0 {
		s.cfg.MaxFrame = cfg.BX.MaxMessage
		if s.cfg.MaxFrame <= 0 {
			s.cfg.MaxFrame = DefaultServerBX.MaxMessage
		}
	}
	switch cfg.Transport {
	case "rdma":
		c := bxDefaults(cfg.BX, DefaultServerBX)
		c.Token = cfg.Token
		c.Device = cfg.Device
		if c.Device == "" {
			host, _, _ := net.SplitHostPort(cfg.Listen)
			d, err := DeviceForIP(host)
			if err != nil {
				return nil, err
			}
			c.Device = d
		}
		ep, err := bx.New(c)
		if err != nil {
			return nil, fmt.Errorf("ps: server: %w", err)
		}
		for st := range Streams {
			ep.Handle(uint32(st), s.bxHandle)
			ep.HandleInline(uint32(Streams+st), s.bxHandle)
		}
		addr, err := ep.Listen(cfg.Listen)
		if err != nil {
			ep.Close()
			return nil, fmt.Errorf("ps: server: %w", err)
		}
		s.ep, s.addr, s.respMax = ep, addr, c.MaxMessage
	case "tcp":
		ln, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("ps: server: %w", err)
		}
		s.ln, s.addr, s.done = ln, ln.Addr(), make(chan struct{})
		s.wg.Add(1)
		go s.acceptTCP()
	}
	return s, nil
}

// Addr is the address clients dial.
func (s *Server) Addr() net.Addr { return s.orZero().addr }

// Store is the server's shard.
func (s *Server) Store() *Store { return s.orZero().store }

// Incarnation identifies this run of the server; a restarted server has a
// new one.
func (s *Server) Incarnation() uint64 { return s.orZero().inc }

// Endpoint is the bx endpoint (rdma), or nil.
func (s *Server) Endpoint() *bx.Endpoint { return s.orZero().ep }

// Close stops serving.
func (s *Server) Close() error {
	if s.bad() {
		return errNilServer
	}
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	var err error
	if s.ep != nil {
		err = s.ep.Close()
	}
	if s.ln != nil {
		close(s.done)
		err = s.ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
	}
	s.wg.Wait()
	return err
}

func (s *Server) bxHandle(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
	// The request is decoded in place in the receive buffer it landed in,
	// and the response is built in place in the send buffer bx posts
	// (Msg.Reply): no allocation, no copy. A response that outgrows it
	// (append moves it) is copied by bx, as is any other slice.
	b, err := req.Reply(s.respSize(req.Data()))
	if err != nil {
		return s.Handle(req.Data(), nil), nil
	}
	return s.Handle(req.Data(), b[:0]), nil
}

// respSize is the size of the response to an encoded request: for a
// well-formed pull its rows, up to 64 KiB (what a request claims is not
// trusted further: append grows a larger one); else room for a push's
// counts or an error.
func (s *Server) respSize(req []byte) int {
	const small, most = 256, 64 << 10
	if len(req) < 4 || req[1] != byte(OpPull) && req[1] != byte(OpPullDense) {
		return small
	}
	body := req[min(len(req), 4+int(req[3])):]
	n := uint64(0)
	switch {
	case req[1] == byte(OpPullDense) && len(body) >= 4:
		n = uint64(binary.LittleEndian.Uint32(body))
	case req[1] == byte(OpPull) && len(body) >= 8:
		n = uint64(binary.LittleEndian.Uint32(body)) * uint64(min(binary.LittleEndian.Uint32(body[4:]), uint32(len(body)/8)))
	}
	return respHeader + 8 + int(min(4*n, most))
}

// Handle serves one encoded request and appends the encoded response to b.
// Every failure, a panic included, becomes an error response: nothing a
// client sends stops the server.
func (s *Server) Handle(req, b []byte) (out []byte) {
	if s.bad() {
		return nil
	}
	base := len(b)
	s.requests.Add(1)
	start := time.Now()
	var op Op // 0 until the request decodes
	failed := false
	defer func() {
		if r := recover(); r != nil {
			s.errs.Add(1)
			failed = true
			out = appendErrResp(b[:base], s.inc, fmt.Errorf("internal error: %v", r))
		}
		s.ops.observe(op, time.Since(start), failed)
	}()
	r, err := decodeRequest(req)
	if err == nil {
		op = r.Op
		b, err = s.serve(&r, appendRespHead(b, s.inc))
	}
	if err != nil {
		s.errs.Add(1)
		failed = true
		return appendErrResp(b[:base], s.inc, err)
	}
	return b
}

func (s *Server) serve(r *Request, b []byte) ([]byte, error) {
	switch r.Op {
	case OpPull:
		if err := s.fits(r, respHeader+8+4*r.N*r.Dim); err != nil {
			return b, err
		}
		return s.store.pullReq(r, b)
	case OpPullDense:
		if err := s.fits(r, respHeader+4+4*r.N); err != nil {
			return b, err
		}
		return s.store.pullDenseReq(r, b)
	case OpPush, OpPushDense:
		var a, k int
		var err error
		if r.Op == OpPush {
			a, k, err = s.store.pushReq(r)
		} else {
			a, k, err = s.store.pushDenseReq(r)
		}
		if err != nil {
			return b, err
		}
		return appendU32(appendU32(b, uint32(a)), uint32(k)), nil
	case OpDefine:
		return b, s.store.Define(r.Spec)
	case OpStats:
		u, sy := CPUTime()
		b = binary.LittleEndian.AppendUint64(b, uint64(u))
		b = binary.LittleEndian.AppendUint64(b, uint64(sy))
		b = binary.LittleEndian.AppendUint64(b, s.requests.Load())
		return binary.LittleEndian.AppendUint64(b, s.errs.Load()), nil
	}
	return b, errorf(codeMalformed, "unknown op %d", r.Op)
}

// fits refuses a pull whose response of n bytes the transport would not
// send (bx's MaxMessage): built, it was replaced by bx's own error, which
// the client saw as ErrInternal, while tcp served the same pull. r's
// counts are the decoder's, bounded, so n does not overflow.
func (s *Server) fits(r *Request, n int) error {
	if s.respMax > 0 && n > s.respMax {
		return errorf(codeTooLarge, "%v of %q: a response of %d bytes exceeds the server's bx MaxMessage of %d", r.Op, r.name, n, s.respMax)
	}
	return nil
}

// CPUTime is the process's user and system CPU time (getrusage).
func CPUTime() (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// acceptRetry reports whether an Accept error passes: descriptors or
// memory ran out for a while, or a connection went before it was taken.
func acceptRetry(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// maxFrameSkip is the largest request frame a ps client can write (a
// push of the wire's most keys and values, with its header): a frame over
// MaxFrame up to it is read and dropped after the refusal, one over it
// ends the connection.
const maxFrameSkip = 8*maxWireKeys + 4*maxWireFloats + 512

// acceptTCP accepts connections until Close. An Accept that fails
// otherwise (EMFILE, ENFILE, ENOBUFS: descriptors or memory run out under
// many workers' pools) is retried after a back-off, as net/http does: the
// server goes on accepting once they are free again, instead of staying
// open and taking no new connection for good.
func (s *Server) acceptTCP() {
	defer s.wg.Done()
	var delay time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if s.closed.Load() || errors.Is(err, net.ErrClosed) || !acceptRetry(err) {
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-s.done:
				t.Stop()
				return
			}
			continue
		}
		delay = 0
		s.mu.Lock()
		if s.closed.Load() {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serveTCP(c)
	}
}

// serveTCP answers one connection's frames in order: u32 length, request;
// u32 length, response.
func (s *Server) serveTCP(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	br := bufio.NewReaderSize(c, 64<<10)
	var req, resp []byte
	var lb [4]byte
	for {
		if _, err := io.ReadFull(br, lb[:]); err != nil {
			return
		}
		n := int(binary.LittleEndian.Uint32(lb[:]))
		if n > s.cfg.MaxFrame {
			// Too large to read: answer, then skip its bytes (read, not
			// kept) and go on. Closing with them unread would reset the
			// connection, and the answer with it: the client, which
			// writes its whole request before it reads, would see EOF.
			resp = appendErrResp(append(resp[:0], 0, 0, 0, 0), s.inc,
				errorf(codeTooLarge, "request of %d bytes exceeds the server's %d-byte limit", n, s.cfg.MaxFrame))
			binary.LittleEndian.PutUint32(resp, uint32(len(resp)-4))
			if _, err := c.Write(resp); err != nil {
				return
			}
			if n > maxFrameSkip {
				// No ps client writes such a frame: not a ps peer, or
				// the stream is out of step. Not read.
				return
			}
			if _, err := br.Discard(n); err != nil {
				return
			}
			continue
		}
		var in []byte
		peeked := n <= br.Size()
		if peeked {
			// Decoded in place in the reader's buffer: no copy.
			p, err := br.Peek(n)
			if err != nil {
				return
			}
			in = p
		} else {
			var err error
			if req, err = readFrame(br, req, n); err != nil {
				return
			}
			in = req
		}
		resp = s.Handle(in, append(resp[:0], 0, 0, 0, 0))
		if peeked {
			br.Discard(n)
		}
		binary.LittleEndian.PutUint32(resp, uint32(len(resp)-4))
		if _, err := c.Write(resp); err != nil {
			return
		}
		if cap(req) > 1<<20 {
			req = nil // do not pin a large buffer per idle connection
		}
		if cap(resp) > 1<<20 {
			resp = nil
		}
	}
}

// readFrame reads n bytes into buf's array, grown as the bytes arrive
// (four times as large each time, from 64 KiB), not before: n is the
// peer's claim. A buffer of n made on the 4 bytes of a frame's length, on
// each of any number of connections that then send nothing, was MaxFrame
// of memory apiece for nothing sent; now a peer makes this side allocate
// at most about four times what it sent, and a large frame costs about
// 1.33 times its size in allocations and a third of it in copies (the
// factor 2 doubled both). A grown buffer's capacity is at most n (append's
// rounding took a frame of 1 MiB to 1.18 MiB: past the 1 MiB a connection
// keeps, so it was made again for every such frame).
func readFrame(r io.Reader, buf []byte, n int) ([]byte, error) {
	buf = buf[:0]
	for len(buf) < n {
		if len(buf) == cap(buf) {
			nb := make([]byte, len(buf), min(n, max(4*len(buf), 64<<10)))
			buf = nb[:copy(nb, buf)]
		}
		m, err := io.ReadFull(r, buf[len(buf):min(n, cap(buf))])
		buf = buf[:len(buf)+m]
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// ErrNoDevice is returned when no RDMA device has the address asked for.
var ErrNoDevice = errors.New("ps: no ACTIVE RDMA device")
