package ps

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/goverbs/goverbs/internal/units"
)

// Kind is a parameter's shape.
type Kind uint8

// Kinds.
const (
	Sparse Kind = 1 // embedding table: uint64 key in [0, Rows) -> Dim float32
	Dense  Kind = 2 // one tensor of Size float32
)

// OptKind is an optimizer.
type OptKind uint8

// Optimizers, applied per row (per chunk of a dense tensor).
const (
	SGD     OptKind = 1 // w -= lr*g
	Adagrad OptKind = 2 // h += g*g; w -= lr*g/(sqrt(h)+eps)
)

// Optimizer is a parameter's update rule.
type Optimizer struct {
	Kind    OptKind
	LR      float32 // >= 0
	Eps     float32 // Adagrad: > 0
	InitAcc float32 // Adagrad: the accumulator's initial value, >= 0
}

// Spec describes a parameter. Every row's initial value is a deterministic
// function of (Seed, key, column), so a reference computes the same start.
type Spec struct {
	Name string
	Kind Kind
	Dim  int    // Sparse: row width
	Rows uint64 // Sparse: keys are 0..Rows-1
	Size int    // Dense: number of values
	Opt  Optimizer
	Seed uint64
}

func (s Spec) validate() error {
	switch {
	case s.Name == "" || len(s.Name) > MaxName:
		return errorf(codeMalformed, "parameter name of %d bytes outside 1..%d", len(s.Name), MaxName)
	case s.Kind == Sparse && (s.Dim < 1 || s.Dim > 1<<16 || s.Rows == 0):
		return errorf(codeMalformed, "sparse table %q: dim %d (1..65536), rows %d (>0)", s.Name, s.Dim, s.Rows)
	case s.Kind == Dense && (s.Size < 1 || s.Size > maxWireFloats):
		return errorf(codeMalformed, "dense tensor %q: size %d outside 1..%d", s.Name, s.Size, maxWireFloats)
	case s.Kind != Sparse && s.Kind != Dense:
		return errorf(codeMalformed, "parameter %q: kind %d", s.Name, s.Kind)
	case s.Opt.Kind != SGD && s.Opt.Kind != Adagrad:
		return errorf(codeMalformed, "parameter %q: optimizer %d", s.Name, s.Opt.Kind)
	case !finite(s.Opt.LR) || !finite(s.Opt.Eps) || !finite(s.Opt.InitAcc) || s.Opt.LR < 0:
		return errorf(codeMalformed, "parameter %q: optimizer %+v", s.Name, s.Opt)
	// Adagrad divides by sqrt(h)+Eps, h starting at InitAcc: Eps 0 with
	// InitAcc 0 is 0/0 (NaN) on a zero gradient, a negative InitAcc the
	// square root of a negative number.
	case s.Opt.Kind == Adagrad && s.Opt.Eps <= 0:
		return errorf(codeMalformed, "parameter %q: Adagrad Eps %v: want > 0", s.Name, s.Opt.Eps)
	case s.Opt.Kind == Adagrad && s.Opt.InitAcc < 0:
		return errorf(codeMalformed, "parameter %q: Adagrad InitAcc %v: want >= 0", s.Name, s.Opt.InitAcc)
	}
	return nil
}

func finite(f float32) bool { return !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) }

// NaNPolicy says what a server does with a push holding NaN or Inf.
type NaNPolicy uint8

// Policies.
const (
	NaNReject NaNPolicy = iota // the whole push fails with ErrNaN, nothing is applied
	NaNSkip                    // rows (dense chunks) holding one are skipped and counted
)

// ParseNaNPolicy parses "reject" or "skip".
func ParseNaNPolicy(s string) (NaNPolicy, error) {
	switch s {
	case "reject", "":
		return NaNReject, nil
	case "skip":
		return NaNSkip, nil
	}
	return 0, fmt.Errorf("ps: NaN policy %q: want reject or skip", s)
}

// StoreConfig bounds what a store accepts.
// NewStore takes 0 or less as the default; NewServer refuses a negative
// bound.
type StoreConfig struct {
	// NaN is the policy for non-finite gradients. NewStore takes a value
	// other than NaNReject and NaNSkip as NaNReject (NewServer refuses
	// one).
	NaN      NaNPolicy
	MaxBatch int // keys per sparse request (default 65536)
	// MaxValues bounds a dense tensor's size (default 16 Mi values, 64 MiB).
	MaxValues int
	// MaxBytes bounds the store's parameter storage in all, whoever
	// defines or pushes (default DefaultMaxBytes, 4 GiB): a define, or a
	// push that would materialise rows, past it fails with ErrTooLarge
	// naming the limit, and changes nothing. Counted (Store.Bytes): 4
	// bytes a value (twice for Adagrad, its accumulator), rowOverhead a
	// materialised row, a parameter's fixed part (its lock stripes, a
	// sparse table's pushed-row bitmap, a dense tensor's chunk locks).
	// A table of more than 2^27 rows has no bitmap: a push to it counts
	// room for all its keys while it runs (two atomic operations on a
	// shared counter a push), so near the limit concurrent pushes, or a
	// define, may be refused while less than MaxBytes is in use.
	MaxBytes int64
}

// DefaultMaxBytes is StoreConfig.MaxBytes's default.
const DefaultMaxBytes = 4 << 30

// rowOverhead is what a materialised row costs besides its values, as
// counted against MaxBytes: its map entry and slice header, and the heap's
// rounding of a small allocation.
const rowOverhead = 64

const stripes = 256

// chunk is the unit of atomicity of a dense tensor: a push applies to each
// chunk under its lock, so concurrent pushes never interleave within one.
const chunk = 4096

// Store is one server's shard: parameters by name. It is safe for
// concurrent use; pushes to one row (dense chunk) are atomic. Make one
// with NewStore: the methods of a nil or zero Store that return an error
// return one that is goverbs.ErrNil.
type Store struct {
	cfg StoreConfig
	// used is the bytes counted against cfg.MaxBytes: reserved before
	// a define or a push allocates, so that the sum never passes it.
	used atomic.Int64
	// params is read without a lock (an immutable map, replaced whole by
	// Define under mu): a request's lookup costs no shared write.
	mu     sync.Mutex
	params atomic.Pointer[map[string]*param]
}

type param struct {
	spec Spec
	// Sparse: rows materialised on first push, in striped maps. A row is
	// w (Dim) followed, for Adagrad, by its accumulator (Dim).
	stripes [stripes]struct {
		mu   sync.Mutex
		rows map[uint64][]float32
	}
	// pushed, for tables of up to maxPushedBits rows, has a bit per row,
	// set (under the row's stripe lock) once the row is materialised: a
	// pull of a row whose bit is clear computes its initial value without
	// the lock or the map lookup (a cache miss into a large map).
	pushed []atomic.Uint64
	// Dense: w and (Adagrad) h, locked per chunk.
	w, h   []float32
	chunks []sync.Mutex
}

// NewStore returns an empty store. A bound of 0 or less takes its
// default, an unknown NaN policy is NaNReject.
func NewStore(cfg StoreConfig) *Store {
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 65536
	}
	if cfg.MaxValues <= 0 {
		cfg.MaxValues = 1 << 24
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.NaN != NaNReject && cfg.NaN != NaNSkip {
		cfg.NaN = NaNReject // the safe policy: nothing non-finite is applied
	}
	st := &Store{cfg: cfg}
	st.params.Store(&map[string]*param{})
	return st
}

// Define creates a parameter; defining an existing one with the same spec
// is a no-op, with a different spec ErrConflict.
func (s *Store) Define(spec Spec) error {
	if s.bad() {
		return errNilStore
	}
	if err := spec.validate(); err != nil {
		return err
	}
	if spec.Kind == Dense && spec.Size > s.cfg.MaxValues {
		return errorf(codeTooLarge, "dense tensor %q of %d values exceeds the server's limit of %d", spec.Name, spec.Size, s.cfg.MaxValues)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.params.Load()
	if p, ok := old[spec.Name]; ok {
		if p.spec != spec {
			return errorf(codeConflict, "parameter %q already defined as %+v, not %+v", spec.Name, p.spec, spec)
		}
		return nil
	}
	cost := specBytes(spec)
	if !s.reserve(cost) {
		return errorf(codeTooLarge, "defining %q needs %s of parameter storage: over the server's limit (Store.MaxBytes) of %s, %s in use (%d parameters)",
			spec.Name, fmtBytes(cost), fmtBytes(s.cfg.MaxBytes), fmtBytes(s.used.Load()), len(old))
	}
	p := &param{spec: spec}
	if spec.Kind == Sparse {
		for i := range p.stripes {
			p.stripes[i].rows = map[uint64][]float32{}
		}
		if spec.Rows <= maxPushedBits {
			p.pushed = make([]atomic.Uint64, (spec.Rows+63)/64)
		}
	} else {
		p.w = make([]float32, spec.Size)
		for i := range p.w {
			p.w[i] = initValue(spec.Seed, 0, i)
		}
		if spec.Opt.Kind == Adagrad {
			p.h = make([]float32, spec.Size)
			for i := range p.h {
				p.h[i] = spec.Opt.InitAcc
			}
		}
		p.chunks = make([]sync.Mutex, (spec.Size+chunk-1)/chunk)
	}
	m := make(map[string]*param, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[spec.Name] = p
	s.params.Store(&m)
	return nil
}

// specBytes is what defining spec costs against MaxBytes: the param
// with its stripes, the stripes' empty maps, and a sparse table's bitmap
// or a dense tensor's values and chunk locks.
func specBytes(spec Spec) int64 {
	n := int64(unsafe.Sizeof(param{})) + int64(len(spec.Name))
	if spec.Kind == Sparse {
		n += stripes * 64 // an empty map
		if spec.Rows <= maxPushedBits {
			n += int64(spec.Rows+63) / 64 * 8
		}
		return n
	}
	n += 4 * int64(spec.Size) * int64(optWidth(spec.Opt))
	return n + int64((spec.Size+chunk-1)/chunk)*int64(unsafe.Sizeof(sync.Mutex{}))
}

// optWidth is the values per parameter value: 2 for Adagrad (w and h).
func optWidth(o Optimizer) int {
	if o.Kind == Adagrad {
		return 2
	}
	return 1
}

// reserve counts n more bytes against MaxBytes, if they fit.
func (s *Store) reserve(n int64) bool {
	for {
		u := s.used.Load()
		if n > s.cfg.MaxBytes-u {
			return false
		}
		if s.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// Bytes is the parameter storage counted against StoreConfig.MaxBytes
// (0 for a nil or zero Store).
func (s *Store) Bytes() int64 {
	if s.bad() {
		return 0
	}
	return s.used.Load()
}

// fmtBytes formats n as "1 MiB", "63.8 MiB", "512 B".
func fmtBytes(n int64) string { return units.Bytes(n) }

// Specs lists the defined parameters.
func (s *Store) Specs() []Spec {
	if s.bad() {
		return nil
	}
	var out []Spec
	for _, p := range *s.params.Load() {
		out = append(out, p.spec)
	}
	return out
}

func (s *Store) get(name string, kind Kind) (*param, error) {
	return s.check((*s.params.Load())[name], name, kind)
}

// getB is get for a name that is a view of a request (no string made).
func (s *Store) getB(name []byte, kind Kind) (*param, error) {
	p := (*s.params.Load())[string(name)]
	if p != nil && p.spec.Kind == kind {
		return p, nil
	}
	return s.check(p, string(name), kind)
}

func (s *Store) check(p *param, name string, kind Kind) (*param, error) {
	if p == nil {
		return nil, errorf(codeUnknownParam, "no parameter %q", name)
	}
	if p.spec.Kind != kind {
		what := map[Kind]string{Sparse: "sparse table", Dense: "dense tensor"}
		return nil, errorf(codeUnknownParam, "parameter %q is a %s, not a %s", name, what[p.spec.Kind], what[kind])
	}
	return p, nil
}

func mix(x uint64) uint64 { // splitmix64's finaliser
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// initValue is a parameter's deterministic initial value in [-0.05, 0.05).
func initValue(seed, key uint64, col int) float32 {
	return initValueOf(seed^keyMix(key), col)
}

// keyMix is the part of initValue that depends on the key alone: a row
// computes it once (initValueOf).
func keyMix(key uint64) uint64 { return mix(key + 0x9e3779b97f4a7c15) }

func initValueOf(sk uint64, col int) float32 {
	r := mix(sk ^ uint64(col)*0xd1b54a32d192ed03)
	// r>>40 scaled by 2^-24: a multiplication by a power of two is as exact
	// as the division it replaces, and cheaper.
	return (float32(r>>40)*(1.0/(1<<24)) - 0.5) * 0.1
}

func stripeOf(key uint64) int { return int(mix(key) % stripes) }

func (s *Store) checkKeys(p *param, n int, key func(int) uint64) error {
	if n > s.cfg.MaxBatch {
		return errorf(codeTooLarge, "batch of %d keys for %q exceeds the server's limit of %d", n, p.spec.Name, s.cfg.MaxBatch)
	}
	for i := 0; i < n; i++ {
		if k := key(i); k >= p.spec.Rows {
			return errorf(codeUnknownKey, "key %d of table %q outside 0..%d", k, p.spec.Name, p.spec.Rows-1)
		}
	}
	return nil
}

// Pull writes the rows of keys into out (len(keys)*dim).
func (s *Store) Pull(name string, keys []uint64, out []float32) error {
	if s.bad() {
		return errNilStore
	}
	p, err := s.get(name, Sparse)
	if err != nil {
		return err
	}
	dim := p.spec.Dim
	if len(out) != len(keys)*dim {
		return errorf(codeDim, "table %q has dim %d: %d keys need %d values, have %d", name, dim, len(keys), len(keys)*dim, len(out))
	}
	if err := s.checkKeys(p, len(keys), func(i int) uint64 { return keys[i] }); err != nil {
		return err
	}
	for i, k := range keys {
		p.readRow(k, out[i*dim:(i+1)*dim])
	}
	return nil
}

// maxPushedBits: tables of up to this many rows keep a bitmap of the
// pushed ones (16 MiB at most).
const maxPushedBits = 1 << 27

// cold reports whether row k was surely never pushed.
func (p *param) cold(k uint64) bool {
	return p.pushed != nil && p.pushed[k/64].Load()&(1<<(k%64)) == 0
}

func (p *param) readRow(k uint64, dst []float32) {
	if p.cold(k) {
		p.initRow(k, dst)
		return
	}
	st := &p.stripes[stripeOf(k)]
	st.mu.Lock()
	if r, ok := st.rows[k]; ok {
		copy(dst, r[:len(dst)])
		st.mu.Unlock()
		return
	}
	st.mu.Unlock()
	p.initRow(k, dst)
}

// initRow is a never pushed row: its initial value, without materialising
// it (pulls of cold rows do not grow the store).
func (p *param) initRow(k uint64, dst []float32) {
	sk := p.spec.Seed ^ keyMix(k)
	for j := range dst {
		dst[j] = initValueOf(sk, j)
	}
}

// pullReq serves a decoded OpPull: rows are appended to b.
func (s *Store) pullReq(r *Request, b []byte) ([]byte, error) {
	p, err := s.getB(r.name, Sparse)
	if err != nil {
		return b, err
	}
	if r.Dim != p.spec.Dim {
		return b, errorf(codeDim, "table %q has dim %d, request says %d", r.name, p.spec.Dim, r.Dim)
	}
	if err := s.checkKeys(p, r.N, r.Key); err != nil {
		return b, err
	}
	dim := p.spec.Dim
	b = appendU32(b, uint32(dim))
	b = appendU32(b, uint32(r.N))
	o := len(b)
	b = grow(b, 4*r.N*dim)
	for i := 0; i < r.N; i++ {
		p.readRowBytes(r.Key(i), b[o+4*i*dim:o+4*(i+1)*dim])
	}
	return b, nil
}

// readRowBytes is readRow straight into a response (little-endian f32s).
func (p *param) readRowBytes(k uint64, dst []byte) {
	if !p.cold(k) {
		st := &p.stripes[stripeOf(k)]
		st.mu.Lock()
		if r, ok := st.rows[k]; ok {
			putFloats(dst, r[:len(dst)/4])
			st.mu.Unlock()
			return
		}
		st.mu.Unlock()
	}
	sk := p.spec.Seed ^ keyMix(k)
	for j := range len(dst) / 4 {
		binary.LittleEndian.PutUint32(dst[4*j:], math.Float32bits(initValueOf(sk, j)))
	}
}

func grow(b []byte, n int) []byte {
	if cap(b)-len(b) < n {
		nb := make([]byte, len(b), len(b)+n)
		copy(nb, b)
		b = nb
	}
	return b[:len(b)+n]
}

func appendU32(b []byte, v uint32) []byte {
	return append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
}

// Push applies gradients (len(keys)*dim) to the rows of keys. It returns
// the rows applied and skipped (NaN, skip policy).
func (s *Store) Push(name string, keys []uint64, grads []float32) (applied, skipped int, err error) {
	if s.bad() {
		return 0, 0, errNilStore
	}
	p, err := s.get(name, Sparse)
	if err != nil {
		return 0, 0, err
	}
	dim := p.spec.Dim
	if len(grads) != len(keys)*dim {
		return 0, 0, errorf(codeDim, "table %q has dim %d: %d keys need %d gradient values, have %d", name, dim, len(keys), len(keys)*dim, len(grads))
	}
	return s.push(p, len(keys), func(i int) uint64 { return keys[i] }, gradBytes(grads))
}

func (s *Store) pushReq(r *Request) (applied, skipped int, err error) {
	p, err := s.getB(r.name, Sparse)
	if err != nil {
		return 0, 0, err
	}
	if r.Dim != p.spec.Dim {
		return 0, 0, errorf(codeDim, "table %q has dim %d, push says %d", r.name, p.spec.Dim, r.Dim)
	}
	return s.push(p, r.N, r.Key, r.vals)
}

func (s *Store) push(p *param, n int, key func(int) uint64, grad []byte) (applied, skipped int, err error) {
	if err := s.checkKeys(p, n, key); err != nil {
		return 0, 0, err
	}
	dim := p.spec.Dim
	bad := func(i int) bool {
		for j := 0; j < dim; j++ {
			if !finite(f32(grad, i*dim+j)) {
				return true
			}
		}
		return false
	}
	if s.cfg.NaN == NaNReject {
		for i := 0; i < n; i++ {
			if bad(i) {
				return 0, 0, errorf(codeNaN, "push to %q: gradient of key %d (batch row %d) is not finite; nothing applied", p.spec.Name, key(i), i)
			}
		}
	}
	// The rows this push may materialise are counted against MaxBytes
	// before any is: the push is applied whole or not at all. What was
	// reserved for rows another push materialised first (or for a key
	// repeated in the batch, or skipped) is given back after.
	rowBytes := int64(4*dim*optWidth(p.spec.Opt) + rowOverhead)
	cold, err := s.reserveRows(p, n, key, rowBytes)
	if err != nil {
		return 0, 0, err
	}
	made := 0
	for i := 0; i < n; i++ {
		if s.cfg.NaN == NaNSkip && bad(i) {
			skipped++
			continue
		}
		k := key(i)
		st := &p.stripes[stripeOf(k)]
		st.mu.Lock()
		row, ok := st.rows[k]
		if !ok {
			w := 1
			if p.spec.Opt.Kind == Adagrad {
				w = 2
			}
			row = make([]float32, w*dim)
			sk := p.spec.Seed ^ keyMix(k)
			for j := 0; j < dim; j++ {
				row[j] = initValueOf(sk, j)
				if w == 2 {
					row[dim+j] = p.spec.Opt.InitAcc
				}
			}
			st.rows[k] = row
			made++
			if p.pushed != nil {
				p.pushed[k/64].Or(1 << (k % 64))
			}
		}
		var h []float32
		if p.spec.Opt.Kind == Adagrad {
			h = row[dim:]
		}
		apply(p.spec.Opt, row[:dim], h, grad, i*dim)
		st.mu.Unlock()
		applied++
	}
	if made < cold {
		s.used.Add(-int64(cold-made) * rowBytes)
	}
	return applied, skipped, nil
}

// reserveRows counts against MaxBytes the rows of the n keys that may
// not be materialised yet, and returns how many it counted. Over a
// table's bitmap that is the keys whose bit is clear (none in steady
// state: no shared write); a table without one counts all n, and at the
// limit looks the keys up to count only the absent ones. A bit or a row
// once there stays, so the count bounds what the push materialises.
func (s *Store) reserveRows(p *param, n int, key func(int) uint64, rowBytes int64) (int, error) {
	cold := n
	if p.pushed != nil {
		cold = 0
		for i := 0; i < n; i++ {
			if p.cold(key(i)) {
				cold++
			}
		}
	}
	if cold == 0 || s.reserve(int64(cold)*rowBytes) {
		return cold, nil
	}
	if p.pushed == nil {
		cold = 0
		for i := 0; i < n; i++ {
			k := key(i)
			st := &p.stripes[stripeOf(k)]
			st.mu.Lock()
			if _, ok := st.rows[k]; !ok {
				cold++
			}
			st.mu.Unlock()
		}
		if cold == 0 || s.reserve(int64(cold)*rowBytes) {
			return cold, nil
		}
	}
	return 0, errorf(codeTooLarge, "push to %q would materialise up to %d new rows (%s): over the server's parameter storage limit (Store.MaxBytes) of %s, %s in use; nothing applied",
		p.spec.Name, cold, fmtBytes(int64(cold)*rowBytes), fmtBytes(s.cfg.MaxBytes), fmtBytes(s.used.Load()))
}

// apply is the optimizer step on one row (chunk) w, with the gradient
// values off, off+1, ... of grad (little-endian f32s: a request's bytes,
// or the caller's slice seen as bytes), read where they are: no copy. h is
// nil for SGD.
func apply(o Optimizer, w, h []float32, grad []byte, off int) {
	g := grad[4*off : 4*(off+len(w))]
	switch o.Kind {
	case SGD:
		for j := range w {
			w[j] -= o.LR * f32(g, j)
		}
	case Adagrad:
		for j := range w {
			g := f32(g, j)
			h[j] += g * g
			w[j] -= o.LR * g / (float32(math.Sqrt(float64(h[j]))) + o.Eps)
		}
	}
}

// f32 is the i-th little-endian float32 of b.
func f32(b []byte, i int) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
}

// gradBytes is grads as little-endian bytes: a view where the machine is
// little endian, else a copy.
func gradBytes(grads []float32) []byte {
	if littleEndian {
		return floatBytes(grads)
	}
	b := make([]byte, 4*len(grads))
	putFloats(b, grads)
	return b
}

// PullDense copies a dense tensor into out (its size).
func (s *Store) PullDense(name string, out []float32) error {
	if s.bad() {
		return errNilStore
	}
	p, err := s.get(name, Dense)
	if err != nil {
		return err
	}
	if len(out) != p.spec.Size {
		return errorf(codeDim, "tensor %q has %d values, buffer %d", name, p.spec.Size, len(out))
	}
	for c := range p.chunks {
		lo, hi := c*chunk, min((c+1)*chunk, len(p.w))
		p.chunks[c].Lock()
		copy(out[lo:hi], p.w[lo:hi])
		p.chunks[c].Unlock()
	}
	return nil
}

func (s *Store) pullDenseReq(r *Request, b []byte) ([]byte, error) {
	p, err := s.getB(r.name, Dense)
	if err != nil {
		return b, err
	}
	if r.N != p.spec.Size {
		return b, errorf(codeDim, "tensor %q has %d values, request says %d", r.name, p.spec.Size, r.N)
	}
	b = appendU32(b, uint32(r.N))
	o := len(b)
	b = grow(b, 4*r.N)
	for c := range p.chunks {
		lo, hi := c*chunk, min((c+1)*chunk, len(p.w))
		p.chunks[c].Lock()
		putFloats(b[o+4*lo:], p.w[lo:hi])
		p.chunks[c].Unlock()
	}
	return b, nil
}

// PushDense applies a gradient to a dense tensor, chunk by chunk.
func (s *Store) PushDense(name string, grads []float32) (applied, skipped int, err error) {
	if s.bad() {
		return 0, 0, errNilStore
	}
	p, err := s.get(name, Dense)
	if err != nil {
		return 0, 0, err
	}
	return s.pushDense(p, len(grads), gradBytes(grads))
}

func (s *Store) pushDenseReq(r *Request) (applied, skipped int, err error) {
	p, err := s.getB(r.name, Dense)
	if err != nil {
		return 0, 0, err
	}
	return s.pushDense(p, r.N, r.vals)
}

func (s *Store) pushDense(p *param, n int, grad []byte) (applied, skipped int, err error) {
	if n != p.spec.Size {
		return 0, 0, errorf(codeDim, "tensor %q has %d values, gradient %d", p.spec.Name, p.spec.Size, n)
	}
	badChunk := func(c int) int {
		for i := c * chunk; i < min((c+1)*chunk, n); i++ {
			if !finite(f32(grad, i)) {
				return i
			}
		}
		return -1
	}
	if s.cfg.NaN == NaNReject {
		for c := range p.chunks {
			if i := badChunk(c); i >= 0 {
				return 0, 0, errorf(codeNaN, "push to %q: gradient value %d is not finite; nothing applied", p.spec.Name, i)
			}
		}
	}
	for c := range p.chunks {
		if s.cfg.NaN == NaNSkip && badChunk(c) >= 0 {
			skipped++
			continue
		}
		lo, hi := c*chunk, min((c+1)*chunk, n)
		var h []float32
		if p.h != nil {
			h = p.h[lo:hi]
		}
		p.chunks[c].Lock()
		apply(p.spec.Opt, p.w[lo:hi], h, grad, lo)
		p.chunks[c].Unlock()
		applied++
	}
	return applied, skipped, nil
}
