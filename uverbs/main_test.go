package uverbs_test

import (
	"os"
	"testing"

	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestMain fails the run if the tests leave a kernel object or a file
// descriptor behind (rxetest.RunChecked).
func TestMain(m *testing.M) { os.Exit(rxetest.RunChecked(m)) }
