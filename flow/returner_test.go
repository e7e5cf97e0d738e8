package flow

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// rop is one step of a Returner table test; pending is Pending() after it.
type rop struct {
	op      string        // consume, release, ctl, piggy, needs, quiet, resync, reset
	n       uint64        // consume/release/ctl: count; piggy: want cumulative; resync: want granted; reset: grant
	c       uint64        // resync: want consumed
	at      time.Duration // needs: now - t0
	epoch   uint32        // resync, reset
	want    bool          // piggy: fresh; needs, quiet: the result
	err     error
	pending uint64
}

func TestReturnerTable(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name string
		cfg  ReturnerConfig
		ops  []rop
	}{
		{"policy", ReturnerConfig{Grant: 8, IdleTimeout: ms}, []rop{ // threshold 4
			{op: "needs", want: false},
			{op: "consume", n: 3},
			{op: "release", n: 1, pending: 1},
			{op: "quiet", want: false, pending: 1},        // a data credit to return: due some time
			{op: "needs", at: 0, want: false, pending: 1}, // idle clock starts
			{op: "needs", at: ms / 2, want: false, pending: 1},
			{op: "needs", at: ms, want: true, pending: 1}, // idle
			{op: "piggy", n: 9, want: true},
			{op: "piggy", n: 9, want: false},
			{op: "quiet", want: true},
			{op: "release", n: 2, pending: 2},
			{op: "release", n: 1, err: ErrOverRelease, pending: 2},
			{op: "needs", at: 2 * ms, want: false, pending: 2},
			{op: "consume", n: 6, pending: 2},                  // the peer used every credit told
			{op: "consume", n: 1, err: ErrOverrun, pending: 2}, // one more is an overrun
			{op: "needs", at: 2 * ms, want: false, pending: 2}, // starved peer: still batched
			{op: "needs", at: 3 * ms, want: true, pending: 2},
			{op: "release", n: 3, pending: 5},
			{op: "piggy", n: 14, want: true},
			// A credit update from the peer (it spent a credit on it).
			{op: "consume", n: 1},
			{op: "ctl", n: 1, pending: 1},
			{op: "needs", at: 4 * ms, want: false, pending: 1},
			{op: "needs", at: 6 * ms, want: false, pending: 1}, // control credits alone: no ping-pong
			{op: "quiet", want: true, pending: 1},              // ... and none will be due without an event
			{op: "consume", n: 3, pending: 1},                  // the peer is down to its reserve
			{op: "quiet", want: false, pending: 1},
			{op: "needs", at: 6 * ms, want: true, pending: 1}, // give it its stranded credit back
			{op: "release", n: 4, pending: 5},
			{op: "needs", at: 5 * ms, want: true, pending: 5}, // threshold
			{op: "resync", epoch: 1, n: 19, c: 13},
			{op: "resync", epoch: 1, err: ErrStaleEpoch},
			{op: "piggy", n: 19, want: false},
			{op: "release", n: 1, pending: 1},
			{op: "reset", epoch: 2, n: 4},
			{op: "piggy", n: 4, want: false},
			{op: "consume", n: 4},
			{op: "consume", n: 1, err: ErrOverrun},
			{op: "release", n: 1, pending: 1},
			{op: "needs", at: 9 * ms, want: false, pending: 1},
			{op: "needs", at: 10 * ms, want: true, pending: 1}, // idle
		}},
		{"threshold and idle config", ReturnerConfig{Grant: 32, Threshold: 3, IdleTimeout: 10 * ms}, []rop{
			{op: "consume", n: 10},
			{op: "release", n: 2, pending: 2},
			{op: "needs", at: 0, want: false, pending: 2},
			{op: "needs", at: 9 * ms, want: false, pending: 2},
			{op: "release", n: 1, pending: 3},
			{op: "needs", at: 9 * ms, want: true, pending: 3},
			{op: "piggy", n: 35, want: true},
			{op: "release", n: 1, pending: 1},
			{op: "needs", at: 11 * ms, want: false, pending: 1}, // clock restarted by the piggyback
			{op: "needs", at: 21 * ms, want: true, pending: 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewReturner(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Unix(1000, 0)
			for i, o := range tt.ops {
				var err error
				switch o.op {
				case "consume":
					err = r.Consumed(o.n)
				case "release":
					err = r.Released(o.n)
				case "ctl":
					err = r.ReleasedControl(o.n)
				case "piggy":
					g, fresh := r.Piggyback()
					if g != o.n || fresh != o.want {
						t.Fatalf("step %d %+v: Piggyback = %d, %v", i, o, g, fresh)
					}
				case "quiet":
					if got := r.Quiet(); got != o.want {
						t.Fatalf("step %d %+v: Quiet = %v", i, o, got)
					}
				case "needs":
					if got := r.NeedsUpdate(t0.Add(o.at)); got != o.want {
						t.Fatalf("step %d %+v: NeedsUpdate = %v", i, o, got)
					}
				case "resync":
					var g, c uint64
					g, c, err = r.Resync(o.epoch)
					if err == nil && (g != o.n || c != o.c || r.Epoch() != o.epoch) {
						t.Fatalf("step %d %+v: Resync = %d, %d (epoch %d)", i, o, g, c, r.Epoch())
					}
				case "reset":
					err = r.Reset(o.epoch, o.n)
				default:
					t.Fatalf("bad op %q", o.op)
				}
				if (o.err == nil) != (err == nil) || (o.err != nil && !errors.Is(err, o.err)) {
					t.Fatalf("step %d %+v: err = %v", i, o, err)
				}
				if got := r.Pending(); got != o.pending {
					t.Fatalf("step %d %+v: Pending = %d, want %d", i, o, got, o.pending)
				}
			}
		})
	}
}

func TestReturnerConfig(t *testing.T) {
	for _, cfg := range []ReturnerConfig{{Grant: 2}, {Grant: 0}, {Grant: 4, IdleTimeout: -1}} {
		if _, err := NewReturner(cfg); err == nil {
			t.Errorf("NewReturner(%+v) accepted", cfg)
		}
	}
}

// TestReturnerQuiet checks Quiet's promise on random histories: while it
// holds, no explicit update becomes due however long nothing happens, and
// whenever it does not, one becomes due after the idle timeout (so a timer
// stopped on Quiet never strands a credit or a starved peer).
func TestReturnerQuiet(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range 200 {
		r, err := NewReturner(ReturnerConfig{Grant: MinGrant + uint64(rng.IntN(10)), IdleTimeout: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Unix(1000, 0)
		for step := range 60 {
			_, _, told, consumed := r.State()
			switch k := rng.IntN(4); {
			case k == 0 && told > consumed:
				r.Consumed(1)
			case k == 1:
				r.Released(1) // refused when nothing is left to re-post
			case k == 2:
				r.ReleasedControl(1)
			default:
				r.Piggyback()
			}
			quiet := r.Quiet()
			// Probe a copy: NeedsUpdate moves the idle clock.
			c := &Returner{epoch: r.epoch, grant: r.grant, threshold: r.threshold, idle: r.idle,
				consumed: r.consumed, released: r.released, ctlReleased: r.ctlReleased, told: r.told, ctlUntold: r.ctlUntold}
			c.NeedsUpdate(now)
			due := c.NeedsUpdate(now.Add(time.Hour))
			if quiet == due {
				t.Fatalf("run %d step %d: Quiet %v but an update due after an hour of nothing: %v (%+v)", run, step, quiet, due, c)
			}
		}
	}
}

// PiggybackEpoch must tell what Piggyback then Epoch would: the same
// cumulative grant, counted as told (Pending drops to 0, a second call
// is not fresh), and the epoch after a Reset.
func TestReturnerPiggybackEpoch(t *testing.T) {
	r, err := NewReturner(ReturnerConfig{Grant: 8, IdleTimeout: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Consumed(3); err != nil {
		t.Fatal(err)
	}
	if err := r.Released(2); err != nil {
		t.Fatal(err)
	}
	g, ep := r.PiggybackEpoch()
	if g != 10 || ep != r.Epoch() {
		t.Fatalf("PiggybackEpoch = %d, %d; want 10, %d", g, ep, r.Epoch())
	}
	if p := r.Pending(); p != 0 {
		t.Fatalf("Pending after PiggybackEpoch = %d, want 0", p)
	}
	if g2, fresh := r.Piggyback(); fresh || g2 != 10 {
		t.Fatalf("Piggyback after PiggybackEpoch = %d, %v; want 10, false", g2, fresh)
	}
	if st := r.Stats(); st.Piggybacks != 1 || st.Returned != 2 {
		t.Fatalf("stats %+v: want 1 piggyback returning 2", st)
	}
	if err := r.Reset(ep+3, 16); err != nil {
		t.Fatal(err)
	}
	if g, ep2 := r.PiggybackEpoch(); g != 16 || ep2 != ep+3 {
		t.Fatalf("after Reset: PiggybackEpoch = %d, %d; want 16, %d", g, ep2, ep+3)
	}
}
