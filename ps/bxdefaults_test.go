package ps

import (
	"testing"

	"github.com/goverbs/goverbs/bx"
)

func TestBXDefaults(t *testing.T) {
	def := bx.Config{Lanes: 2, Credits: 64, MaxPeers: 32, MaxMessage: 4 << 20}
	if got := bxDefaults(bx.Config{}, def); got.Lanes != 2 || got.Credits != 64 || got.MaxPeers != 32 || got.MaxMessage != 4<<20 {
		t.Errorf("zero config: got lanes %d credits %d peers %d max %d, want the defaults", got.Lanes, got.Credits, got.MaxPeers, got.MaxMessage)
	}
	set := bx.Config{Lanes: 1, Credits: 8, MaxPeers: 3, MaxMessage: 1 << 16, Spin: -1}
	if got := bxDefaults(set, def); got.Lanes != 1 || got.Credits != 8 || got.MaxPeers != 3 || got.MaxMessage != 1<<16 || got.Spin != -1 {
		t.Errorf("set config: got lanes %d credits %d peers %d max %d spin %v, want them kept", got.Lanes, got.Credits, got.MaxPeers, got.MaxMessage, got.Spin)
	}
}
