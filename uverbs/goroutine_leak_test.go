package uverbs_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/leakcheck"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/uverbs"
)

// TestGoroutineLeaks: a context's goroutines (a shared completion
// channel's reader, the async event reader) end with what they serve, on
// every path: the channel closed, the context closed with its channels
// still open, a Next parked on an owned channel or a range over Events
// when the context closes, a failed Open, Events racing Close.
func TestGoroutineLeaks(t *testing.T) {
	dev := rxetest.One(t)
	ctx, wd := hang.For(t, "", 60*time.Second) // a hang bound (no progress), not a speed bound
	base := leakcheck.Take()
	for range 3 {
		c, err := uverbs.Open(dev)
		if err != nil {
			t.Fatal(err)
		}
		shared, err := c.CreateCompChannel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := shared.Register(1); err != nil { // starts its reader
			t.Fatal(err)
		}
		closed, err := c.CreateCompChannel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := closed.Register(2); err != nil {
			t.Fatal(err)
		}
		if err := closed.Close(); err != nil {
			t.Fatal(err)
		}
		owned, err := c.CreateCompChannel()
		if err != nil {
			t.Fatal(err)
		}
		if err := owned.Own(); err != nil {
			t.Fatal(err)
		}
		events, err := c.Events() // starts the async reader
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(2)
		nextErr := make(chan error, 1)
		go func() { // parked in Next when the context closes
			defer wg.Done()
			_, err := owned.Next(context.Background())
			nextErr <- err
		}()
		go func() { // ranges over the events until the context closes
			defer wg.Done()
			for range events {
			}
		}()
		time.Sleep(10 * time.Millisecond) // let Next park (not required: it ends either way)
		if err := c.Close(); err != nil { // the parent, with shared and owned open
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatalf("Next or a range over Events did not end with Context.Close: %v", hang.Err(ctx))
		}
		if err := <-nextErr; !errors.Is(err, uverbs.ErrClosed) {
			t.Errorf("Next when the context closed: %v, want ErrClosed", err)
		}
		select {
		case <-shared.Done():
		default:
			t.Error("the shared channel's reader runs after Context.Close")
		}
		wd.Progress()
	}
	if c, err := uverbs.Open("nodev9"); err == nil {
		c.Close()
		t.Error("opened nodev9")
	}
	base.Check(t, "contexts closed")

	// Events racing Close: whichever wins, no reader is left.
	for i := range 20 {
		c, err := uverbs.Open(dev)
		if err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if events, err := c.Events(); err == nil {
				go func() {
					for range events {
					}
				}()
			}
		}()
		close(start)
		if i%2 == 0 {
			time.Sleep(time.Duration(i) * 50 * time.Microsecond)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		wd.Progress()
	}
	base.Check(t, "Events racing Context.Close")
}
