package cq_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/goverbs/goverbs"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestCreateChannelClosedMeanwhile: CreateWith read the completion
// channel's descriptor, let the provider prepare the CQ (NewCQ), then sent
// CQ_CREATE with the number. A Close of the channel in between freed the
// number: CQ_CREATE failed with the kernel's error for a closed descriptor
// instead of ErrClosed, and, had the process opened a file meanwhile
// (Linux gives it the lowest free number: another completion channel,
// say), named that file instead. The provider's NewCQ hook
// (rxetest.OpenHooked) runs the Close in that step. CreateWith now holds
// the descriptor open across the command and returns ErrClosed.
func TestCreateChannelClosedMeanwhile(t *testing.T) {
	ctx, hooks := rxetest.OpenHooked(t, rxetest.One(t))
	ch, err := ctx.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	var hookErr error
	hooks.BeforeNewCQ(func() { hookErr = ch.Close() })
	c, err := cq.CreateWith(ctx, 8, cq.Options{Channel: ch})
	if hookErr != nil {
		t.Fatalf("the hook's close of the channel: %v", hookErr)
	}
	if err == nil {
		c.Close()
		t.Fatal("CreateWith succeeded with its channel closed before CQ_CREATE")
	}
	if !errors.Is(err, cq.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) || !strings.Contains(err.Error(), "completion channel") {
		t.Errorf("CreateWith with the channel closed meanwhile: %v, want ErrClosed naming the completion channel", err)
	}
}
