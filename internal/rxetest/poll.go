package rxetest

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/hang"
)

// PollOne polls q into wc[:1] until it holds a completion and returns
// that. After 20 s without one (scaled by hang.Scale: a hang bound, not a
// speed bound) it fails the test, naming what (the device, say).
func PollOne(t testing.TB, q *cq.CQ, wc []cq.WC, what string) cq.WC {
	t.Helper()
	limit := hang.Scale(20 * time.Second)
	deadline := time.Now().Add(limit)
	for {
		n, err := q.Poll(wc[:1])
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return wc[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no completion after %v (%s)", what, limit, hang.How())
		}
		time.Sleep(50 * time.Microsecond)
	}
}
