package cm_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestCloseRacesCreate: CreateID racing the channel's Close (two of them
// at once). Every ID CreateID returned is closed by it (a Wait on it ends
// with ErrClosed at once, it is off the channel's table), a CreateID
// refused says ErrClosed, and Close reports nothing: it destroyed no
// handle of an ID the kernel had not made yet.
func TestCloseRacesCreate(t *testing.T) {
	needCM(t)
	rxetest.CheckCMIDs(t)
	const rounds, creators, premade = 20, 4, 32
	for round := range rounds {
		ch, err := cm.Open()
		if err != nil {
			t.Fatal(err)
		}
		// IDs made before: Close takes a while over them, the window a
		// CreateID runs into.
		for range premade {
			if _, err := ch.CreateID(cm.TCP); err != nil {
				t.Fatal(err)
			}
		}
		var (
			mu      sync.Mutex
			made    []*cm.ID
			refused []error
			started atomic.Int32
			wg      sync.WaitGroup
		)
		for range creators {
			wg.Add(1)
			go func() {
				defer wg.Done()
				first := true
				for {
					id, err := ch.CreateID(cm.TCP)
					if first {
						started.Add(1)
						first = false
					}
					mu.Lock()
					if err != nil {
						if !errors.Is(err, cm.ErrClosed) {
							refused = append(refused, err)
						}
						mu.Unlock()
						return
					}
					made = append(made, id)
					mu.Unlock()
				}
			}()
		}
		for started.Load() < creators {
			time.Sleep(10 * time.Microsecond)
		}
		closeErrs := make(chan error, 2)
		for range 2 {
			go func() { closeErrs <- ch.Close() }()
		}
		for range 2 {
			if err := <-closeErrs; err != nil {
				t.Errorf("round %d: Close racing CreateID: %v", round, err)
			}
		}
		wg.Wait()
		for _, err := range refused {
			t.Errorf("round %d: CreateID on a closing channel: %v, want ErrClosed", round, err)
		}
		if n := ch.IDs(); n != 0 {
			t.Errorf("round %d: %d IDs still on the channel after Close", round, n)
		}
		// A Wait on each returned ID ends at once; the bound only
		// catches one that would wait for ever.
		ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(10*time.Second))
		hung := 0
		var wwg sync.WaitGroup
		var hmu sync.Mutex
		for _, id := range made {
			wwg.Add(1)
			go func() {
				defer wwg.Done()
				_, err := id.Wait(ctx)
				if !errors.Is(err, cm.ErrClosed) {
					hmu.Lock()
					hung++
					if hung == 1 {
						t.Errorf("round %d: Wait on an ID made as the channel closed: %v, want ErrClosed", round, err)
					}
					hmu.Unlock()
				}
			}()
		}
		wwg.Wait()
		cancel()
		if hung > 0 {
			t.Fatalf("round %d: %d of %d IDs made during Close were left open", round, hung, len(made))
		}
		for _, id := range made {
			if err := id.Close(); err != nil {
				t.Errorf("round %d: Close of an ID after its channel's: %v", round, err)
			}
		}
		if t.Failed() {
			return
		}
	}
}
