package ps

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/sentinel"
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
	VNodes int // ring virtual nodes per server (DefaultVNodes; at most MaxVNodes)
}

// DefaultClientBX is a worker endpoint's bx configuration.
var DefaultClientBX = bx.Config{Lanes: 2, Credits: 64, MaxMessage: 4 << 20}

// Client is a worker's handle on the servers. It is safe for concurrent
// use by many goroutines. Make one with Dial: the methods of a nil or zero
// Client that return an error return one that is goverbs.ErrNil.
type Client struct {
	ring    *Ring
	t       transport
	n       int
	inc     []atomic.Uint64
	mu      sync.Mutex
	specs   map[string]Spec
	ops     opStats   // per operation (metrics.go)
	batches sync.Pool // *batch
}

// transport carries one request to server i: it sends k (k.size bytes,
// written by k.fill) and hands the response to k.finish while the bytes
// are valid. It returns only its own failures; the response's are k's.
type transport interface {
	call(ctx context.Context, i int, k *call) error
	close() error
}

// call is one request to one server and what becomes of its response.
// Pull and Push take theirs from a pool (Client.calls) and build the
// request straight from the caller's keys and values: in steady state a
// call allocates nothing. Define, Stats and Raw send encoded bytes (raw).
type call struct {
	op    Op
	name  string
	dim   int
	keys  []uint64
	pos   []int32   // the batch positions for this server; nil: all of keys
	vals  []float32 // OpPull, OpPullDense: out; OpPush, OpPushDense: grads
	raw   []byte    // the encoded request (Define, Stats, Raw), if isRaw
	isRaw bool
	read  func(body []byte) error

	res PushResult // OpPush, OpPushDense
	inc uint64     // the response's server incarnation (0: none)
	err error      // the response's

	scratch []byte // rdma: a small request's bytes (transport.go)
}

func (k *call) nkeys() int {
	if k.pos != nil {
		return len(k.pos)
	}
	return len(k.keys)
}

func (k *call) size() int {
	switch {
	case k.isRaw:
		return len(k.raw)
	case k.op == OpPull:
		return pullSize(k.name, k.nkeys())
	case k.op == OpPush:
		return pushSize(k.name, k.nkeys(), k.dim)
	case k.op == OpPullDense:
		return pullDenseSize(k.name)
	}
	return pushDenseSize(k.name, len(k.vals))
}

// inline says whether the server may serve k on its progress goroutine
// (bx.HandleInline): a pull or push of a few KiB, whose handling is a
// short copy or update under a row lock. Larger ones and Define and
// Stats go to its worker pool.
func (k *call) inline() bool {
	const most = 16 << 10
	if k.isRaw {
		return false
	}
	switch k.op {
	case OpPull:
		return k.size() <= most && 4*k.nkeys()*k.dim <= most
	case OpPullDense:
		return 4*len(k.vals) <= most
	}
	return k.size() <= most
}

// fill writes the request into b (len k.size()).
func (k *call) fill(b []byte) {
	if k.isRaw {
		copy(b, k.raw)
		return
	}
	o := encodeHead(b, k.op, k.name)
	switch k.op {
	case OpPull, OpPush:
		nk := k.nkeys()
		binary.LittleEndian.PutUint32(b[o:], uint32(k.dim))
		binary.LittleEndian.PutUint32(b[o+4:], uint32(nk))
		o += 8
		g := o + 8*nk
		if k.pos == nil {
			putKeys(b[o:], k.keys)
			if k.op == OpPush {
				putFloats(b[g:], k.vals)
			}
			return
		}
		dim := k.dim
		for j, p := range k.pos {
			binary.LittleEndian.PutUint64(b[o+8*j:], k.keys[p])
			if k.op == OpPush {
				putFloats(b[g+4*j*dim:], k.vals[int(p)*dim:(int(p)+1)*dim])
			}
		}
	case OpPullDense:
		binary.LittleEndian.PutUint32(b[o:], uint32(len(k.vals)))
	case OpPushDense:
		binary.LittleEndian.PutUint32(b[o:], uint32(len(k.vals)))
		putFloats(b[o+4:], k.vals)
	}
}

// finish decodes server i's response into k, while resp is valid: rows
// go straight from it (on rdma, the registered buffer it landed in) into
// the caller's slice.
func (k *call) finish(resp []byte, i int) {
	r, err := decodeResponse(resp, i)
	k.inc = r.inc
	if err == nil {
		err = k.body(r.body)
	}
	k.err = err
}

func (k *call) body(body []byte) error {
	if k.read != nil || k.isRaw {
		if k.read == nil {
			return nil
		}
		return k.read(body)
	}
	switch k.op {
	case OpPull:
		nk, dim := k.nkeys(), k.dim
		if len(body) != 8+4*nk*dim || int(binary.LittleEndian.Uint32(body)) != dim || int(binary.LittleEndian.Uint32(body[4:])) != nk {
			return fmt.Errorf("%w: pull response of %d bytes for %d keys of dim %d", ErrMalformed, len(body), nk, dim)
		}
		rows := body[8:]
		if k.pos == nil {
			getFloats(k.vals, rows)
			return nil
		}
		for j, p := range k.pos {
			getFloats(k.vals[int(p)*dim:(int(p)+1)*dim], rows[4*j*dim:])
		}
		return nil
	case OpPullDense:
		if len(body) != 4+4*len(k.vals) || int(binary.LittleEndian.Uint32(body)) != len(k.vals) {
			return fmt.Errorf("%w: dense response of %d bytes for %d values", ErrMalformed, len(body), len(k.vals))
		}
		getFloats(k.vals, body[4:])
		return nil
	}
	if len(body) != 8 {
		return fmt.Errorf("%w: push response of %d bytes", ErrMalformed, len(body))
	}
	k.res.Applied += int(binary.LittleEndian.Uint32(body))
	k.res.Skipped += int(binary.LittleEndian.Uint32(body[4:]))
	return nil
}

// batch is a Pull's or Push's per-server state, pooled.
type batch struct {
	calls []call
	by    [][]int32
	wg    sync.WaitGroup
}

func (c *Client) getBatch() *batch {
	if b, _ := c.batches.Get().(*batch); b != nil {
		return b
	}
	b := &batch{calls: make([]call, c.n), by: make([][]int32, c.n)}
	return b
}

func (c *Client) putBatch(b *batch) {
	for i := range b.calls {
		k := &b.calls[i]
		if cap(k.scratch) > smallRequest {
			k.scratch = nil
		}
		*k = call{scratch: k.scratch}
		if cap(b.by[i]) > 1<<16 {
			b.by[i] = nil
		}
		b.by[i] = b.by[i][:0]
	}
	c.batches.Put(b)
}

// Dial connects to the servers (lazily: a server is dialled on first use).
func Dial(cfg ClientConfig) (*Client, error) {
	if len(cfg.Servers) == 0 {
		return nil, errors.New("ps: no servers")
	}
	if len(cfg.Servers) > MaxServers {
		return nil, fmt.Errorf("ps: %d servers: at most MaxServers (%d)", len(cfg.Servers), MaxServers)
	}
	if cfg.VNodes > MaxVNodes || cfg.VNodes < 0 {
		return nil, fmt.Errorf("ps: VNodes %d outside 1..MaxVNodes (%d; 0: DefaultVNodes)", cfg.VNodes, MaxVNodes)
	}
	if cfg.Pool < 0 {
		return nil, fmt.Errorf("ps: Pool %d: want idle connections per server > 0 (0: the default)", cfg.Pool)
	}
	for i, a := range cfg.Servers {
		if a == "" {
			return nil, fmt.Errorf("ps: server %d: empty address (want host:port)", i)
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("ps: server %d: %v", i, err)
		}
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
func (c *Client) Close() error {
	if c.bad() {
		return errNilClient
	}
	return c.t.close()
}

// Ring is the placement of keys and tensors (nil for a nil or zero
// Client).
func (c *Client) Ring() *Ring {
	if c.bad() {
		return nil
	}
	return c.ring
}

// call runs k on server i.
func (c *Client) call(ctx context.Context, i int, k *call) error {
	k.inc, k.err = 0, nil
	if err := c.t.call(ctx, i, k); err != nil {
		return fmt.Errorf("ps: server %d: %w", i, err)
	}
	err := k.err
	if k.inc != 0 {
		if old := c.inc[i].Swap(k.inc); old != 0 && old != k.inc {
			// A new incarnation: its shard came back empty. Re-define what
			// this client defined there, and say so once.
			inc := k.inc
			if rerr := c.redefine(ctx, i); rerr != nil {
				return fmt.Errorf("%w (server %d, incarnation %#x -> %#x): %w; re-defining its parameters there failed: %w", ErrStateLost, i, old, inc, errOrOK(err), rerr)
			}
			return fmt.Errorf("%w (server %d, incarnation %#x -> %#x): %w", ErrStateLost, i, old, inc, errOrOK(err))
		}
	}
	return err
}

// callRaw sends an encoded request to server i; read (if not nil) gets the
// response body.
func (c *Client) callRaw(ctx context.Context, i int, req []byte, read func([]byte) error) error {
	k := call{raw: req, isRaw: true, read: read}
	return c.call(ctx, i, &k)
}

var errOK = errors.New("the request itself succeeded on the new shard")

func errOrOK(err error) error {
	if err == nil {
		return errOK
	}
	return err
}

// errNilCtx is what a method given a nil context returns (the transports
// read its deadline and Done channel).
func errNilCtx(method string) error {
	return fmt.Errorf("ps: %s: nil context", method)
}

// checkName refuses a table or tensor name Define would not accept: the
// wire carries its length in one byte.
func checkName(method, what, name string) error {
	if name == "" || len(name) > MaxName {
		return fmt.Errorf("%w: %s: %s name of %d bytes outside 1..%d", ErrMalformed, method, what, len(name), MaxName)
	}
	return nil
}

// redefine defines again on server i (restarted, empty) what this client
// defined there, and returns what failed (the caller reports it with
// ErrStateLost: a parameter left undefined is not silently lost).
func (c *Client) redefine(ctx context.Context, i int) error {
	c.mu.Lock()
	var specs []Spec
	for _, s := range c.specs {
		if s.Kind == Sparse || c.ring.Tensor(s.Name) == i {
			specs = append(specs, s)
		}
	}
	c.mu.Unlock()
	var errs []error
	for _, s := range specs {
		if req, err := EncodeDefine(s); err == nil { // Define validated s
			if err := c.callRaw(ctx, i, req, nil); err != nil {
				errs = append(errs, fmt.Errorf("%q: %w", s.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Define creates parameters on the servers that hold them (a sparse table
// on every server, a dense tensor on its owner). Defining again with the
// same spec is harmless.
func (c *Client) Define(ctx context.Context, specs ...Spec) (err error) {
	if c.bad() {
		return errNilClient
	}
	defer c.ops.done(OpDefine, time.Now(), &err)
	if ctx == nil {
		return errNilCtx("Define")
	}
	for _, s := range specs {
		if err := s.validate(); err != nil {
			return fmt.Errorf("ps: define: %w", err)
		}
		req, err := EncodeDefine(s)
		if err != nil {
			return fmt.Errorf("ps: define: %w", err)
		}
		if s.Kind == Dense {
			if err := c.callRaw(ctx, c.ring.Tensor(s.Name), req, nil); err != nil {
				return err
			}
		} else {
			if err := c.each(func(i int) error { return c.callRaw(ctx, i, req, nil) }); err != nil {
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

// split groups batch positions by server into b.by (reused).
func (c *Client) split(b *batch, table string, keys []uint64) {
	salt := hashString(table)
	for i, k := range keys {
		s := c.ring.lookup(mix(k ^ salt))
		b.by[s] = append(b.by[s], int32(i))
	}
}

// sparse runs a pull or push of keys: one call to the one server, or the
// batch split per server (positions, no copy of keys or values) and the
// servers asked concurrently, the last on this goroutine.
func (c *Client) sparse(ctx context.Context, op Op, table string, dim int, keys []uint64, vals []float32) (PushResult, error) {
	b := c.getBatch()
	defer c.putBatch(b)
	if c.n == 1 {
		k := &b.calls[0]
		*k = call{op: op, name: table, dim: dim, keys: keys, vals: vals, scratch: k.scratch}
		err := c.call(ctx, 0, k)
		return k.res, err
	}
	c.split(b, table, keys)
	last := -1
	for i := range c.n {
		if len(b.by[i]) > 0 {
			last = i
		}
	}
	errs := make([]error, 0)
	var mu sync.Mutex
	run := func(i int) {
		k := &b.calls[i]
		*k = call{op: op, name: table, dim: dim, keys: keys, pos: b.by[i], vals: vals, scratch: k.scratch}
		if err := c.call(ctx, i, k); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}
	for i := range c.n {
		if len(b.by[i]) == 0 || i == last {
			continue
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			run(i)
		}()
	}
	run(last)
	b.wg.Wait()
	var res PushResult
	for i := range c.n {
		res.Applied += b.calls[i].res.Applied
		res.Skipped += b.calls[i].res.Skipped
	}
	return res, errors.Join(errs...)
}

// Pull reads the rows of keys of a sparse table into out, which holds
// len(keys)*dim values: keys are batched per server, the servers asked
// concurrently. Rows are decoded straight from the response buffer (on
// rdma, the registered buffer the response landed in) into out.
func (c *Client) Pull(ctx context.Context, table string, keys []uint64, out []float32) (err error) {
	if c.bad() {
		return errNilClient
	}
	defer c.ops.done(OpPull, time.Now(), &err)
	if ctx == nil {
		return errNilCtx("Pull")
	}
	if err := checkName("Pull", "table", table); err != nil {
		return err
	}
	if len(keys) == 0 {
		if len(out) != 0 {
			return fmt.Errorf("%w: 0 keys cannot fill %d values", ErrDim, len(out))
		}
		return nil
	}
	if len(out)%len(keys) != 0 || len(out) == 0 {
		return fmt.Errorf("%w: %d keys cannot fill %d values", ErrDim, len(keys), len(out))
	}
	_, err = c.sparse(ctx, OpPull, table, len(out)/len(keys), keys, out)
	return err
}

// PushResult counts what the servers applied.
type PushResult struct {
	Applied, Skipped int // rows (dense: chunks); Skipped by the NaN skip policy
}

// Push sends gradients (len(keys)*dim values, row i for keys[i]) for the
// servers' optimizers to apply, batched per server.
func (c *Client) Push(ctx context.Context, table string, keys []uint64, grads []float32) (res PushResult, err error) {
	if c.bad() {
		return res, errNilClient
	}
	defer c.ops.done(OpPush, time.Now(), &err)
	if ctx == nil {
		return res, errNilCtx("Push")
	}
	if err := checkName("Push", "table", table); err != nil {
		return res, err
	}
	if len(keys) == 0 {
		if len(grads) != 0 {
			return res, fmt.Errorf("%w: 0 keys cannot take %d gradient values", ErrDim, len(grads))
		}
		return res, nil
	}
	if len(grads)%len(keys) != 0 || len(grads) == 0 {
		return res, fmt.Errorf("%w: %d keys cannot take %d gradient values", ErrDim, len(keys), len(grads))
	}
	return c.sparse(ctx, OpPush, table, len(grads)/len(keys), keys, grads)
}

// dense runs a dense pull or push on the tensor's server.
func (c *Client) dense(ctx context.Context, op Op, name string, vals []float32) (PushResult, error) {
	b := c.getBatch()
	defer c.putBatch(b)
	k := &b.calls[0]
	*k = call{op: op, name: name, vals: vals, scratch: k.scratch}
	err := c.call(ctx, c.ring.Tensor(name), k)
	return k.res, err
}

// PullDense reads a dense tensor (len(out) values) from its server.
func (c *Client) PullDense(ctx context.Context, name string, out []float32) (err error) {
	if c.bad() {
		return errNilClient
	}
	defer c.ops.done(OpPullDense, time.Now(), &err)
	if ctx == nil {
		return errNilCtx("PullDense")
	}
	if err := checkName("PullDense", "tensor", name); err != nil {
		return err
	}
	_, err = c.dense(ctx, OpPullDense, name, out)
	return err
}

// PushDense sends a dense tensor's gradient to its server.
func (c *Client) PushDense(ctx context.Context, name string, grads []float32) (res PushResult, err error) {
	if c.bad() {
		return res, errNilClient
	}
	defer c.ops.done(OpPushDense, time.Now(), &err)
	if ctx == nil {
		return res, errNilCtx("PushDense")
	}
	if err := checkName("PushDense", "tensor", name); err != nil {
		return res, err
	}
	return c.dense(ctx, OpPushDense, name, grads)
}

// ServerStats is what a server reports about itself.
type ServerStats struct {
	User, System     time.Duration // the server process's CPU time (getrusage)
	Requests, Errors uint64
	Incarnation      uint64
}

// Stats asks every server for its counters.
func (c *Client) Stats(ctx context.Context) (_ []ServerStats, err error) {
	if c.bad() {
		return nil, errNilClient
	}
	defer c.ops.done(OpStats, time.Now(), &err)
	if ctx == nil {
		return nil, errNilCtx("Stats")
	}
	out := make([]ServerStats, c.n)
	req := EncodeStats()
	err = c.each(func(i int) error {
		// The incarnation is the response's (k.inc, set with the body):
		// the client's record of it is updated only after read runs.
		var k call
		k = call{raw: req, isRaw: true, read: func(body []byte) error {
			if len(body) != 32 {
				return fmt.Errorf("%w: stats response of %d bytes", ErrMalformed, len(body))
			}
			out[i] = ServerStats{User: time.Duration(binary.LittleEndian.Uint64(body)), System: time.Duration(binary.LittleEndian.Uint64(body[8:])),
				Requests: binary.LittleEndian.Uint64(body[16:]), Errors: binary.LittleEndian.Uint64(body[24:]), Incarnation: k.inc}
			return nil
		}}
		return c.call(ctx, i, &k)
	})
	return out, err
}

// Raw sends an encoded request to server i (0..n-1 of the n servers) and
// returns the response body, or the server's error: for tests and tools
// that need to send what Client would not.
func (c *Client) Raw(ctx context.Context, i int, req []byte) (_ []byte, err error) {
	if c.bad() {
		return nil, errNilClient
	}
	op := Op(0) // malformed, unless the request names an op
	if len(req) > 1 {
		op = Op(req[1])
	}
	defer c.ops.done(op, time.Now(), &err)
	if ctx == nil {
		return nil, errNilCtx("Raw")
	}
	if i < 0 || i >= c.n {
		return nil, fmt.Errorf("ps: Raw: server %d outside 0..%d (%d servers)", i, c.n-1, c.n)
	}
	var out []byte
	err = c.callRaw(ctx, i, req, func(body []byte) error {
		out = append([]byte(nil), body...)
		return nil
	})
	return out, err
}

// Pending is a pull or push in flight (PullAsync, PushAsync). A worker
// keeps several outstanding, as parameter-server clients do (compute on
// one batch while the next one's rows are on their way), and waits for
// each when it needs it.
type Pending struct {
	done chan struct{}
	res  PushResult
	err  error
}

// Wait waits for the operation and returns its result (a pull's: zero
// PushResult) and error. It may be called more than once.
func (p *Pending) Wait() (PushResult, error) {
	if p.bad() {
		return PushResult{}, errNilPending
	}
	<-p.done
	return p.res, p.err
}

// Done is closed when the operation is over; a nil or zero Pending's is
// closed.
func (p *Pending) Done() <-chan struct{} {
	if p.bad() {
		return sentinel.Done
	}
	return p.done
}

// PullAsync starts Pull(ctx, table, keys, out) and returns at once: keys
// and out must stay untouched until it is done.
func (c *Client) PullAsync(ctx context.Context, table string, keys []uint64, out []float32) *Pending {
	p := &Pending{done: make(chan struct{})}
	if ctx == nil && !c.bad() {
		p.err = errNilCtx("PullAsync")
		close(p.done)
		return p
	}
	go func() {
		p.err = c.Pull(ctx, table, keys, out)
		close(p.done)
	}()
	return p
}

// PushAsync starts Push(ctx, table, keys, grads) and returns at once: keys
// and grads must stay untouched until it is done.
func (c *Client) PushAsync(ctx context.Context, table string, keys []uint64, grads []float32) *Pending {
	p := &Pending{done: make(chan struct{})}
	if ctx == nil && !c.bad() {
		p.err = errNilCtx("PushAsync")
		close(p.done)
		return p
	}
	go func() {
		p.res, p.err = c.Push(ctx, table, keys, grads)
		close(p.done)
	}()
	return p
}
