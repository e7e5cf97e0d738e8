package rxetest

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
)

// WaitBlocked waits until the goroutine running frame (a function as the
// goroutine dump names it, "cq.(*CQ).Notify(") blocks on a mutex, a lock
// the test holds (a Close held in progress: a sync.Mutex, or the
// sync.RWMutex of a uvobj.Once, shared or not), and returns (nil, false); or
// until the operation returns on done first: (its error, true). After 20 s
// of neither (scaled by hang.Scale: a hang bound, not a speed bound) it
// fails the test.
func WaitBlocked(t testing.TB, frame string, done <-chan error) (error, bool) {
	t.Helper()
	idle := hang.Scale(20 * time.Second)
	deadline := time.Now().Add(idle)
	buf := make([]byte, 1<<20)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			return err, true
		default:
		}
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			if blockedOnMutex(g) && strings.Contains(g, frame) {
				return nil, false
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%s neither returned nor blocked in %v (%s)", frame, idle, hang.How())
	return nil, false
}

// blockedOnMutex reports whether the goroutine g of a dump waits for a
// sync.Mutex or sync.RWMutex.
func blockedOnMutex(g string) bool {
	for _, w := range []string{"[sync.Mutex.Lock", "[sync.RWMutex.Lock", "[sync.RWMutex.RLock"} {
		if strings.Contains(g, w) {
			return true
		}
	}
	return false
}
