package goverbs_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs"
	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/flow"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/metrics"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/probe"
	"github.com/goverbs/goverbs/ps"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/wr"
)

// nilTypes are the user-facing packages' types with methods on a pointer
// receiver, one nil pointer each. TestNilTypesComplete keeps the list
// whole. Not here: ioctl, uverbs/provider and uverbs/rxe, the layers a
// provider is written in (their objects are made by the layer above, never
// by a user). An empty list is a package checked to have no such type.
var nilTypes = map[string][]any{
	"bx": {(*bx.Buffer)(nil), (*bx.Conn)(nil), (*bx.Endpoint)(nil), (*bx.Msg)(nil), (*bx.Peer)(nil),
		(*bx.RemoteError)(nil), (*bx.Stream)(nil)},
	"bx/bxgrpc": {},
	"cm":        {(*cm.Channel)(nil), (*cm.EventError)(nil), (*cm.ID)(nil), (*cm.Multicast)(nil)},
	"cq":        {(*cq.CQ)(nil)},
	"flow":      {(*flow.Credits)(nil), (*flow.Dedup)(nil), (*flow.Returner)(nil), (*flow.Window)(nil)},
	"metrics":   {(*metrics.Collector)(nil)},
	"mr":        {(*mr.Allocator)(nil), (*mr.Cache)(nil), (*mr.MR)(nil), (*mr.MW)(nil), (*mr.Memory)(nil)},
	"probe":     {(*probe.Command)(nil), (*probe.Probes)(nil)},
	"ps": {(*ps.Client)(nil), (*ps.Pending)(nil), (*ps.Ring)(nil), (*ps.Server)(nil),
		(*ps.Request)(nil), (*ps.ServerError)(nil), (*ps.Store)(nil)},
	"qp": {(*qp.QP)(nil), (*qp.SRQ)(nil), (*qp.StateError)(nil)},
	"uverbs": {(*uverbs.AH)(nil), (*uverbs.CompChannel)(nil), (*uverbs.Context)(nil),
		(*uverbs.DeviceInfo)(nil), (*uverbs.PD)(nil)},
	"wr": {(*wr.WC)(nil), (*wr.WCError)(nil)},
}

// aliasTypes are types of internal packages that users hold through an
// alias (bx.Histogram is internal/hist's): asked as nilTypes are, not
// checked complete.
var aliasTypes = []any{(*bx.Histogram)(nil)}

var errType = reflect.TypeFor[error]()

// TestNilReceivers: every method declared on a pointer receiver of a
// user-facing type, called on a nil pointer with zero arguments (a
// constructor's error ignored, a field never set), returns at once and
// does not panic; one that returns an error returns one that names what
// was nil and is goverbs.ErrNil for errors.Is.
func TestNilReceivers(t *testing.T) {
	all := slices.Clone(aliasTypes)
	for _, pkg := range slices.Sorted(maps.Keys(nilTypes)) {
		all = append(all, nilTypes[pkg]...)
	}
	eachMethod(t, all, reflect.Zero, "on nil", func(name string, pt reflect.Type, e error) {
		switch {
		case e == nil:
			t.Errorf("%s on nil: no error", name)
		case !errors.Is(e, goverbs.ErrNil):
			t.Errorf("%s on nil: %q is not goverbs.ErrNil", name, e)
		case !strings.Contains(e.Error(), "nil "+pt.Elem().Name()):
			t.Errorf("%s on nil: %q does not name the nil %v", name, e, pt)
		}
	})
}

// eachMethod calls every method declared on a pointer receiver of the
// types of all (methods of value receivers are not asked: Go itself
// dereferences the pointer before such a method runs) on the receiver
// recv makes of the pointer type, with zero arguments. A call that panics
// or blocks fails the test (what names the receiver); check gets the
// error of each method that returns one (not Unwrap: a nil error wraps
// nothing).
func eachMethod(t *testing.T, all []any, recv func(reflect.Type) reflect.Value, what string, check func(name string, pt reflect.Type, err error)) {
	t.Helper()
	bound := hang.Scale(10 * time.Second)
	for _, v := range all {
		pt := reflect.TypeOf(v)
		for i := range pt.NumMethod() {
			m := pt.Method(i)
			if _, onValue := pt.Elem().MethodByName(m.Name); onValue {
				continue
			}
			name := fmt.Sprintf("(%v).%s", pt, m.Name)
			out, err := callNil(recv(pt).Method(i), bound)
			if err != nil {
				t.Errorf("%s %s: %v", name, what, err)
				continue
			}
			if n := len(out); n == 0 || m.Type.Out(n-1) != errType || m.Name == "Unwrap" {
				continue
			}
			e, _ := out[len(out)-1].Interface().(error)
			check(name, pt, e)
		}
	}
}

// TestZeroReceivers: the same methods called on a zero value that no
// constructor made (new(T), a struct field never set up): none panics or
// blocks, and one that returns an error returns one that is
// goverbs.ErrNil for errors.Is and names the type, as on a nil pointer.
// Nothing of a zero value is a kernel object: a method must not take its
// zero fd (0, the process's stdin) for one.
func TestZeroReceivers(t *testing.T) {
	var all []any
	for _, pkg := range slices.Sorted(maps.Keys(nilTypes)) {
		all = append(all, nilTypes[pkg]...)
	}
	zero := func(pt reflect.Type) reflect.Value { return reflect.New(pt.Elem()) }
	eachMethod(t, all, zero, "on a zero value", func(name string, pt reflect.Type, e error) {
		switch {
		case e == nil:
			// A zero value may be a usable one (metrics.Collector's is).
		case !errors.Is(e, goverbs.ErrNil) && !errors.Is(e, goverbs.ErrClosed):
			t.Errorf("%s on a zero value: %q is neither goverbs.ErrNil nor goverbs.ErrClosed", name, e)
		case !strings.Contains(e.Error(), pt.Elem().Name()):
			t.Errorf("%s on a zero value: %q does not name the %v", name, e, pt)
		}
	})
	// fd 0 is still open: no Close of a zero value closed it.
	if _, err := os.Stdin.Stat(); err != nil {
		t.Errorf("stdin after the zero values' methods: %v", err)
	}
}

// callNil calls m with zero arguments, in a goroutine so that a call that
// blocks is reported (after bound) instead of hanging the test.
func callNil(m reflect.Value, bound time.Duration) (out []reflect.Value, err error) {
	args := make([]reflect.Value, m.Type().NumIn())
	for j := range args {
		args[j] = reflect.Zero(m.Type().In(j))
	}
	type result struct {
		out []reflect.Value
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- result{err: fmt.Errorf("panic: %v", r)}
			}
		}()
		if m.Type().IsVariadic() {
			done <- result{out: m.CallSlice(args)}
			return
		}
		done <- result{out: m.Call(args)}
	}()
	select {
	case r := <-done:
		return r.out, r.err
	case <-time.After(bound):
		return nil, fmt.Errorf("still running after %v", bound)
	}
}

// TestNilTypesComplete: nilTypes names every exported type of its
// packages that has an exported method on a pointer receiver, as the
// packages' sources declare them, so a new type is not left out of
// TestNilReceivers.
func TestNilTypesComplete(t *testing.T) {
	for _, pkg := range slices.Sorted(maps.Keys(nilTypes)) {
		want := pointerTypes(t, pkg)
		var have []string
		for _, v := range nilTypes[pkg] {
			have = append(have, reflect.TypeOf(v).Elem().Name())
		}
		slices.Sort(have)
		if !slices.Equal(have, want) {
			t.Errorf("%s: nilTypes lists %v, the sources declare pointer methods on %v", pkg, have, want)
		}
	}
}

// pointerTypes parses the non-test sources of package dir and returns
// the exported types that have an exported method on a pointer receiver.
func pointerTypes(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: no sources (%v)", dir, err)
	}
	fset := token.NewFileSet()
	seen := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		af, err := parser.ParseFile(fset, f, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || !fd.Name.IsExported() {
				continue
			}
			star, ok := fd.Recv.List[0].Type.(*ast.StarExpr)
			if !ok {
				continue
			}
			x := star.X
			if ix, ok := x.(*ast.IndexExpr); ok { // a generic type
				x = ix.X
			}
			if id, ok := x.(*ast.Ident); ok && id.IsExported() {
				seen[id.Name] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}
