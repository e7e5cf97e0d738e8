package bx

import (
	"bytes"
	"slices"
	"testing"
)

// FuzzHeader: a peer controls every byte of a data-plane message. decode
// must never panic, and what it accepts must survive a round trip.
func FuzzHeader(f *testing.F) {
	for _, h := range []header{
		{Type: typData, Stream: 1, Seq: 1, Ack: 0, Credit: 64, Length: 3},
		{Type: typRndv, Flags: flagRequest, Stream: 7, Seq: 9, CallID: 5, Length: rndvSize},
		{Type: typCredit, Ack: 100, Credit: 200, Epoch: 2},
		{Type: typCTS, Stream: 7, Seq: 4, Length: ctsSize},
		{Type: typFin, Stream: 7, Seq: 10, Length: finSize},
	} {
		b := make([]byte, HeaderSize+int(h.Length))
		h.encode(b)
		f.Add(b)
	}
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var h header
		if err := h.decode(b); err != nil {
			return
		}
		out := make([]byte, HeaderSize)
		h.encode(out)
		if !bytes.Equal(out, b[:HeaderSize]) {
			t.Fatalf("round trip differs: %x vs %x", out, b[:HeaderSize])
		}
		switch h.Type {
		case typRndv:
			var d rndv
			if err := d.decode(b[HeaderSize:], 4<<20); err == nil && (d.Len == 0 || d.Len > 4<<20) {
				t.Fatalf("accepted rendezvous length %d", d.Len)
			}
		case typCTS:
			var c cts
			if err := c.decode(b[HeaderSize:], 4<<20); err == nil && (c.Ref == 0 || c.Len == 0 || c.Len > 4<<20 || c.Addr+uint64(c.Len) < c.Addr) {
				t.Fatalf("accepted clear-to-send %+v", c)
			}
		case typFin:
			var f fin
			if err := f.decode(b[HeaderSize:]); err == nil && f.Ref == 0 {
				t.Fatal("accepted FIN for sequence 0")
			}
		}
	})
}

// FuzzControl: an unauthenticated peer controls every byte of the control
// plane. decodeCtl must never panic or accept an inconsistent setup.
func FuzzControl(f *testing.F) {
	s := setup{ID: 1, Epoch: 2, Grant: 64, Consumed: 3, Lanes: []laneInfo{{QPN: 17, PSN: 5, Next: 1}, {QPN: 18, PSN: 6, Next: 9, Acked: 4}}}
	f.Add(append([]byte{ctlSetup}, s.encode()...))
	s.Grants = []regrant{{Lane: 1, Ref: 7, RKey: 0x1234}, {Lane: 0, Ref: 2, RKey: 0x99}}
	f.Add(append([]byte{ctlRecover}, s.encode()...))
	f.Add(append([]byte{ctlHello}, make([]byte, nonceSize)...))
	f.Add(append([]byte{ctlAuth}, make([]byte, nonceSize+macSize)...))
	f.Add([]byte{ctlPing})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeCtl(b)
		if err != nil {
			return
		}
		switch m.Type {
		case ctlSetup, ctlRecover, ctlRecAck:
			if n := len(m.Setup.Lanes); n == 0 || n > maxLanes || m.Setup.Consumed > m.Setup.Grant {
				t.Fatalf("accepted setup %+v", m.Setup)
			}
			for _, l := range m.Setup.Lanes {
				if l.Next != 0 && l.Acked >= l.Next {
					t.Fatalf("accepted lane %+v acknowledging what it does not have", l)
				}
			}
			for _, g := range m.Setup.Grants {
				if int(g.Lane) >= len(m.Setup.Lanes) {
					t.Fatalf("accepted a window on lane %d of %d", g.Lane, len(m.Setup.Lanes))
				}
			}
			if len(m.Setup.Grants) > maxGrants {
				t.Fatalf("accepted %d windows", len(m.Setup.Grants))
			}
			again, err := decodeSetup(m.Setup.encode())
			if err != nil || again.ID != m.Setup.ID || len(again.Lanes) != len(m.Setup.Lanes) || !slices.Equal(again.Grants, m.Setup.Grants) {
				t.Fatalf("setup round trip: %+v %v", again, err)
			}
		}
	})
}
