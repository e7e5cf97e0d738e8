package flow

import "math/bits"

// Verdict is what Dedup.Offer decides about a sequence number.
type Verdict uint8

const (
	// Deliver: first time seen; hand the message to the application.
	Deliver Verdict = iota
	// Duplicate: already delivered (a resend after recovery); drop it.
	Duplicate
	// Ahead: beyond the window; dropped without being recorded, so a
	// later resend can still be delivered. With the sender's window no
	// larger than the Dedup window this cannot happen.
	Ahead
)

func (v Verdict) String() string {
	switch v {
	case Deliver:
		return "deliver"
	case Duplicate:
		return "duplicate"
	case Ahead:
		return "ahead"
	}
	return "verdict(?)"
}

// Dedup is a receiver's duplicate filter for one ordered stream of
// sequence numbers (per peer, per direction, per stream). It remembers the
// lowest sequence not yet delivered (everything below was) and a bitmap of
// the sequences delivered out of order above it, so memory is fixed.
//
// On one RC QP messages arrive in order, the bitmap stays empty and only
// resends after recovery are dropped. A stream striped over several QPs
// interleaves and recovery resends arrive after newer messages; the bitmap
// covers any reordering up to its size, which must be at least the
// stream's send window (the sender never has more than that many
// sequences outstanding beyond the lowest unacknowledged one).
//
// Dedup is not safe for concurrent use: one receive path owns a stream.
type Dedup struct {
	next uint64   // lowest sequence not yet delivered
	size uint64   // window in sequences, a power of two >= 64
	bits []uint64 // ring: bit s&(size-1) for next < s < next+size

	delivered, dups, ahead uint64
}

// maxDedupWindow is the largest reordering window NewDedup makes: 16 Mi
// sequences, a 2 MiB bitmap, far beyond any send window.
const maxDedupWindow = 1 << 24

// NewDedup returns a filter expecting first as the first sequence, with a
// reordering window of at least window sequences (rounded up to a power of
// two, minimum 64), but at most 1<<24 sequences: a window below 64 (or
// negative) is 64, one above 1<<24 is 1<<24 (Window reports the size
// made).
func NewDedup(window int, first uint64) *Dedup {
	size := uint64(64)
	for size < uint64(min(max(window, 0), maxDedupWindow)) {
		size <<= 1
	}
	return &Dedup{next: first, size: size, bits: make([]uint64, size/64)}
}

// Accept reports whether seq should be delivered: true the first time,
// false for a duplicate or a sequence beyond the window.
func (d *Dedup) Accept(seq uint64) bool {
	if d == nil {
		return false
	}
	return d.Offer(seq) == Deliver
}

// Offer classifies seq and records it if it is delivered. A nil Dedup, like
// a zero one, calls every sequence Ahead and delivers none.
func (d *Dedup) Offer(seq uint64) Verdict {
	if d == nil {
		return Ahead
	}
	if seq < d.next {
		d.dups++
		return Duplicate
	}
	if seq-d.next >= d.size {
		d.ahead++
		return Ahead
	}
	if seq == d.next {
		d.advance()
		d.delivered++
		return Deliver
	}
	i := seq & (d.size - 1)
	word, bit := &d.bits[i>>6], uint64(1)<<(i&63)
	if *word&bit != 0 {
		d.dups++
		return Duplicate
	}
	*word |= bit
	d.delivered++
	return Deliver
}

// advance delivers next and moves past every already-delivered sequence
// after it, clearing their bits, a word at a time where it can.
func (d *Dedup) advance() {
	d.next++
	mask := d.size - 1
	for {
		i := d.next & mask
		w := d.bits[i>>6] >> (i & 63)
		if w&1 == 0 {
			return
		}
		// The run of set bits from i on, within this word: at most
		// 64-i&63, and 1<<64 is 0 in Go, so a full word clears it all.
		run := uint64(bits.TrailingZeros64(^w))
		d.bits[i>>6] &^= ((uint64(1) << run) - 1) << (i & 63)
		d.next += run
	}
}

// Next returns the lowest sequence not yet delivered.
func (d *Dedup) Next() uint64 {
	if d == nil {
		return 0
	}
	return d.next
}

// Window returns the reordering window in sequences.
func (d *Dedup) Window() int {
	if d == nil {
		return 0
	}
	return int(d.size)
}

// Counts returns how many sequences were delivered, dropped as duplicates
// and dropped as ahead of the window.
func (d *Dedup) Counts() (delivered, duplicates, ahead uint64) {
	if d == nil {
		return 0, 0, 0
	}
	return d.delivered, d.dups, d.ahead
}
