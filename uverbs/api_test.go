package uverbs_test

import (
	"reflect"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/goverbs/goverbs/uverbs"
)

// TestContextAPI: Context exports what a user holds an open device for,
// and none of the plumbing cq, qp and mr use (internal/uvobj): a method
// added here is a decision, made in this list.
func TestContextAPI(t *testing.T) {
	want := []string{
		"AllocPD", "Attr", "Close", "Closed", "CreateCompChannel", "DefaultGID", "DroppedEvents",
		"Events", "GID", "GIDs", "Info", "IsClosed", "Name", "NumCompVectors", "QueryDevice", "QueryPort",
	}
	typ := reflect.TypeFor[*uverbs.Context]()
	var got []string
	for i := range typ.NumMethod() {
		got = append(got, typ.Method(i).Name)
	}
	slices.Sort(got)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("*uverbs.Context's exported methods (-want +got):\n%s", d)
	}
	if n := typ.Elem().NumField(); n == 0 {
		t.Fatal("Context has no fields")
	}
	for i := range typ.Elem().NumField() {
		if f := typ.Elem().Field(i); f.IsExported() {
			t.Errorf("Context exports field %s", f.Name)
		}
	}
}
