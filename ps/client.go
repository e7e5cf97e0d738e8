package ps

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goverbs/goverbs/bx"
)

// ClientConfig configures a Client.
type ClientConfig struct {
	Transport string   // "rdma" or "tcp"
	Servers   []string // host:port of every server; the order defines the ring
	Device    string   // rdma: the local RDMA device (required)
	Token     []byte   // rdma: bx token
	BX        bx.Config
	// Pool bounds idle TCP connections per server (default 64); calls
	// beyond it dial more, one call per connection at a time.
	Pool   int
	VNodes int // ring virtual nodes per server (DefaultVNodes)
}

// DefaultClientBX is a worker endpoint's bx configuration.
var DefaultClientBX = bx.Config{Lanes: 2, Credits: 64, MaxMessage: 4 << 20}

// Client is a worker's handle on the servers. It is safe for concurrent
// use by many goroutines.
type Client struct {
	ring  *Ring
	t     transport
	n     int
	inc   []atomic.Uint64
	mu    sync.Mutex
	specs map[string]Spec
	ops   opStats // per operation (metrics.go)
}

// transport carries one request to server i and returns its response,
// valid until done is called.
type transport interface {
	call(ctx context.Context, i, n int, fill func([]byte)) (resp []byte, done func(), err error)
	close() error
}

// Dial connects to the servers (lazily: a server is dialled on first use).
func Dial(cfg ClientConfig) (*Client, error) {
	if len(cfg.Servers) == 0 {
		return nil, errors.New("ps: no servers")
	}
	c := &Client{ring: NewRing(len(cfg.Servers), cfg.VNodes), n: len(cfg.Servers),
		inc: make([]atomic.Uint64, len(cfg.Servers)), specs: map[string]Spec{}}
	switch cfg.Transport {
	case "rdma":
		t, err := newRDMAClient(cfg)
		if err != nil {
			return nil, err
		}
		c.t = t
	case "tcp":
		c.t = newTCPClient(cfg)
	default:
		return nil, fmt.Errorf("ps: transport %q: want rdma or tcp", cfg.Transport)
	}
	return c, nil
}

// Close closes every connection.
func (c *Client) Close() error { return c.t.close() }

// Ring is the placement of keys and tensors.
func (c *Client) Ring() *Ring { return c.ring }

// call runs one request on server i and hands the decoded response body to
// read, while the response buffer is still valid.
func (c *Client) call(ctx context.Context, i, n int, fill func([]byte), read func([]byte) error) error {
	resp, done, err := c.t.call(ctx, i, n, fill)
	if err != nil {
		return fmt.Errorf("ps: server %d: %w", i, err)
	}
	r, err := decodeResponse(resp, i)
	if err == nil && read != nil {
		err = read(r.body)
	}
	done()
	if r.inc != 0 {
		if old := c.inc[i].Swap(r.inc); old != 0 && old != r.inc {
			// A new incarnation: its shard came back empty. Re-define what
			// this client defined there, and say so once.
			c.redefine(ctx, i)
			return fmt.Errorf("%w (server %d, incarnation %#x -> %#x): %w", ErrStateLost, i, old, r.inc, errOrOK(err))
		}
	}
	return err
}

var errOK = errors.New("the request itself succeeded on the new shard")

func errOrOK(err error) error {
	if err == nil {
		return errOK
	}
	return err
}

func (c *Client) redefine(ctx context.Context, i int) {
	c.mu.Lock()
	var specs []Spec
	for _, s := range c.specs {
		if s.Kind == Sparse || c.ring.Tensor(s.Name) == i {
			specs = append(specs, s)
		}
	}
	c.mu.Unlock()
	for _, s := range specs {
		req := EncodeDefine(s)
		c.call(ctx, i, len(req), func(b []byte) { copy(b, req) }, nil)
	}
}

// Define creates parameters on the servers that hold them (a sparse table
// on every server, a dense tensor on its owner). Defining again with the
// same spec is harmless.
func (c *Client) Define(ctx context.Context, specs ...Spec) (err error) {
	defer c.ops.done(OpDefine, time.Now(), &err)
	for _, s := range specs {
		if err := s.validate(); err != nil {
			return fmt.Errorf("ps: define: %w", err)
		}
		req := EncodeDefine(s)
		fill := func(b []byte) { copy(b, req) }
		if s.Kind == Dense {
			if err := c.call(ctx, c.ring.Tensor(s.Name), len(req), fill, nil); err != nil {
				return err
			}
		} else {
			if err := c.each(func(i int) error { return c.call(ctx, i, len(req), fill, nil) }); err != nil {
				return err
			}
		}
		c.mu.Lock()
		c.specs[s.Name] = s
		c.mu.Unlock()
	}
	return nil
}

// each runs f for every server concurrently and returns the first error.
func (c *Client) each(f func(i int) error) error {
	return c.some(c.n, func(i int) bool { return true }, f)
}

// some runs f(i) for the servers with want(i), concurrently, the last one
// on the calling goroutine.
func (c *Client) some(n int, want func(int) bool, f func(int) error) error {
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	last := -1
	for i := range n {
		if want(i) {
			last = i
		}
	}
	for i := range n {
		if !want(i) {
			continue
		}
		if i == last {
			if err := f(i); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(i); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// split groups batch positions by server.
func (c *Client) split(table string, keys []uint64) [][]int32 {
	if c.n == 1 {
		return nil
	}
	salt := hashString(table)
	by := make([][]int32, c.n)
	for i, k := range keys {
		s := c.ring.lookup(mix(k ^ salt))
		by[s] = append(by[s], int32(i))
	}
	return by
}

// Pull reads the rows of keys of a sparse table into out, which holds
// len(keys)*dim values: keys are batched per server, the servers asked
// concurrently. Rows are decoded straight from the response buffer (on
// rdma, the registered buffer the response landed in) into out.
func (c *Client) Pull(ctx context.Context, table string, keys []uint64, out []float32) (err error) {
	defer c.ops.done(OpPull, time.Now(), &err)
	if len(keys) == 0 {
		return nil
	}
	if len(out)%len(keys) != 0 || len(out) == 0 {
		return fmt.Errorf("%w: %d keys cannot fill %d values", ErrDim, len(keys), len(out))
	}
	dim := len(out) / len(keys)
	by := c.split(table, keys)
	one := func(i int, pos []int32) error {
		nk := len(keys)
		if pos != nil {
			nk = len(pos)
		}
		fill := func(b []byte) {
			o := encodeHead(b, OpPull, table)
			binary.LittleEndian.PutUint32(b[o:], uint32(dim))
			binary.LittleEndian.PutUint32(b[o+4:], uint32(nk))
			o += 8
			if pos == nil {
				putKeys(b[o:], keys)
				return
			}
			for j, p := range pos {
				binary.LittleEndian.PutUint64(b[o+8*j:], keys[p])
			}
		}
		read := func(body []byte) error {
			if len(body) != 8+4*nk*dim || int(binary.LittleEndian.Uint32(body)) != dim || int(binary.LittleEndian.Uint32(body[4:])) != nk {
				return fmt.Errorf("%w: pull response of %d bytes for %d keys of dim %d", ErrMalformed, len(body), nk, dim)
			}
			rows := body[8:]
			if pos == nil {
				getFloats(out, rows)
				return nil
			}
			for j, p := range pos {
				getFloats(out[int(p)*dim:(int(p)+1)*dim], rows[4*j*dim:])
			}
			return nil
		}
		return c.call(ctx, i, pullSize(table, nk), fill, read)
	}
	if by == nil {
		return one(0, nil)
	}
	return c.some(c.n, func(i int) bool { return len(by[i]) > 0 }, func(i int) error { return one(i, by[i]) })
}

// PushResult counts what the servers applied.
type PushResult struct {
	Applied, Skipped int // rows (dense: chunks); Skipped by the NaN skip policy
}

// Push sends gradients (len(keys)*dim values, row i for keys[i]) for the
// servers' optimizers to apply, batched per server.
func (c *Client) Push(ctx context.Context, table string, keys []uint64, grads []float32) (res PushResult, err error) {
	defer c.ops.done(OpPush, time.Now(), &err)
	if len(keys) == 0 {
		return res, nil
	}
	if len(grads)%len(keys) != 0 || len(grads) == 0 {
		return res, fmt.Errorf("%w: %d keys cannot take %d gradient values", ErrDim, len(keys), len(grads))
	}
	dim := len(grads) / len(keys)
	by := c.split(table, keys)
	var mu sync.Mutex
	one := func(i int, pos []int32) error {
		nk := len(keys)
		if pos != nil {
			nk = len(pos)
		}
		fill := func(b []byte) {
			o := encodeHead(b, OpPush, table)
			binary.LittleEndian.PutUint32(b[o:], uint32(dim))
			binary.LittleEndian.PutUint32(b[o+4:], uint32(nk))
			o += 8
			if pos == nil {
				putKeys(b[o:], keys)
				putFloats(b[o+8*nk:], grads)
				return
			}
			g := o + 8*nk
			for j, p := range pos {
				binary.LittleEndian.PutUint64(b[o+8*j:], keys[p])
				putFloats(b[g+4*j*dim:], grads[int(p)*dim:(int(p)+1)*dim])
			}
		}
		return c.call(ctx, i, pushSize(table, nk, dim), fill, func(body []byte) error { return readPush(body, &res, &mu) })
	}
	if by == nil {
		err = one(0, nil)
	} else {
		err = c.some(c.n, func(i int) bool { return len(by[i]) > 0 }, func(i int) error { return one(i, by[i]) })
	}
	return res, err
}

func readPush(body []byte, res *PushResult, mu *sync.Mutex) error {
	if len(body) != 8 {
		return fmt.Errorf("%w: push response of %d bytes", ErrMalformed, len(body))
	}
	mu.Lock()
	res.Applied += int(binary.LittleEndian.Uint32(body))
	res.Skipped += int(binary.LittleEndian.Uint32(body[4:]))
	mu.Unlock()
	return nil
}

// PullDense reads a dense tensor (len(out) values) from its server.
func (c *Client) PullDense(ctx context.Context, name string, out []float32) (err error) {
	defer c.ops.done(OpPullDense, time.Now(), &err)
	fill := func(b []byte) {
		o := encodeHead(b, OpPullDense, name)
		binary.LittleEndian.PutUint32(b[o:], uint32(len(out)))
	}
	read := func(body []byte) error {
		if len(body) != 4+4*len(out) || int(binary.LittleEndian.Uint32(body)) != len(out) {
			return fmt.Errorf("%w: dense response of %d bytes for %d values", ErrMalformed, len(body), len(out))
		}
		getFloats(out, body[4:])
		return nil
	}
	return c.call(ctx, c.ring.Tensor(name), pullDenseSize(name), fill, read)
}

// PushDense sends a dense tensor's gradient to its server.
func (c *Client) PushDense(ctx context.Context, name string, grads []float32) (res PushResult, err error) {
	defer c.ops.done(OpPushDense, time.Now(), &err)
	var mu sync.Mutex
	fill := func(b []byte) {
		o := encodeHead(b, OpPushDense, name)
		binary.LittleEndian.PutUint32(b[o:], uint32(len(grads)))
		putFloats(b[o+4:], grads)
	}
	err = c.call(ctx, c.ring.Tensor(name), pushDenseSize(name, len(grads)), fill, func(body []byte) error { return readPush(body, &res, &mu) })
	return res, err
}

// ServerStats is what a server reports about itself.
type ServerStats struct {
	User, System     time.Duration // the server process's CPU time (getrusage)
	Requests, Errors uint64
	Incarnation      uint64
}

// Stats asks every server for its counters.
func (c *Client) Stats(ctx context.Context) (_ []ServerStats, err error) {
	defer c.ops.done(OpStats, time.Now(), &err)
	out := make([]ServerStats, c.n)
	req := EncodeStats()
	err = c.each(func(i int) error {
		return c.call(ctx, i, len(req), func(b []byte) { copy(b, req) }, func(body []byte) error {
			if len(body) != 32 {
				return fmt.Errorf("%w: stats response of %d bytes", ErrMalformed, len(body))
			}
			out[i] = ServerStats{User: time.Duration(binary.LittleEndian.Uint64(body)), System: time.Duration(binary.LittleEndian.Uint64(body[8:])),
				Requests: binary.LittleEndian.Uint64(body[16:]), Errors: binary.LittleEndian.Uint64(body[24:]), Incarnation: c.inc[i].Load()}
			return nil
		})
	})
	return out, err
}

// Raw sends an encoded request to server i and returns the response body,
// or the server's error: for tests and tools that need to send what Client
// would not.
func (c *Client) Raw(ctx context.Context, i int, req []byte) (_ []byte, err error) {
	op := Op(0) // malformed, unless the request names an op
	if len(req) > 1 {
		op = Op(req[1])
	}
	defer c.ops.done(op, time.Now(), &err)
	var out []byte
	err = c.call(ctx, i, len(req), func(b []byte) { copy(b, req) }, func(body []byte) error {
		out = append([]byte(nil), body...)
		return nil
	})
	return out, err
}
