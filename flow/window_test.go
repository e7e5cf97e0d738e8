package flow

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs"
)

// wop is one step of a Window table test on the tree
// root{4 msgs, 100 B} > q1{2 msgs, 60 B}, q2{3 msgs}.
type wop struct {
	w      string // r, q1, q2
	op     string // try, rel
	b      int64
	ok     bool  // try
	err    error // rel
	q1, rt [2]int64
}

func TestWindowTable(t *testing.T) {
	ops := []wop{
		{w: "q1", op: "try", b: 50, ok: true, q1: [2]int64{1, 50}, rt: [2]int64{1, 50}},
		{w: "q1", op: "try", b: 20, ok: false, q1: [2]int64{1, 50}, rt: [2]int64{1, 50}}, // q1 bytes
		{w: "q1", op: "try", b: 10, ok: true, q1: [2]int64{2, 60}, rt: [2]int64{2, 60}},
		{w: "q1", op: "try", b: 0, ok: false, q1: [2]int64{2, 60}, rt: [2]int64{2, 60}}, // q1 msgs
		{w: "q2", op: "try", b: 40, ok: true, q1: [2]int64{2, 60}, rt: [2]int64{3, 100}},
		{w: "q2", op: "try", b: 1, ok: false, q1: [2]int64{2, 60}, rt: [2]int64{3, 100}}, // root bytes
		{w: "q2", op: "rel", b: 40, q1: [2]int64{2, 60}, rt: [2]int64{2, 60}},
		{w: "q2", op: "rel", b: 40, err: ErrOverRelease, q1: [2]int64{2, 60}, rt: [2]int64{2, 60}},
		{w: "q1", op: "rel", b: 61, err: ErrOverRelease, q1: [2]int64{2, 60}, rt: [2]int64{2, 60}},
		{w: "q1", op: "rel", b: 50, q1: [2]int64{1, 10}, rt: [2]int64{1, 10}},
		{w: "q2", op: "try", b: 500, ok: false, q1: [2]int64{1, 10}, rt: [2]int64{1, 10}}, // oversize, not alone
		{w: "q1", op: "rel", b: 10, q1: [2]int64{0, 0}, rt: [2]int64{0, 0}},
		{w: "q2", op: "try", b: 500, ok: true, q1: [2]int64{0, 0}, rt: [2]int64{1, 500}}, // oversize alone
		{w: "q1", op: "try", b: 1, ok: false, q1: [2]int64{0, 0}, rt: [2]int64{1, 500}},
		{w: "r", op: "try", b: 0, ok: false, q1: [2]int64{0, 0}, rt: [2]int64{1, 500}}, // not even zero bytes
		{w: "q2", op: "rel", b: 500, q1: [2]int64{0, 0}, rt: [2]int64{0, 0}},
		{w: "q1", op: "try", b: 70, ok: true, q1: [2]int64{1, 70}, rt: [2]int64{1, 70}}, // oversize at q1 only
		{w: "q2", op: "try", b: 30, ok: true, q1: [2]int64{1, 70}, rt: [2]int64{2, 100}},
		{w: "q1", op: "try", b: -1, ok: false, q1: [2]int64{1, 70}, rt: [2]int64{2, 100}},
		{w: "q1", op: "rel", b: -1, err: ErrOverRelease, q1: [2]int64{1, 70}, rt: [2]int64{2, 100}},
	}
	root := NewWindow(Limits{Msgs: 4, Bytes: 100})
	ws := map[string]*Window{
		"r":  root,
		"q1": root.NewChild(Limits{Msgs: 2, Bytes: 60}),
		"q2": root.NewChild(Limits{Msgs: 3}),
	}
	for i, o := range ops {
		w := ws[o.w]
		switch o.op {
		case "try":
			if got := w.TryAcquire(o.b); got != o.ok {
				t.Fatalf("step %d %+v: TryAcquire = %v", i, o, got)
			}
		case "rel":
			if err := w.Release(o.b); (o.err == nil) != (err == nil) || (o.err != nil && !errors.Is(err, o.err)) {
				t.Fatalf("step %d %+v: Release = %v", i, o, err)
			}
		}
		m, b := ws["q1"].Outstanding()
		rm, rb := root.Outstanding()
		if [2]int64{m, b} != o.q1 || [2]int64{rm, rb} != o.rt {
			t.Fatalf("step %d %+v: q1 %d/%d root %d/%d", i, o, m, b, rm, rb)
		}
	}
	if st := root.Stats(); st.Oversize != 1 || st.Acquired != 6 {
		t.Fatalf("root stats %+v", st)
	}
}

// acquireAsync starts Acquire in a goroutine and waits until it is queued.
func acquireAsync(t *testing.T, ctx context.Context, w *Window, b int64) <-chan error {
	t.Helper()
	before := w.Stats().Stalls
	errc := make(chan error, 1)
	go func() { errc <- w.Acquire(ctx, b) }()
	waitStalls(t, func() uint64 { return w.Stats().Stalls }, before+1)
	return errc
}

func expectBlocked(t *testing.T, errc <-chan error, what string) {
	t.Helper()
	select {
	case err := <-errc:
		t.Fatalf("%s: returned %v while it should wait", what, err)
	case <-time.After(10 * time.Millisecond):
	}
}

func TestWindowFairness(t *testing.T) {
	ctx := context.Background()
	root := NewWindow(Limits{Msgs: 8, Bytes: 100})
	q1 := root.NewChild(Limits{Msgs: 1})
	q2 := root.NewChild(Limits{})
	q3 := root.NewChild(Limits{})

	// A full QP window does not hold up its siblings.
	if !q1.TryAcquire(10) {
		t.Fatal("q1 first acquire")
	}
	w1 := acquireAsync(t, ctx, q1, 10)
	if !q2.TryAcquire(50) {
		t.Fatal("q2 blocked behind q1's waiter")
	}
	// A large message waiting at the root is not overtaken there.
	big := acquireAsync(t, ctx, q2, 60) // root: 60 outstanding + 60 > 100
	if q3.TryAcquire(10) {
		t.Fatal("small message overtook the large waiter at the root")
	}
	small := acquireAsync(t, ctx, q3, 10)
	expectBlocked(t, small, "small behind big")
	if err := q2.Release(50); err != nil { // root 10 outstanding: big fits, then small
		t.Fatal(err)
	}
	if err := <-big; err != nil {
		t.Fatal(err)
	}
	if err := <-small; err != nil {
		t.Fatal(err)
	}
	expectBlocked(t, w1, "q1 second")
	if err := q1.Release(10); err != nil {
		t.Fatal(err)
	}
	if err := <-w1; err != nil {
		t.Fatal(err)
	}
	if m, b := root.Outstanding(); m != 3 || b != 80 {
		t.Fatalf("root %d/%d, want 3/80", m, b)
	}
}

func TestWindowOversizeNotStarved(t *testing.T) {
	ctx := context.Background()
	root := NewWindow(Limits{Bytes: 100})
	q := root.NewChild(Limits{})
	if !q.TryAcquire(40) {
		t.Fatal("first")
	}
	huge := acquireAsync(t, ctx, q, 1000)
	if q.TryAcquire(1) {
		t.Fatal("small overtook the oversize waiter")
	}
	if err := q.Release(40); err != nil {
		t.Fatal(err)
	}
	if err := <-huge; err != nil {
		t.Fatal(err)
	}
	if q.TryAcquire(1) {
		t.Fatal("admitted beside an oversize message")
	}
	if err := q.Release(1000); err != nil {
		t.Fatal(err)
	}
	if !q.TryAcquire(1) {
		t.Fatal("empty window refused")
	}
}

func TestWindowCancelAndClose(t *testing.T) {
	root := NewWindow(Limits{Msgs: 1})
	q1 := root.NewChild(Limits{})
	q2 := root.NewChild(Limits{})
	if !q1.TryAcquire(1) {
		t.Fatal("first")
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := acquireAsync(t, ctx, q1, 1)
	next := acquireAsync(t, context.Background(), q2, 1)
	cancel()
	if err := <-c; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled = %v", err)
	}
	if err := q1.Release(1); err != nil {
		t.Fatal(err)
	}
	if err := <-next; err != nil { // served although a waiter before it left
		t.Fatal(err)
	}
	if m, _ := root.Outstanding(); m != 1 {
		t.Fatalf("outstanding %d, want 1: the cancelled waiter holds nothing", m)
	}
	closed := acquireAsync(t, context.Background(), q1, 1)
	other := acquireAsync(t, context.Background(), q2, 1)
	q1.Close()
	q1.Close()
	if err := <-closed; !errors.Is(err, ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Fatalf("waiter on closed window = %v", err)
	}
	if err := q1.Acquire(context.Background(), 1); !errors.Is(err, ErrClosed) || !errors.Is(err, goverbs.ErrClosed) {
		t.Fatalf("Acquire on closed window = %v", err)
	}
	expectBlocked(t, other, "sibling of a closed window")
	if err := q2.Release(1); err != nil {
		t.Fatal(err)
	}
	if err := <-other; err != nil {
		t.Fatal(err)
	}
}

// TestWindowConcurrent: goroutines on several QP windows of one endpoint
// acquire random sizes (some oversize), with deadlines; a shadow model
// (never above the real counts) checks no level ever exceeds its limits.
func TestWindowConcurrent(t *testing.T) {
	rootLim := Limits{Msgs: 8, Bytes: 1000}
	qLim := Limits{Msgs: 3, Bytes: 400}
	root := NewWindow(rootLim)
	const qps = 4
	var qs [qps]*Window
	for i := range qs {
		qs[i] = root.NewChild(qLim)
	}
	var mu sync.Mutex
	var shadow [qps + 1][2]int64 // msgs, bytes; index qps is the root
	check := func(lvl int, l Limits) {
		m, b := shadow[lvl][0], shadow[lvl][1]
		if m > l.Msgs || (b > l.Bytes && m > 1) {
			t.Errorf("level %d: %d msgs, %d bytes exceed %+v", lvl, m, b, l)
		}
	}
	var wg sync.WaitGroup
	for g := range 24 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			q := g % qps
			for range 300 {
				b := 1 + rng.Int64N(450)
				if rng.IntN(50) == 0 {
					b = 1500 // oversize everywhere
				}
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if rng.IntN(6) == 0 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(20))*time.Microsecond)
				}
				err := qs[q].Acquire(ctx, b)
				cancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("Acquire: %v", err)
					}
					continue
				}
				mu.Lock()
				shadow[q][0]++
				shadow[q][1] += b
				shadow[qps][0]++
				shadow[qps][1] += b
				check(q, qLim)
				check(qps, rootLim)
				mu.Unlock()
				if rng.IntN(4) == 0 {
					time.Sleep(time.Duration(rng.IntN(50)) * time.Microsecond)
				}
				mu.Lock()
				shadow[q][0]--
				shadow[q][1] -= b
				shadow[qps][0]--
				shadow[qps][1] -= b
				mu.Unlock()
				if err := qs[q].Release(b); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if m, b := root.Outstanding(); m != 0 || b != 0 {
		t.Fatalf("root outstanding %d/%d after all released", m, b)
	}
	for _, q := range qs {
		if m, b := q.Outstanding(); m != 0 || b != 0 {
			t.Fatalf("qp outstanding %d/%d after all released", m, b)
		}
	}
	st := root.Stats()
	t.Logf("root stats %+v", st)
}

// TestWindowAcquireN: m messages are taken together and released one at
// a time; a waiter for several keeps its place ahead of later single
// messages; more than the limit goes alone.
func TestWindowAcquireN(t *testing.T) {
	root := NewWindow(Limits{Msgs: 4, Bytes: 100})
	q := root.NewChild(Limits{Msgs: 4})
	out := func(want int64) {
		t.Helper()
		if m, _ := root.Outstanding(); m != want {
			t.Fatalf("%d messages outstanding, want %d", m, want)
		}
	}
	if q.TryAcquireN(0, 10) || q.TryAcquireN(-1, 10) {
		t.Fatal("TryAcquireN of fewer than 1 message admitted")
	}
	if err := q.AcquireN(context.Background(), 0, 10); err == nil {
		t.Fatal("AcquireN of 0 messages: no error")
	}
	if !q.TryAcquireN(3, 30) {
		t.Fatal("TryAcquireN(3, 30) on an empty window refused")
	}
	out(3)
	if q.TryAcquireN(2, 2) {
		t.Fatal("TryAcquireN(2) admitted with 1 of 4 messages free")
	}
	// A waiter for 2 queues; a single message behind it must not pass.
	done := make(chan error, 1)
	go func() { done <- q.AcquireN(context.Background(), 2, 20) }()
	for deadline := time.Now().Add(10 * time.Second); q.Stats().Waiting == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("AcquireN(2) never queued")
		}
	}
	if q.TryAcquire(1) {
		t.Fatal("a single message overtook a queued AcquireN")
	}
	for i := 0; i < 2; i++ { // the parts released one by one
		if err := q.Release(10); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("AcquireN(2) not admitted with 3 of 4 messages free")
	}
	out(3) // 1 left of the first three, 2 new
	for _, b := range []int64{10, 10, 10} {
		if err := q.Release(b); err != nil {
			t.Fatal(err)
		}
	}
	out(0)
	if err := q.Release(1); !errors.Is(err, ErrOverRelease) {
		t.Fatalf("release past zero: %v", err)
	}
	// Over the limit of messages: alone, and nothing beside it.
	if !q.TryAcquireN(6, 60) {
		t.Fatal("TryAcquireN(6) over a limit of 4 refused on an empty window")
	}
	if q.TryAcquire(1) {
		t.Fatal("a message admitted beside an oversize AcquireN")
	}
	// A cancelled AcquireN holds nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := q.AcquireN(ctx, 2, 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AcquireN on a full window: %v", err)
	}
	out(6)
	// ReleaseN gives back a whole AcquireN; more than is out changes nothing.
	for _, c := range [][2]int64{{7, 60}, {6, 61}, {0, 0}, {1, -1}} {
		if err := q.ReleaseN(c[0], c[1]); !errors.Is(err, ErrOverRelease) {
			t.Fatalf("ReleaseN(%d, %d) with 6 messages, 60 bytes out: %v", c[0], c[1], err)
		}
	}
	out(6)
	if err := q.ReleaseN(6, 60); err != nil {
		t.Fatal(err)
	}
	out(0)
	if _, b := root.Outstanding(); b != 0 {
		t.Fatalf("%d bytes outstanding after ReleaseN, want 0", b)
	}
}
