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

// TestAckIdle: an explicit acknowledgement goes out only when one was owed
// for a whole tick with no message of ours carrying it; while messages
// flow, each carries it and the ticker sends none.
func TestAckIdle(t *testing.T) {
	var l lane
	step := func(delivered, sent uint64, want bool) {
		t.Helper()
		l.delivered = delivered
		l.ackSent.Store(sent)
		if got := l.ackIdle(); got != want {
			t.Fatalf("delivered %d, ack sent %d: ackIdle() = %v, want %v", delivered, sent, got, want)
		}
	}
	step(5, 5, false) // nothing owed
	step(6, 5, false) // owed: wait a tick
	step(6, 5, true)  // still owed, nothing sent since: send
	step(6, 6, false) // sent
	// Traffic: each tick finds one owed, but a message of ours carried
	// the previous one in between.
	step(7, 6, false)
	step(8, 7, false)
	step(9, 8, false)
	step(9, 8, true) // then it stopped
}
