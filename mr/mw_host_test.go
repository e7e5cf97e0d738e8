package mr

import (
	"errors"
	"strings"
	"testing"

	"github.com/goverbs/goverbs/uverbs"
)

// TestMWBindHost checks Bind's arguments and its rkey arithmetic without a
// device: the window and regions are built by hand (qp/mw_test.go runs the
// same on rxe).
func TestMWBindHost(t *testing.T) {
	pd, other := new(uverbs.PD), new(uverbs.PD)
	buf := make([]byte, 1<<16)
	m := &MR{pd: pd, buf: buf, access: LocalWrite | RemoteWrite | MWBind, lkey: 0x55}
	w := &MW{pd: pd, typ: MWType2}
	w.rkey.Store(0x012345ab)

	b, err := w.Bind(m, 4096, 8192, RemoteWrite|RemoteRead, 0x10)
	if err != nil {
		t.Fatal(err)
	}
	want := uverbs.MWBind{MWRKey: 0x012345ab, RKey: 0x01234510, LKey: 0x55, Access: uint32(RemoteWrite | RemoteRead),
		Addr: m.Addr() + 4096, Length: 8192}
	if b != want || w.RKey() != 0x01234510 {
		t.Fatalf("Bind = %+v (rkey now %#x), want %+v", b, w.RKey(), want)
	}
	// The next bind starts from the key this one set.
	if b2, err := w.Bind(m, 0, 1, RemoteRead, 0xff); err != nil || b2.MWRKey != 0x01234510 || b2.RKey != 0x012345ff {
		t.Fatalf("second Bind = %+v, %v", b2, err)
	}

	closedMR := &MR{pd: pd, buf: buf, access: LocalWrite | MWBind}
	closedMR.once.MarkClosed()
	for _, tc := range []struct {
		name   string
		m      *MR
		off, n int
		access Access
		key    uint8
		want   string
	}{
		{"nil region", nil, 0, 1, RemoteWrite, 1, "nil memory region"},
		{"closed region", closedMR, 0, 1, RemoteWrite, 1, "closed"},
		{"other PD", &MR{pd: other, buf: buf, access: LocalWrite | MWBind}, 0, 1, RemoteWrite, 1, "another protection domain"},
		{"no MWBind", &MR{pd: pd, buf: buf, access: LocalWrite | RemoteWrite}, 0, 1, RemoteWrite, 1, "without MWBind access (LocalWrite|RemoteWrite)"},
		{"zero length", m, 0, 0, RemoteWrite, 1, "length 0"},
		{"past end", m, len(buf) - 1, 2, RemoteWrite, 1, "range [65535, 65537) outside the 65536-byte region"},
		{"overflow", m, 1, int(^uint(0) >> 1), RemoteWrite, 1, "outside the"},
		{"local write", m, 0, 1, LocalWrite, 1, "grants some of"},
		{"atomic without local write", &MR{pd: pd, buf: buf, access: MWBind}, 0, 8, RemoteAtomic, 1, "needs a region with LocalWrite"},
		{"same key", m, 0, 1, RemoteRead, 0xff, "low byte of the window's current rkey"},
	} {
		before := w.RKey()
		_, err := w.Bind(tc.m, tc.off, tc.n, tc.access, tc.key)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
		if w.RKey() != before {
			t.Errorf("%s: a refused Bind moved the rkey", tc.name)
		}
	}
	if _, err := w.Bind(closedMR, 0, 1, RemoteWrite, 1); !errors.Is(err, uverbs.ErrClosed) {
		t.Errorf("Bind over a closed MR: %v is not ErrClosed", err)
	}
	w.once.MarkClosed()
	if _, err := w.Bind(m, 0, 1, RemoteWrite, 1); !errors.Is(err, uverbs.ErrClosed) {
		t.Errorf("Bind of a closed window: %v is not ErrClosed", err)
	}
	if s := (MWBind | RemoteRead).String(); s != "RemoteRead|MWBind" {
		t.Errorf("Access.String = %q", s)
	}
	if _, err := AllocMW(nil, MWType2); err == nil {
		t.Error("AllocMW(nil) succeeded")
	}
	if _, err := AllocMW(pd, 7); err == nil || !strings.Contains(err.Error(), "unknown window type 7") {
		t.Errorf("AllocMW(type 7): %v", err)
	}
}

// TestMWBindAllocs: describing a bind allocates nothing.
func TestMWBindAllocs(t *testing.T) {
	pd := new(uverbs.PD)
	m := &MR{pd: pd, buf: make([]byte, 4096), access: LocalWrite | MWBind}
	w := &MW{pd: pd, typ: MWType2}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := w.Bind(m, 0, 64, RemoteWrite, uint8(w.RKey())+1); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Bind allocates %v times", n)
	}
}
