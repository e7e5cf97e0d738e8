package bx

import (
	"testing"
)

// TestPushOut drives a lane's outs as ack and postOut do: messages
// pushed in sequence, the acknowledged front dropped by reslicing. What
// is left must be exactly the unacknowledged messages, in order, through
// the moves pushOut makes to take back the front's room and its growth
// under a burst; and a ping-pong's steady state must allocate nothing.
func TestPushOut(t *testing.T) {
	var l lane
	next, acked := uint64(1), uint64(0)
	check := func() {
		t.Helper()
		if want := int(next - 1 - acked); len(l.outs) != want {
			t.Fatalf("%d outs, want %d (sent %d, acked %d)", len(l.outs), want, next-1, acked)
		}
		for i := range l.outs {
			if o := &l.outs[i]; o.seq != acked+1+uint64(i) || o.bytes != int64(o.seq) {
				t.Fatalf("outs[%d] = seq %d bytes %d, want seq %d", i, o.seq, o.bytes, acked+1+uint64(i))
			}
		}
		// Behind outs, within outBase's array, nothing stays referenced
		// after a move (clear): spot-check the slot past the end.
		if c := cap(l.outs); len(l.outs) < c {
			if tail := l.outs[len(l.outs):c]; tail[0].g != nil || tail[0].write != nil {
				t.Fatalf("stale pointers past outs")
			}
		}
	}
	push := func() {
		t.Helper()
		po := l.pushOut(&out{seq: next, bytes: int64(next), write: &writeOp{}})
		if po != &l.outs[len(l.outs)-1] || po.seq != next {
			t.Fatalf("pushOut returned %p (seq %d), not the last entry", po, po.seq)
		}
		next++
	}
	ack := func(seq uint64) {
		n := 0
		for n < len(l.outs) && l.outs[n].seq <= seq {
			n++
		}
		l.outs = l.outs[n:]
		acked = seq
	}
	// A ping-pong: two outstanding, the older acknowledged each time.
	push()
	for range 100 {
		push()
		ack(next - 2)
		check()
	}
	// A burst past outsMin (growth), then acknowledged in steps.
	for range 3 * outsMin {
		push()
	}
	check()
	for acked < next-1 {
		ack(min(acked+5, next-1))
		check()
		if acked < next-1 {
			push()
			check()
		}
	}
	// The steady state allocates nothing.
	if a := testing.AllocsPerRun(1000, func() {
		l.pushOut(&out{seq: next, bytes: int64(next)})
		next++
		ack(next - 2)
	}); a != 0 {
		t.Errorf("pushOut in a ping-pong: %v allocations a message", a)
	}
	check()
}
