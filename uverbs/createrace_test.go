package uverbs_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/goverbs/goverbs"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/uverbs"
)

// TestCreateAHClosedPDMeanwhile: CreateAH read its PD's handle before the
// provider's NewAH and used it after: a PD closed in between made
// CREATE_AH fail with the kernel's error instead of ErrClosed, or, with a
// PD allocated meanwhile (replace: it takes the destroyed handle), made
// the AH in that one. The provider's NewAH hook (rxetest.OpenHooked) runs
// the Close in that step. CreateAH now holds the PD open across the
// command and returns ErrClosed naming the PD.
func TestCreateAHClosedPDMeanwhile(t *testing.T) {
	name := rxetest.One(t)
	for _, replace := range []bool{false, true} {
		t.Run(fmt.Sprintf("replace=%v", replace), func(t *testing.T) {
			ctx, hooks := rxetest.OpenHooked(t, name)
			gid, err := ctx.DefaultGID(1)
			if err != nil {
				t.Fatal(err)
			}
			pd, err := ctx.AllocPD()
			if err != nil {
				t.Fatal(err)
			}
			var hookErr error
			hooks.BeforeNewAH(func() {
				if hookErr = pd.Close(); hookErr != nil || !replace {
					return
				}
				_, hookErr = ctx.AllocPD()
			})
			ah, err := pd.CreateAH(uverbs.AHAttr{DGID: gid.GID})
			if hookErr != nil {
				t.Fatalf("the hook's close or remake of the PD: %v", hookErr)
			}
			if err == nil {
				ah.Close()
				t.Fatal("CreateAH succeeded with its PD closed before CREATE_AH: the AH was made in the PD that took the handle")
			}
			if !errors.Is(err, uverbs.ErrClosed) || !errors.Is(err, goverbs.ErrClosed) || !strings.Contains(err.Error(), "PD") {
				t.Errorf("CreateAH with the PD closed meanwhile: %v, want ErrClosed naming the PD", err)
			}
		})
	}
}
