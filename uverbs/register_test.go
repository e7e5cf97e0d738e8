package uverbs_test

import (
	"strings"
	"testing"

	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/uverbs/rxe"
)

// TestRegisterProviderRefused: a nil provider or an empty driver name is
// refused with an error (a nil one panicked on its Name, an empty name
// registered a provider no device can have). No device needed.
func TestRegisterProviderRefused(t *testing.T) {
	if err := uverbs.RegisterProvider("siw", nil); err == nil || !strings.Contains(err.Error(), "nil provider") {
		t.Errorf("RegisterProvider of nil: %v", err)
	}
	if err := uverbs.RegisterProvider("", rxe.Provider{}); err == nil || !strings.Contains(err.Error(), "empty driver name") {
		t.Errorf("RegisterProvider for an empty driver: %v", err)
	}
	if err := uverbs.RegisterProvider("rxe", rxe.Provider{}); err != nil {
		t.Errorf("RegisterProvider of rxe again: %v", err)
	}
}
