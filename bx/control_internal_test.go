package bx

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestByeReason: a bye says why the peer was dropped (nothing for an
// orderly Close), bounded, and its receiver prints it safely.
func TestByeReason(t *testing.T) {
	if r := byeReason(ErrClosed); r != nil {
		t.Errorf("orderly close carries %q", r)
	}
	if r := byeReason(fmt.Errorf("shutting down: %w", ErrClosed)); r != nil {
		t.Errorf("wrapped ErrClosed carries %q", r)
	}
	why := fmt.Errorf("%w: lane 1 sequence 9, expected 7", ErrProtocol)
	m, err := decodeCtl(append([]byte{ctlBye}, byeReason(why)...))
	if err != nil || m.Reason != why.Error() {
		t.Errorf("bye round trip: %q, %v; want %q", m.Reason, err, why)
	}
	long := byeReason(errors.New(strings.Repeat("x", 3*maxReason)))
	if len(long) != maxReason {
		t.Errorf("a long reason is %d bytes, want %d", len(long), maxReason)
	}
	if m, err := decodeCtl([]byte{ctlBye}); err != nil || m.Reason != "" {
		t.Errorf("bye without reason: %q, %v", m.Reason, err)
	}
	if m, err := decodeCtl(append([]byte{ctlBye}, "a\nb\x00\xffc"...)); err != nil || m.Reason != "a?b??c" {
		t.Errorf("bye with control bytes: %q, %v; want %q", m.Reason, err, "a?b??c")
	}
	if _, err := decodeCtl(append([]byte{ctlBye}, make([]byte, maxReason+1)...)); err == nil {
		t.Errorf("a bye with a reason over %d bytes was accepted", maxReason)
	}
	if _, err := decodeCtl([]byte{ctlPing, 1}); err == nil {
		t.Error("a ping with a body was accepted")
	}
}
