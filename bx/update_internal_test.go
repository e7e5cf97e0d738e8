package bx

import (
	"testing"

	"github.com/goverbs/goverbs/flow"
)

// TestUpdateCredit: an explicit update may take the peer's last credit (the
// control reserve) only when it returns credits. One that only
// acknowledges takes a data credit or is not sent: spent on
// acknowledgements by both sides at once, the reserve left each side
// owing credits it could never send (TestEchoBufferOrder hung so in CI).
func TestUpdateCredit(t *testing.T) {
	for _, c := range []struct {
		name      string
		total     uint64 // credits we hold toward the peer
		returned  uint64 // receive buffers re-posted, not yet told
		want      bool
		wantTotal uint64
	}{
		{"ack only, reserve only", 1, 0, false, 1},
		{"ack only, a data credit", 2, 0, true, 1},
		{"returns credits, reserve only", 1, 1, true, 0},
		{"returns credits, data credits", 3, 2, true, 2},
		{"nothing at all", 0, 1, false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			const grant = 8
			ret, err := flow.NewReturner(flow.ReturnerConfig{Grant: grant})
			if err != nil {
				t.Fatal(err)
			}
			if c.returned > 0 {
				if err := ret.Consumed(c.returned); err != nil {
					t.Fatal(err)
				}
				if err := ret.Released(c.returned); err != nil {
					t.Fatal(err)
				}
			}
			cr := flow.NewCredits(flow.CreditsConfig{Initial: grant, MaxGrant: grant})
			for range grant - c.total {
				if !cr.TryAcquireControl() {
					t.Fatal("setup: could not spend a credit")
				}
			}
			p := &Peer{credits: cr, ret: ret}
			if got := p.updateCredit(); got != c.want {
				t.Errorf("updateCredit() = %v, want %v", got, c.want)
			}
			_, granted, consumed := cr.State()
			if left := granted - consumed; left != c.wantTotal {
				t.Errorf("credits left %d, want %d", left, c.wantTotal)
			}
		})
	}
}
