package cq_test

import (
	"context"
	"fmt"
	"log"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/uverbs"
)

// Poll moves completions into a slice you own: no system call, no
// allocation, so a busy loop is cheap.
func ExampleCQ_Poll() {
	ctx, err := uverbs.Open("rxe0")
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Close()
	q, err := cq.Create(ctx, 256)
	if err != nil {
		log.Fatal(err)
	}
	defer q.Close()
	// ... create QPs on q and post work requests ...
	wc := make([]cq.WC, 16)
	n, err := q.Poll(wc)
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range wc[:n] {
		if err := c.Err(); err != nil {
			log.Printf("work request %d failed: %v", c.ID, err)
			continue
		}
		fmt.Println(c.ID, c.ByteLen)
	}
}

// With events, a waiting goroutine sleeps in Go's netpoller instead of
// spinning: Wait arms the CQ, checks it once more and parks until a
// completion may be there. Poll after each wake-up.
func ExampleCQ_Wait() {
	ctx, err := uverbs.Open("rxe0")
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Close()
	q, err := cq.CreateWith(ctx, 256, cq.Options{Events: true})
	if err != nil {
		log.Fatal(err)
	}
	defer q.Close()
	wait, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	wc := make([]cq.WC, 16)
	for {
		n, err := q.Poll(wc)
		if err != nil {
			log.Fatal(err)
		}
		if n > 0 {
			fmt.Println(n, "completions")
			return
		}
		if err := q.Wait(wait); err != nil {
			fmt.Println("no completion:", err) // context.DeadlineExceeded here: nothing was posted
			return
		}
	}
}

// TestExamples runs this package's examples on the guest's devices and
// checks what they print (they have no Output comment: see rxetest.Example).
func TestExamples(t *testing.T) {
	rxetest.RunExamples(t, []rxetest.ExampleCase{
		{Name: "ExampleCQ_Poll", F: ExampleCQ_Poll, Want: ""},
		{Name: "ExampleCQ_Wait", F: ExampleCQ_Wait, Want: "no completion: context deadline exceeded"},
	})
}
