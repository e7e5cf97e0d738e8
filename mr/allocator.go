package mr

// The RDMA-aware allocator.
//
// Layout: registered regions (one MR each, RegionSize bytes, huge pages when
// the system has them) are cut into chunks of whole 64 KiB granules; a chunk
// belongs to one size class and is cut into buffers of that class. Every
// buffer has a slot descriptor (state, free-list link, requested length) in
// the chunk's preallocated table, and a 32-bit ID: chunk index << 10 | slot
// index. Nothing is ever returned to a region: buffers of a class are
// recycled through per-class free lists, so the number of MRs is the number
// of regions, never the number of buffers.
//
// Free lists are Treiber stacks (lock-free, ABA-safe through a 32-bit tag in
// the head word), sharded per class so that goroutines on different Ps
// rarely touch the same cache line; a goroutine picks a shard at random.
// A Cache is a single-owner stack per class in front of them.
//
// A slot's state word is generation<<1 | inUse. Alloc bumps the generation
// and a Buf remembers it; Free is a CAS from (gen, in use) to (gen, free), so
// a double free, or a free through a stale copy of a Buf whose slot has been
// handed out again, fails the CAS and is reported instead of corrupting a
// free list.

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/cpu"

	"github.com/goverbs/goverbs/internal/units"
	"github.com/goverbs/goverbs/uverbs"
)

// Allocator errors; errors.Is works for each. Use after Close wraps
// uverbs.ErrClosed.
var (
	// ErrAllocatorFull: a buffer would need more registered memory than
	// the allocator's Limit.
	ErrAllocatorFull = errors.New("memory limit reached")
	// ErrTooLarge: the size is above the largest class.
	ErrTooLarge = errors.New("size above the largest class")
	// ErrDoubleFree: the buffer is not in use (freed twice, or a stale
	// copy of a Buf whose slot was allocated again).
	ErrDoubleFree = errors.New("buffer not in use (double or stale free)")
	// ErrForeignBuf: the Buf is the zero Buf or belongs to another allocator.
	ErrForeignBuf = errors.New("buffer not from this allocator")
	// ErrInUse: Close found buffers still allocated.
	ErrInUse = errors.New("buffers still in use")
)

var errAllocClosed = fmt.Errorf("mr: allocator: %w", uverbs.ErrClosed)

const (
	granule    = 64 << 10 // chunks are whole granules, granule-aligned
	slotBits   = 10       // granule / smallest class alignment (64 B)
	slotMask   = 1<<slotBits - 1
	classAlign = 64
	// smallClasses: classOf answers sizes up to smallClasses*64 bytes
	// from a table (a binary search over the classes cost about 50
	// instructions an Alloc).
	smallClasses = 64
	maxShards    = 64
	// maxCacheSize is the largest CacheSize: a Cache holds that many IDs
	// per class (255 classes of 64 Ki IDs is 64 MiB).
	maxCacheSize = 1 << 16
	// MaxAllocatorLimit is the largest Limit: buffer IDs are 32 bits.
	MaxAllocatorLimit = 128 << 30
)

// AllocatorConfig configures an Allocator. The zero value gives the
// defaults.
type AllocatorConfig struct {
	// Classes are the buffer sizes, ascending, each a multiple of 64,
	// at most RegionSize and below 4 GiB (buffer lengths are 32 bits,
	// like an SGE's). Default: powers of two from 64 B to 1 MiB (15
	// classes): 64 B covers credit and control messages, a few KiB
	// embedding rows, 1 MiB the largest eager message; larger payloads
	// (rendezvous targets, whole tensors) are better registered once with
	// Register, or served by an allocator configured with larger classes.
	// Powers of two keep internal fragmentation under 50% and buffers
	// naturally aligned.
	Classes []int
	// RegionSize is the size of each registered region, a multiple of
	// 64 KiB. Default 32 MiB: a multiple of 2 MiB, so Alloc tries huge
	// pages, and few MRs for the device's translation tables.
	RegionSize int
	// Limit is the most memory the allocator registers. Default 1 GiB,
	// at most MaxAllocatorLimit. The last region is shrunk to fit.
	Limit int64
	// Access is the regions' access, the same for every buffer: create one
	// allocator per access need, with the narrowest flags. Default
	// LocalWrite (send and receive buffers; nothing remote). A rendezvous
	// target allocator wants LocalWrite|RemoteWrite, a buffer peers read
	// LocalWrite|RemoteRead.
	Access Access
	// Shards is the number of free lists per class for the goroutine-safe
	// path. Default GOMAXPROCS rounded up to a power of two, at most 64.
	Shards int
	// CacheSize is how many free buffers per class a Cache keeps before
	// it hands half back: 2 to 65536. Default 64.
	CacheSize int
}

func defaultClasses() []int {
	var c []int
	for s := 64; s <= 1<<20; s <<= 1 {
		c = append(c, s)
	}
	return c
}

// Allocator hands out buffers in size classes, carved from a few large
// registered regions. Alloc, Free, Lookup, FromHandle and Stats are safe
// for concurrent use and Alloc/Free allocate nothing on the Go heap once the
// classes have grown; a Cache (NewCache) is a faster single-owner front end.
type Allocator struct {
	pd        *uverbs.PD
	cfg       AllocatorConfig
	sizes     []int
	small     [smallClasses + 1]uint8 // classOf of k*64 bytes, k <= smallMax/64
	smallMax  uint                    // the most bytes small answers for
	classes   []class
	shardMask uint32
	spread    spreader
	chunks    []atomic.Pointer[chunk] // by chunk index, published once
	regions   atomic.Pointer[[]*region]
	closed    atomic.Bool
	register  registrar

	mu         sync.Mutex // growth, stats, caches, close
	nchunks    int
	registered int64
	all        []*region // creation order
	caches     map[*Cache]struct{}
	retired    []counts // counters of closed caches, per class
}

type registrar func(pd *uverbs.PD, b []byte, access Access) (lkey, rkey uint32, release func() error, err error)

func registerMR(pd *uverbs.PD, b []byte, access Access) (uint32, uint32, func() error, error) {
	m, err := Register(pd, b, access)
	if err != nil {
		return 0, 0, nil, err
	}
	return m.LKey(), m.RKey(), m.Close, nil
}

type counts struct{ allocs, frees uint64 }

type class struct {
	size     int
	shards   []shard
	failures atomic.Uint64
	carved   int64 // buffers; under mu
}

// shard is one free list; padded so that shards do not share cache lines.
type shard struct {
	head   atomic.Uint64 // tag<<32 | (id+1), 0 = empty
	allocs atomic.Uint64
	frees  atomic.Uint64
	_      [40]byte
}

type chunk struct {
	base  unsafe.Pointer // first byte, outside the Go heap
	addr  uint64
	off   int // offset in the region
	class uint32
	size  uint32
	lkey  uint32
	rkey  uint32
	slots []slot
}

type slot struct {
	state atomic.Uint32 // gen<<1 | inUse
	next  atomic.Uint32 // id+1 of the next free slot, 0 = end
	n     atomic.Uint32 // length asked for at Alloc
}

type region struct {
	mem     *Memory
	buf     []byte
	base    uint64
	lkey    uint32
	rkey    uint32
	release func() error
	used    int             // bytes carved; under mu
	chunkOf []atomic.Uint32 // per granule: chunk index+1, 0 = not carved
}

// NewAllocator returns an allocator that registers its regions in pd. It
// registers nothing until the first Alloc.
func NewAllocator(pd *uverbs.PD, cfg AllocatorConfig) (*Allocator, error) {
	if pd == nil {
		return nil, errors.New("mr: allocator: nil PD")
	}
	return newAllocator(pd, cfg, registerMR)
}

func newAllocator(pd *uverbs.PD, cfg AllocatorConfig, reg registrar) (*Allocator, error) {
	if cfg.Classes == nil {
		cfg.Classes = defaultClasses()
	}
	cfg.Classes = slices.Clone(cfg.Classes)
	if cfg.RegionSize == 0 {
		cfg.RegionSize = 32 << 20
	}
	if cfg.Limit == 0 {
		cfg.Limit = 1 << 30
	}
	if cfg.Access == 0 {
		cfg.Access = LocalWrite
	}
	if cfg.Shards == 0 {
		cfg.Shards = runtime.GOMAXPROCS(0)
	}
	if cfg.CacheSize == 0 {
		cfg.CacheSize = 64
	}
	bad := func(f string, args ...any) error {
		return fmt.Errorf("mr: allocator: "+f, args...)
	}
	switch {
	case len(cfg.Classes) == 0 || len(cfg.Classes) > 255:
		return nil, bad("%d size classes, want 1 to 255", len(cfg.Classes))
	case cfg.RegionSize < granule || cfg.RegionSize%granule != 0:
		return nil, bad("region size %d is not a positive multiple of 64 KiB", cfg.RegionSize)
	case cfg.Limit < granule || cfg.Limit > MaxAllocatorLimit:
		return nil, bad("limit %d outside [64 KiB, %s]", cfg.Limit, fmtBytes(MaxAllocatorLimit))
	case cfg.Access&^known != 0:
		return nil, bad("unknown access flags %#x", uint32(cfg.Access&^known))
	case cfg.Access&(RemoteWrite|RemoteAtomic) != 0 && cfg.Access&LocalWrite == 0:
		return nil, bad("access %v: remote write and remote atomic need LocalWrite too", cfg.Access)
	case cfg.Shards < 0:
		return nil, bad("Shards %d is negative", cfg.Shards)
	case cfg.CacheSize < 2 || cfg.CacheSize > maxCacheSize:
		return nil, bad("CacheSize %d outside [2, %d]", cfg.CacheSize, maxCacheSize)
	}
	for i, s := range cfg.Classes {
		switch {
		case s <= 0 || s%classAlign != 0:
			return nil, bad("class %d: size %d is not a positive multiple of %d", i, s, classAlign)
		case uint64(s) > math.MaxUint32: // chunk.size, slot.n, Buf.n are 32 bits
			return nil, bad("class %d: size %d (%s) is 4 GiB or more: buffer lengths are 32 bits", i, s, fmtBytes(int64(s)))
		case i > 0 && s <= cfg.Classes[i-1]:
			return nil, bad("classes not ascending: %d after %d", s, cfg.Classes[i-1])
		case s > cfg.RegionSize:
			return nil, bad("class %s larger than the %s region size", fmtBytes(int64(s)), fmtBytes(int64(cfg.RegionSize)))
		case int64(roundUp(s, granule)) > cfg.Limit:
			return nil, bad("class %s does not fit the %s limit", fmtBytes(int64(s)), fmtBytes(cfg.Limit))
		}
	}
	n := 1
	for n < cfg.Shards && n < maxShards {
		n <<= 1
	}
	cfg.Shards = n
	a := &Allocator{
		pd: pd, cfg: cfg, sizes: cfg.Classes, register: reg,
		shardMask: uint32(n - 1),
		classes:   make([]class, len(cfg.Classes)),
		chunks:    make([]atomic.Pointer[chunk], cfg.Limit/granule),
		caches:    map[*Cache]struct{}{},
		retired:   make([]counts, len(cfg.Classes)),
	}
	for i := range a.classes {
		a.classes[i] = class{size: cfg.Classes[i], shards: make([]shard, n)}
	}
	// Classes are multiples of 64, so the smallest one holding n bytes
	// is the smallest holding n rounded up to 64: one table entry per 64
	// bytes answers for every size up to 4 KiB (or the largest class).
	c := 0
	for k := range uint(smallClasses + 1) {
		for c < len(a.sizes) && uint(a.sizes[c]) < k*classAlign {
			c++
		}
		if c == len(a.sizes) {
			break
		}
		a.small[k], a.smallMax = uint8(c), k*classAlign
	}
	a.regions.Store(new([]*region))
	return a, nil
}

// Config returns the configuration with defaults filled in.
func (a *Allocator) Config() AllocatorConfig {
	if a.bad() {
		return AllocatorConfig{}
	}
	c := a.cfg
	c.Classes = slices.Clone(c.Classes)
	return c
}

// Buf is an allocated buffer. It is a small value: copy it freely, but
// Free it once (a Free through any copy counts). The zero Buf is invalid.
type Buf struct {
	a     *Allocator
	p     unsafe.Pointer
	n     uint32
	lkey  uint32
	rkey  uint32
	id    uint32
	gen   uint32
	class uint32
}

// Bytes is the buffer: len is the size asked for, cap the class size. It is
// registered memory outside the Go heap, valid until Free.
func (b Buf) Bytes() []byte {
	if b.p == nil {
		return nil
	}
	return unsafe.Slice((*byte)(b.p), b.a.sizes[b.class])[:b.n]
}

// Len is the size asked for.
func (b Buf) Len() int { return int(b.n) }

// Resize is b with length n, the same memory: a buffer allocated for the
// most a message may need, sent with what it turned out to need. n must be
// within [0, Cap()]. It is a value like b (Free one of them, once);
// FromHandle still gives the length Alloc was asked for.
func (b Buf) Resize(n int) (Buf, error) {
	if b.p == nil || uint(n) > uint(b.a.sizes[b.class]) {
		return Buf{}, &resizeError{n: n, b: b} // a value, not a call: Resize inlines
	}
	b.n = uint32(n)
	return b, nil
}

// resizeError is Resize's error, formatted when it is printed.
type resizeError struct {
	n int
	b Buf
}

func (e *resizeError) Error() string {
	if e.b.p == nil {
		return fmt.Sprintf("mr: Buf.Resize(%d) of the zero Buf: %v", e.n, ErrForeignBuf)
	}
	return fmt.Sprintf("mr: Buf.Resize(%d) outside the %d-byte buffer", e.n, e.b.Cap())
}

func (e *resizeError) Unwrap() error {
	if e.b.p == nil {
		return ErrForeignBuf
	}
	return nil
}

// Cap is the class size.
func (b Buf) Cap() int {
	if b.a == nil {
		return 0
	}
	return b.a.sizes[b.class]
}

// Class is the index of the buffer's size class in Config().Classes.
func (b Buf) Class() int { return int(b.class) }

// Addr is the address of the first byte, as SGEs and peers name it.
func (b Buf) Addr() uint64 { return uint64(uintptr(b.p)) }

// LKey is the local key of the region holding the buffer.
func (b Buf) LKey() uint32 { return b.lkey }

// RKey is the remote key of the region holding the buffer. It is only
// useful to a peer if the allocator's Access has remote flags; it grants
// access to the whole region, not just this buffer.
func (b Buf) RKey() uint32 { return b.rkey }

// ID identifies the buffer's slot; it is reused when the slot is.
func (b Buf) ID() uint32 { return b.id }

// Handle identifies this allocation (ID and generation), e.g. as a work
// request ID; FromHandle turns it back into the Buf.
func (b Buf) Handle() uint64 { return uint64(b.gen)<<32 | uint64(b.id) }

// SGE is the SGE for the first n bytes. It panics if n is outside
// [0, Cap()], like slicing.
func (b Buf) SGE(n int) uverbs.SGE {
	if c := b.Cap(); uint(n) > uint(c) {
		panic(sgeRangeError{n, c})
	}
	return uverbs.SGE{Addr: uint64(uintptr(b.p)), Length: uint32(n), LKey: b.lkey}
}

// sgeRangeError is SGE's panic value: formatted when printed, so that SGE
// stays small enough to inline (it is on every send and receive of bx).
type sgeRangeError struct{ n, size int }

func (e sgeRangeError) Error() string {
	return fmt.Sprintf("mr: Buf.SGE(%d) outside the %d-byte buffer", e.n, e.size)
}

// classOf returns the smallest class holding n bytes. Alloc(0) gets the
// smallest class.
func (a *Allocator) classOf(n int) (int, error) {
	if uint(n) <= a.smallMax { // n >= 0 too
		return int(a.small[(uint(n)+classAlign-1)/classAlign]), nil
	}
	if n < 0 || n > a.sizes[len(a.sizes)-1] {
		if n < 0 {
			return 0, fmt.Errorf("mr: allocator: alloc %d bytes: negative size", n)
		}
		return 0, fmt.Errorf("mr: allocator: alloc %d bytes: %w (%s)", n, ErrTooLarge, fmtBytes(int64(a.sizes[len(a.sizes)-1])))
	}
	lo, hi := 0, len(a.sizes)-1
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if a.sizes[m] < n {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, nil
}

func (a *Allocator) slot(id uint32) (*chunk, *slot) {
	ch := a.chunks[id>>slotBits].Load()
	return ch, &ch.slots[id&slotMask]
}

// Alloc returns a buffer of at least n bytes (len n, cap the class size).
// Its contents are whatever the last user left. When its class has no free
// buffer and growing would pass the limit, a free buffer of a larger class
// serves (Cap tells); with none either it fails with ErrAllocatorFull. It
// fails with ErrTooLarge above the largest class.
func (a *Allocator) Alloc(n int) (Buf, error) {
	if a.bad() {
		return Buf{}, errNilAllocator
	}
	c, err := a.classOf(n)
	if err != nil {
		return Buf{}, err
	}
	cl := &a.classes[c]
	s := a.shard()
	id, ok := a.pop(cl, s)
	if !ok {
		if id, err = a.grow(c); err != nil {
			// At the limit, a free buffer of a larger class serves
			// rather than failing while registered memory sits idle
			// (regions are carved for one class and never re-carved).
			if !errors.Is(err, ErrAllocatorFull) {
				return Buf{}, err
			}
			if id, ok = a.popLarger(c, s); !ok {
				return Buf{}, err
			}
		}
	}
	b, err := a.take(id, n)
	if err != nil {
		return Buf{}, err
	}
	a.classes[b.class].shards[s].allocs.Add(1) // the class it came from
	return b, nil
}

// spreader is shard()'s counter, on a cache line of its own: every Alloc
// and Free writes it, and the Allocator's other fields are read by all.
type spreader struct {
	_ cpu.CacheLinePad
	n atomic.Uint32
	_ cpu.CacheLinePad
}

// shard picks the shard an Alloc or Free starts at: the next one, round
// robin, so that concurrent callers seldom meet on one list. One atomic
// add: math/rand's ChaCha8 cost about 65 instructions a pick, two or
// three picks a message in bx (scripts/bench-instr).
func (a *Allocator) shard() uint32 {
	if a.shardMask == 0 {
		return 0
	}
	return a.spread.n.Add(1) & a.shardMask
}

// closedSlot is the state Close leaves in every slot: generation maxGen,
// free. No Alloc hands out generation maxGen (the generation wraps to 0
// before it), so no Buf's Free matches it and no Handle names it.
const (
	maxGen     = 1<<31 - 1
	closedSlot = maxGen << 1
)

// take marks a free slot in use: a CAS from the state it had when popped,
// which only Close changes (to closedSlot) under a slot nobody holds. So
// each slot's fate is decided once, at one atomic step: taken before
// Close's mark (Close counts it in use) or after (this fails, Close does
// not count it).
func (a *Allocator) take(id uint32, n int) (Buf, error) {
	ch, sl := a.slot(id)
	old := sl.state.Load()
	if old == closedSlot {
		return Buf{}, errAllocClosed
	}
	gen := old>>1 + 1
	if gen == maxGen {
		gen = 0
	}
	sl.n.Store(uint32(n))
	if !sl.state.CompareAndSwap(old, gen<<1|1) {
		return Buf{}, errAllocClosed // Close marked it since the Load
	}
	i := id & slotMask
	return Buf{a: a, p: unsafe.Add(ch.base, uintptr(i)*uintptr(ch.size)), n: uint32(n),
		lkey: ch.lkey, rkey: ch.rkey, id: id, gen: gen, class: ch.class}, nil
}

// check validates b for Free and returns its slot.
func (a *Allocator) check(b Buf) (*slot, error) {
	if b.a != a {
		if b.a == nil {
			return nil, fmt.Errorf("mr: allocator: free of the zero Buf: %w", ErrForeignBuf)
		}
		return nil, fmt.Errorf("mr: allocator: free of the buffer at %#x: %w", b.Addr(), ErrForeignBuf)
	}
	if a.closed.Load() {
		return nil, errAllocClosed
	}
	_, sl := a.slot(b.id)
	return sl, nil
}

// badFree is the error of a Free whose CAS failed: the allocator's close
// if Close marked the slot (the buffer still counted in use by its
// ErrInUse), else a double or stale free.
func (a *Allocator) badFree(b Buf, sl *slot) error {
	if sl.state.Load() == closedSlot {
		return errAllocClosed
	}
	return fmt.Errorf("mr: allocator: free of the %s buffer %d at %#x: %w",
		fmtBytes(int64(b.Cap())), b.id, b.Addr(), ErrDoubleFree)
}

// Free returns b to the allocator. It fails, changing nothing, for a buffer
// that is not in use (ErrDoubleFree), not from this allocator
// (ErrForeignBuf), or after Close.
func (a *Allocator) Free(b Buf) error {
	if a.bad() {
		return errNilAllocator
	}
	sl, err := a.check(b)
	if err != nil {
		return err
	}
	if !sl.state.CompareAndSwap(b.gen<<1|1, b.gen<<1) {
		return a.badFree(b, sl)
	}
	sh := &a.classes[b.class].shards[a.shard()]
	a.pushChain(sh, b.id, sl)
	sh.frees.Add(1)
	return nil
}

// pop takes a free slot, trying shard s first and then the others.
// popLarger takes a free buffer of the smallest class above c that has one.
func (a *Allocator) popLarger(c int, s uint32) (uint32, bool) {
	for k := c + 1; k < len(a.classes); k++ {
		if id, ok := a.pop(&a.classes[k], s); ok {
			return id, true
		}
	}
	return 0, false
}

func (a *Allocator) pop(cl *class, s uint32) (uint32, bool) {
	for i := range uint32(len(cl.shards)) {
		sh := &cl.shards[(s+i)&a.shardMask]
		for {
			h := sh.head.Load()
			if uint32(h) == 0 {
				break
			}
			id := uint32(h) - 1
			_, sl := a.slot(id)
			next := sl.next.Load()
			if sh.head.CompareAndSwap(h, (h>>32+1)<<32|uint64(next)) {
				return id, true
			}
		}
	}
	return 0, false
}

// pushChain pushes the chain first..last (linked through next) onto sh.
func (a *Allocator) pushChain(sh *shard, first uint32, last *slot) {
	for {
		h := sh.head.Load()
		last.next.Store(uint32(h))
		if sh.head.CompareAndSwap(h, (h>>32+1)<<32|uint64(first+1)) {
			return
		}
	}
}

// grow returns a free slot of class c, carving a new chunk (and registering
// a new region if none has room). Slow path, under mu.
func (a *Allocator) grow(c int) (uint32, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed.Load() {
		return 0, errAllocClosed
	}
	cl := &a.classes[c]
	if id, ok := a.pop(cl, 0); ok { // another goroutine grew it meanwhile
		return id, nil
	}
	need := roundUp(cl.size, granule)
	var r *region
	for i := len(a.all) - 1; i >= 0; i-- {
		if len(a.all[i].buf)-a.all[i].used >= need {
			r = a.all[i]
			break
		}
	}
	if r == nil {
		size := int64(a.cfg.RegionSize)
		if left := a.cfg.Limit - a.registered; size > left {
			size = left / granule * granule
		}
		if size < int64(need) || a.nchunks >= len(a.chunks) {
			cl.failures.Add(1)
			return 0, a.fullErr(cl.size)
		}
		var err error
		if r, err = a.newRegion(int(size)); err != nil {
			cl.failures.Add(1)
			return 0, fmt.Errorf("mr: allocator: growing the %s class: %w", fmtBytes(int64(cl.size)), err)
		}
	}
	ci := a.nchunks
	a.nchunks++
	k := need / cl.size
	ch := &chunk{
		base: unsafe.Pointer(&r.buf[r.used]), addr: r.base + uint64(r.used), off: r.used,
		class: uint32(c), size: uint32(cl.size), lkey: r.lkey, rkey: r.rkey,
		slots: make([]slot, k),
	}
	a.chunks[ci].Store(ch) // published before any of its IDs
	for g := r.used / granule; g < (r.used+need)/granule; g++ {
		r.chunkOf[g].Store(uint32(ci + 1))
	}
	r.used += need
	cl.carved += int64(k)
	first := uint32(ci) << slotBits
	// Slot 0 is the caller's; spread the rest over the shards in chains.
	rest := k - 1
	per := max(1, (rest+len(cl.shards)-1)/len(cl.shards))
	for i, s := 1, 0; i < k; i, s = i+per, s+1 {
		j := min(i+per, k) // chain [i, j)
		for x := i; x < j-1; x++ {
			ch.slots[x].next.Store(first + uint32(x) + 2)
		}
		a.pushChain(&cl.shards[s&int(a.shardMask)], first+uint32(i), &ch.slots[j-1])
	}
	return first, nil
}

func (a *Allocator) fullErr(size int) error {
	st := a.statsLocked()
	return fmt.Errorf("mr: allocator: %s limit reached allocating a %s buffer (in use %s, %s registered): %w",
		fmtBytes(a.cfg.Limit), fmtBytes(int64(size)), fmtBytes(st.InUseBytes), fmtBytes(st.Registered), ErrAllocatorFull)
}

func (a *Allocator) newRegion(size int) (*region, error) {
	// Alloc aligns to 64 KiB at least (2 MiB for multiples of 2 MiB),
	// huge pages or not: chunks are granule-aligned, so buffers of classes
	// up to 64 KiB are naturally aligned.
	mem, err := Alloc(size)
	if err != nil {
		return nil, err
	}
	buf := mem.Bytes()
	lkey, rkey, release, err := a.register(a.pd, buf, a.cfg.Access)
	if err != nil {
		mem.Close()
		return nil, err
	}
	r := &region{mem: mem, buf: buf, base: uint64(uintptr(unsafe.Pointer(&buf[0]))),
		lkey: lkey, rkey: rkey, release: release, chunkOf: make([]atomic.Uint32, size/granule)}
	a.all = append(a.all, r)
	a.registered += int64(size)
	rs := slices.Clone(*a.regions.Load())
	rs = append(rs, r)
	slices.SortFunc(rs, func(x, y *region) int {
		if x.base < y.base {
			return -1
		}
		return 1
	})
	a.regions.Store(&rs)
	return r, nil
}

// Lookup returns the in-use buffer holding addr (any byte of it, up to its
// class size), e.g. the address of a receive completion. It does not find
// free buffers, or anything after Close. O(log regions).
func (a *Allocator) Lookup(addr uint64) (Buf, bool) {
	if a.bad() {
		return Buf{}, false
	}
	if a.closed.Load() {
		return Buf{}, false
	}
	rs := *a.regions.Load()
	lo, hi := 0, len(rs) // first region with base > addr
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if rs[m].base <= addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 {
		return Buf{}, false
	}
	r := rs[lo-1]
	off := addr - r.base
	if off >= uint64(len(r.buf)) {
		return Buf{}, false
	}
	ci := r.chunkOf[off/granule].Load()
	if ci == 0 {
		return Buf{}, false
	}
	ch := a.chunks[ci-1].Load()
	i := (addr - ch.addr) / uint64(ch.size)
	if i >= uint64(len(ch.slots)) {
		return Buf{}, false
	}
	return a.fromSlot((ci-1)<<slotBits|uint32(i), 0, false)
}

// FromHandle returns the buffer a Handle names, if that allocation is still
// in use. O(1).
func (a *Allocator) FromHandle(h uint64) (Buf, bool) {
	if a.bad() {
		return Buf{}, false
	}
	id := uint32(h)
	if a.closed.Load() || int(id>>slotBits) >= len(a.chunks) {
		return Buf{}, false
	}
	ch := a.chunks[id>>slotBits].Load()
	if ch == nil || int(id&slotMask) >= len(ch.slots) {
		return Buf{}, false
	}
	return a.fromSlot(id, uint32(h>>32), true)
}

func (a *Allocator) fromSlot(id, gen uint32, checkGen bool) (Buf, bool) {
	ch, sl := a.slot(id)
	st := sl.state.Load()
	if st&1 == 0 || checkGen && st>>1 != gen {
		return Buf{}, false
	}
	i := id & slotMask
	return Buf{a: a, p: unsafe.Add(ch.base, uintptr(i)*uintptr(ch.size)), n: sl.n.Load(),
		lkey: ch.lkey, rkey: ch.rkey, id: id, gen: st >> 1, class: ch.class}, true
}

// AllocatorStats is a snapshot of an allocator's accounting. Byte counts of
// buffers are class sizes.
type AllocatorStats struct {
	Limit       int64 // most bytes it may register
	Registered  int64 // bytes in registered regions
	Regions     int   // registered regions = MRs
	HugeRegions int   // regions on huge pages
	Carved      int64 // bytes cut into buffers
	InUseBytes  int64
	InUse       int64 // buffers allocated and not freed
	Allocs      uint64
	Frees       uint64
	Failures    uint64 // Allocs that failed to grow (limit or registration)
	Classes     []ClassStats
}

// ClassStats is one size class's part of AllocatorStats.
type ClassStats struct {
	Size     int
	Carved   int64 // buffers cut for the class
	InUse    int64 // buffers allocated and not freed
	Free     int64 // Carved - InUse: in free lists or Caches
	Allocs   uint64
	Frees    uint64
	Failures uint64
}

// Stats returns a snapshot. Under concurrent use the counts are each
// consistent with some moment (InUse never negative), not all with one.
func (a *Allocator) Stats() AllocatorStats {
	if a.bad() {
		return AllocatorStats{}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.statsLocked()
}

func (a *Allocator) statsLocked() AllocatorStats {
	st := AllocatorStats{Limit: a.cfg.Limit, Registered: a.registered, Regions: len(a.all),
		Classes: make([]ClassStats, len(a.classes))}
	for _, r := range a.all {
		if r.mem.Huge() {
			st.HugeRegions++
		}
	}
	for c := range a.classes {
		cl := &a.classes[c]
		cs := &st.Classes[c]
		cs.Size, cs.Carved, cs.Failures = cl.size, cl.carved, cl.failures.Load()
		// Frees before allocs: a counted free's alloc is then counted too.
		cs.Frees = a.retired[c].frees
		for k := range a.caches {
			cs.Frees += k.cls[c].frees.Load()
		}
		for i := range cl.shards {
			cs.Frees += cl.shards[i].frees.Load()
		}
		cs.Allocs = a.retired[c].allocs
		for k := range a.caches {
			cs.Allocs += k.cls[c].allocs.Load()
		}
		for i := range cl.shards {
			cs.Allocs += cl.shards[i].allocs.Load()
		}
		cs.InUse = int64(cs.Allocs - cs.Frees)
		cs.Free = cs.Carved - cs.InUse
		st.Carved += cs.Carved * int64(cs.Size)
		st.InUse += cs.InUse
		st.InUseBytes += cs.InUse * int64(cs.Size)
		st.Allocs += cs.Allocs
		st.Frees += cs.Frees
		st.Failures += cs.Failures
	}
	return st
}

// Close deregisters every region, so the device can no longer touch the
// memory, and unmaps them. If buffers are still in use it leaves the memory
// mapped (so Go code still holding their Bytes cannot fault; the memory is
// then never unmapped) and returns an error wrapping ErrInUse. Afterwards
// Alloc and Free return an error wrapping uverbs.ErrClosed and Lookup finds
// nothing. Buffers held in Caches count as free. Close is idempotent.
//
// Against concurrent Allocs and Frees (through the Allocator or a Cache)
// Close is exact: each buffer's Alloc or Free either happens before Close
// and is counted by it, or fails with the closed error. So the number in
// the ErrInUse error is the buffers whose Alloc succeeded and whose Free
// did not, no buffer is handed out once Close has begun deregistering, and
// a Free that fails for the close leaves its buffer among those counted
// (its memory stays mapped).
func (a *Allocator) Close() error {
	if a.bad() {
		return errNilAllocator
	}
	return a.close(false)
}

// Discard is Close for an owner that knows none of its buffers will be
// touched again (its queues, which could still write into them, are
// destroyed, and no buffer is out with a user): it deregisters and unmaps
// every region even with buffers still allocated. Free and Alloc after it
// are safe (they fail or do nothing); Buf.Bytes of a buffer from before it
// is not.
func (a *Allocator) Discard() error {
	if a.bad() {
		return errNilAllocator
	}
	return a.close(true)
}

func (a *Allocator) close(discard bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed.Load() {
		return nil
	}
	a.closed.Store(true)
	// Every slot is marked closed, each in one atomic step: an Alloc's
	// take and a Free are CASes on the same word, so each lands wholly
	// before the mark (the buffer is counted by what it left) or fails
	// after it with the closed error (a Free that fails leaves its buffer
	// counted in use). When the marking is done no buffer can be handed
	// out or given back: the count is exact, and every buffer live while
	// the regions are deregistered below is in it.
	var inUse, bytes int64
	for i := range a.nchunks {
		ch := a.chunks[i].Load()
		for j := range ch.slots {
			if ch.slots[j].state.Swap(closedSlot)&1 != 0 {
				inUse++
				bytes += int64(ch.size)
			}
		}
	}
	var errs []error
	for _, r := range a.all {
		if err := r.release(); err != nil {
			errs = append(errs, fmt.Errorf("mr: allocator: deregister region at %#x: %w", r.base, err))
		}
	}
	if inUse > 0 && !discard {
		errs = append(errs, fmt.Errorf("mr: allocator: closed with %d buffers (%s) in use: regions deregistered, %s left mapped: %w",
			inUse, fmtBytes(bytes), fmtBytes(a.registered), ErrInUse))
	} else {
		for _, r := range a.all {
			errs = append(errs, r.mem.Close())
		}
	}
	a.regions.Store(new([]*region))
	return errors.Join(errs...)
}

// Cache is a single-owner front end to an Allocator for a hot loop (one per
// endpoint or poller goroutine): per class a small stack of free buffers
// that needs no atomic read-modify-write. It is not safe for concurrent use.
// Buffers from a Cache may be freed to the Allocator or another Cache and
// vice versa.
type Cache struct {
	a      *Allocator
	cls    []cacheClass
	closed bool
}

type cacheClass struct {
	ids []uint32
	// Written only by the owner (load+store, no locked instruction), read
	// by Stats.
	allocs atomic.Uint64
	frees  atomic.Uint64
}

// NewCache returns a Cache holding up to Config().CacheSize free buffers per
// class. Close it to hand them back. A nil or zero Allocator returns nil.
func (a *Allocator) NewCache() *Cache {
	if a.bad() {
		return nil
	}
	k := &Cache{a: a, cls: make([]cacheClass, len(a.classes))}
	for i := range k.cls {
		k.cls[i].ids = make([]uint32, 0, a.cfg.CacheSize)
	}
	a.mu.Lock()
	a.caches[k] = struct{}{}
	a.mu.Unlock()
	return k
}

var errCacheClosed = fmt.Errorf("mr: allocator cache: %w", uverbs.ErrClosed)

// Alloc is Allocator.Alloc through the cache.
func (k *Cache) Alloc(n int) (Buf, error) {
	if k.bad() {
		return Buf{}, errNilCache
	}
	if k.closed {
		return Buf{}, errCacheClosed
	}
	a := k.a
	c, err := a.classOf(n)
	if err != nil {
		return Buf{}, err
	}
	cc := &k.cls[c]
	if len(cc.ids) == 0 {
		if err := k.refill(c); err != nil {
			return k.allocLarger(c, n, err)
		}
	}
	id := cc.ids[len(cc.ids)-1]
	cc.ids = cc.ids[:len(cc.ids)-1]
	b, err := a.take(id, n)
	if err != nil {
		return Buf{}, err
	}
	cc.allocs.Store(cc.allocs.Load() + 1)
	return b, nil
}

// allocLarger is Cache.Alloc when class c has no buffer and refill failed
// with err: at the limit, as Allocator.Alloc does, a free buffer of a
// larger class serves, one this cache holds first, else the allocator's.
func (k *Cache) allocLarger(c, n int, err error) (Buf, error) {
	if !errors.Is(err, ErrAllocatorFull) {
		return Buf{}, err
	}
	a := k.a
	var id uint32
	found := false
	for d := c + 1; d < len(k.cls) && !found; d++ {
		if ids := k.cls[d].ids; len(ids) > 0 {
			id, found = ids[len(ids)-1], true
			k.cls[d].ids = ids[:len(ids)-1]
		}
	}
	if !found {
		if id, found = a.popLarger(c, a.shard()); !found {
			return Buf{}, err
		}
	}
	b, err := a.take(id, n)
	if err != nil {
		return Buf{}, err
	}
	cc := &k.cls[b.class] // counted in the class it came from, as Allocator.Alloc does
	cc.allocs.Store(cc.allocs.Load() + 1)
	return b, nil
}

// refill moves up to half a cache of free buffers of class c from the
// allocator, growing it if it has none.
func (k *Cache) refill(c int) error {
	a, cc := k.a, &k.cls[c]
	s := a.shard()
	for len(cc.ids) < cap(cc.ids)/2 {
		id, ok := a.pop(&a.classes[c], s)
		if !ok {
			break
		}
		cc.ids = append(cc.ids, id)
	}
	if len(cc.ids) > 0 {
		return nil
	}
	id, err := a.grow(c)
	if err != nil {
		return err
	}
	cc.ids = append(cc.ids, id)
	return nil
}

// Free is Allocator.Free through the cache.
func (k *Cache) Free(b Buf) error {
	if k.bad() {
		return errNilCache
	}
	if k.closed {
		return errCacheClosed
	}
	a := k.a
	sl, err := a.check(b)
	if err != nil {
		return err
	}
	if !sl.state.CompareAndSwap(b.gen<<1|1, b.gen<<1) {
		return a.badFree(b, sl)
	}
	cc := &k.cls[b.class]
	if len(cc.ids) == cap(cc.ids) {
		k.spill(int(b.class), cap(cc.ids)/2)
	}
	cc.ids = append(cc.ids, b.id)
	cc.frees.Store(cc.frees.Load() + 1)
	return nil
}

// spill hands the newest n cached buffers of class c back as one chain.
func (k *Cache) spill(c, n int) {
	a, cc := k.a, &k.cls[c]
	if n == 0 {
		return
	}
	ids := cc.ids[len(cc.ids)-n:]
	for i := 0; i < len(ids)-1; i++ {
		_, sl := a.slot(ids[i])
		sl.next.Store(ids[i+1] + 1)
	}
	_, last := a.slot(ids[len(ids)-1])
	a.pushChain(&a.classes[c].shards[a.shard()], ids[0], last)
	cc.ids = cc.ids[:len(cc.ids)-n]
}

// Flush hands every cached free buffer back to the allocator.
func (k *Cache) Flush() {
	if k.bad() {
		return
	}
	for c := range k.cls {
		k.spill(c, len(k.cls[c].ids))
	}
}

// Close flushes the cache and detaches it; its counters stay in the
// allocator's Stats. Idempotent.
func (k *Cache) Close() error {
	if k.bad() {
		return errNilCache
	}
	if k.closed {
		return nil
	}
	k.Flush()
	k.closed = true
	a := k.a
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.caches, k)
	for c := range k.cls {
		a.retired[c].allocs += k.cls[c].allocs.Load()
		a.retired[c].frees += k.cls[c].frees.Load()
	}
	return nil
}

func roundUp(n, m int) int { return (n + m - 1) / m * m }

// fmtBytes formats n as "1 MiB", "63.8 MiB", "512 B".
func fmtBytes(n int64) string { return units.Bytes(n) }
