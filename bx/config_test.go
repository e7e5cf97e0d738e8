package bx_test

import (
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
)

// TestConfigRefused: New refuses a Config it cannot use with an error
// naming the field, before it opens the device (none is needed here);
// zero values take the defaults, negatives where the doc gives them no
// meaning are errors.
func TestConfigRefused(t *testing.T) {
	tok := []byte("0123456789abcdef")
	for _, c := range []struct {
		cfg  bx.Config
		want string
	}{
		{bx.Config{Lanes: 5}, "Lanes 5"},
		{bx.Config{Credits: 2}, "Credits 2"},
		{bx.Config{Credits: 1<<20 + 1}, "Credits 1048577 above"},
		{bx.Config{EagerSize: 10}, "EagerSize 10"},
		{bx.Config{MaxMessage: -1}, "MaxMessage -1"},
		{bx.Config{LaneMsgs: -1}, "LaneMsgs -1"},
		{bx.Config{EndpointMsgs: -2}, "EndpointMsgs -2"},
		{bx.Config{LaneBytes: -3}, "LaneBytes -3"},
		{bx.Config{EndpointBytes: -4}, "EndpointBytes -4"},
		{bx.Config{MemoryLimit: -5}, "MemoryLimit -5"},
		{bx.Config{HandshakeTimeout: -time.Second}, "HandshakeTimeout -1s"},
		{bx.Config{PeerTimeout: -time.Millisecond}, "PeerTimeout -1ms"},
		{bx.Config{Workers: -1}, "Workers -1"},
		{bx.Config{MaxPeers: -1}, "MaxPeers -1"},
		// Above what a peer grants; New made a queue of MaxPeers x
		// (Credits + Lanes x LaneMsgs) entries from these, which
		// panicked (makechan) or took gigabytes.
		{bx.Config{LaneMsgs: 1<<20 + 1}, "LaneMsgs 1048577 above"},
		{bx.Config{LaneMsgs: 1 << 40}, "LaneMsgs 1099511627776 above"},
		{bx.Config{MaxPeers: 1<<16 + 1}, "MaxPeers 65537 above"},
		{bx.Config{MaxPeers: 1 << 16, Credits: 1 << 10}, "MaxPeers 65536 x (Credits 1024 + Lanes 2 x LaneMsgs 64)"},
	} {
		c.cfg.Device, c.cfg.Token = "goverbs-no-such-device", tok
		e, err := bx.New(c.cfg)
		if err == nil {
			e.Close()
			t.Errorf("New(%s) succeeded", c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "goverbs-no-such-device") {
			t.Errorf("New with %s: %v; want it to name the field, before it looks for the device", c.want, err)
		}
	}
}
