package bx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Host tests of the RPC accounting (no device: the metrics state alone,
// of a zero Endpoint, whose public methods refuse it).

func TestCallClasses(t *testing.T) {
	var e Endpoint
	m := &e.met
	start := time.Now().Add(-3 * time.Millisecond)
	m.observeCall(7, start, nil)
	m.observeCall(7, start, &RemoteError{Msg: "no"})
	m.observeCall(7, start, context.DeadlineExceeded)
	m.observeCall(9, start, fmt.Errorf("wrapped: %w", &RemoteError{Msg: "no"}))
	m.observeCall(9, start, ErrPeerGone)
	s := Snapshot{Classes: e.met.snapshot()}
	want := []ClassSnapshot{{Class: "7", RemoteErrors: 1, Failures: 1}, {Class: "9", RemoteErrors: 1, Failures: 1}}
	if len(s.Classes) != len(want) {
		t.Fatalf("classes %+v", s.Classes)
	}
	for i, c := range s.Classes {
		w := want[i]
		if c.Class != w.Class || c.RemoteErrors != w.RemoteErrors || c.Failures != w.Failures {
			t.Errorf("class %d: %+v, want %+v", i, c, w)
		}
		wantCount := uint64(2)
		if c.Class == "9" {
			wantCount = 1
		}
		if c.Latency.Count != wantCount || c.Latency.Sum < time.Duration(wantCount)*3*time.Millisecond {
			t.Errorf("class %s: latency count %d sum %v, want %d calls of >= 3ms", c.Class, c.Latency.Count, c.Latency.Sum, wantCount)
		}
		if q := c.Latency.Quantile(0.5); q < 2*time.Millisecond {
			t.Errorf("class %s: p50 %v below the 3ms calls' bucket", c.Class, q)
		}
	}
}

func TestSetStreamClass(t *testing.T) {
	tests := []struct {
		name    string
		class   func(uint32) string
		streams []uint32
		want    map[string]uint64 // class -> calls
	}{
		{"default: the stream number", nil, []uint32{0, 1, 1, 4000000000},
			map[string]uint64{"0": 1, "1": 2, "4000000000": 1}},
		{"grouped", func(s uint32) string { return []string{"even", "odd"}[s%2] }, []uint32{0, 1, 2, 3, 5},
			map[string]uint64{"even": 2, "odd": 3}},
		{"empty is other", func(uint32) string { return "" }, []uint32{1, 2},
			map[string]uint64{OtherStreamClass: 2}},
		{"cut and valid UTF-8", func(uint32) string { return "bad\xff" + strings.Repeat("x", 100) }, []uint32{1},
			map[string]uint64{"bad?" + strings.Repeat("x", 60): 1}},
		{"bounded", func(s uint32) string { return fmt.Sprint("c", s) }, func() []uint32 {
			var s []uint32
			for i := range MaxStreamClasses + 10 {
				s = append(s, uint32(i))
			}
			return s
		}(), func() map[string]uint64 {
			m := map[string]uint64{OtherStreamClass: 10}
			for i := range MaxStreamClasses {
				m[fmt.Sprint("c", i)] = 1
			}
			return m
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var e Endpoint
			e.met.setClass(tt.class)
			for _, s := range tt.streams {
				e.met.observeCall(s, time.Now(), nil)
			}
			got := map[string]uint64{}
			for _, c := range e.met.snapshot() {
				got[c.Class] = c.Latency.Count
			}
			if len(got) != len(tt.want) {
				t.Fatalf("classes %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("class %q: %d calls, want %d (all: %v)", k, got[k], v, got)
				}
			}
		})
	}
}

// TestSetStreamClassAgain: a new class function applies to streams already
// seen; counts of the old classes stay.
func TestSetStreamClassAgain(t *testing.T) {
	var e Endpoint
	e.met.observeCall(3, time.Now(), nil)
	e.met.setClass(func(uint32) string { return "all" })
	e.met.observeCall(3, time.Now(), nil)
	e.met.setClass(nil)
	e.met.observeCall(3, time.Now(), errors.New("x"))
	got := map[string][2]uint64{}
	for _, c := range e.met.snapshot() {
		got[c.Class] = [2]uint64{c.Latency.Count, c.Failures}
	}
	if len(got) != 2 || got["3"] != [2]uint64{1, 1} || got["all"] != [2]uint64{1, 0} {
		t.Fatalf("classes %v", got)
	}
	var nilEP *Endpoint
	if err := nilEP.SetStreamClass(nil); err == nil {
		t.Error("SetStreamClass on nil Endpoint: no error")
	}
	if s := nilEP.Snapshot(); s.Device != "" || s.Peers != nil {
		t.Errorf("nil Endpoint snapshot %+v", s)
	}
	// A zero Endpoint (not from New), such as e, is refused as a nil one
	// is, its metrics state set or not.
	if err := e.SetStreamClass(nil); err != errNilEndpoint {
		t.Errorf("SetStreamClass on a zero Endpoint: %v", err)
	}
	if s := e.Snapshot(); !s.Time.IsZero() || s.Classes != nil {
		t.Errorf("zero Endpoint snapshot %+v", s)
	}
}

// TestObserveCallAllocs: recording a call of a stream already seen
// allocates nothing.
func TestObserveCallAllocs(t *testing.T) {
	var e Endpoint
	start := time.Now()
	e.met.observeCall(5, start, nil)
	rerr := &RemoteError{Msg: "x"}
	for name, err := range map[string]error{"ok": nil, "remote": rerr, "failure": context.Canceled} {
		if a := testing.AllocsPerRun(1000, func() { e.met.observeCall(5, start, err) }); a != 0 {
			t.Errorf("%s: %v allocs per call", name, a)
		}
	}
}

// The stream cache keeps its first streams in an array and the rest in a
// map; a stream's calls land in its class on either side, and again after
// the class function changes.
func TestStreamCacheSpill(t *testing.T) {
	var e Endpoint
	m := &e.met
	start := time.Now()
	const streams = 20 // past the array's 8
	for round := range 3 {
		for s := range uint32(streams) {
			m.observeCall(s, start, nil)
			if got := m.class(s).name; got != fmt.Sprint(s) {
				t.Fatalf("round %d: stream %d in class %q", round, s, got)
			}
		}
	}
	if n := m.streams.Load().len(); n != streams {
		t.Errorf("cache holds %d streams, want %d", n, streams)
	}
	calls := map[string]uint64{}
	for _, c := range e.met.snapshot() {
		calls[c.Class] = c.Latency.Count
	}
	for s := range streams {
		if got := calls[fmt.Sprint(s)]; got != 3 {
			t.Errorf("class %d: %d calls, want 3", s, got)
		}
	}
	e.met.setClass(func(s uint32) string { return []string{"a", "b", "c"}[s%3] })
	for s := range uint32(streams) {
		if got, want := m.class(s).name, []string{"a", "b", "c"}[s%3]; got != want {
			t.Errorf("after SetStreamClass: stream %d in class %q, want %q", s, got, want)
		}
	}
}
