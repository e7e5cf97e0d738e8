package goverbs_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/goverbs/goverbs"
	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/flow"
	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/probe"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
)

// TestErrClosedEverywhere: every package's ErrClosed is goverbs.ErrClosed
// for errors.Is, wrapped or not, keeps its own message, and stays apart
// from the others' (bx's closing is not flow's). The packages' own tests
// check that a use after Close returns their ErrClosed (for example
// qp/badinput_test.go, bx/close_test.go, cm/cm_test.go, flow).
func TestErrClosedEverywhere(t *testing.T) {
	for _, c := range []struct {
		pkg string
		err error
		msg string
	}{
		{"ioctl", ioctl.ErrClosed, "use of closed uverbs object"},
		{"uverbs", uverbs.ErrClosed, "use of closed uverbs object"},
		{"cq", cq.ErrClosed, "use of closed uverbs object"},
		{"qp", qp.ErrClosed, "use of closed uverbs object"},
		{"cm", cm.ErrClosed, "cm: use of closed ID or channel"},
		{"flow", flow.ErrClosed, "flow: closed"},
		{"bx", bx.ErrClosed, "bx: closed"},
		{"probe", probe.ErrClosed, "probe: closed"},
	} {
		if !errors.Is(c.err, goverbs.ErrClosed) {
			t.Errorf("%s.ErrClosed (%v) is not goverbs.ErrClosed", c.pkg, c.err)
		}
		if w := fmt.Errorf("op: %w", c.err); !errors.Is(w, goverbs.ErrClosed) || !errors.Is(w, c.err) {
			t.Errorf("%s.ErrClosed wrapped: errors.Is goverbs.ErrClosed %v, itself %v", c.pkg, errors.Is(w, goverbs.ErrClosed), errors.Is(w, c.err))
		}
		if c.err.Error() != c.msg {
			t.Errorf("%s.ErrClosed says %q, want %q", c.pkg, c.err, c.msg)
		}
	}
	if errors.Is(bx.ErrClosed, flow.ErrClosed) || errors.Is(flow.ErrClosed, bx.ErrClosed) || errors.Is(cm.ErrClosed, uverbs.ErrClosed) {
		t.Error("one package's ErrClosed matches another's")
	}
	if errors.Is(errors.New("closed"), goverbs.ErrClosed) {
		t.Error("an unrelated error matches goverbs.ErrClosed")
	}
}
