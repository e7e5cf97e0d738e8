package rxetest

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/uverbs/provider"
)

// Hooks are functions a test has a device context's provider run once,
// at the start of its next NewCQ, NewQP, NewSRQ or NewAH: the step of a
// create (cq.CreateWith, qp.Create, qp.CreateSRQ, PD.CreateAH) after its
// look at the objects it names (a PD, CQs, an SRQ, a completion channel)
// and before the kernel command. A hook that closes one of them (and makes
// another that takes its handle or descriptor) checks that the create
// does not name a destroyed object.
//
// WrapQP and WrapCQ, set before the objects are made, wrap every QP and
// CQ the provider makes (a test observing the hooks a hardware provider
// implements, provider.QPModifier, CQCleaner, ...).
type Hooks struct {
	cq, qp, srq, ah atomic.Pointer[func()]

	WrapQP func(provider.QP) provider.QP
	WrapCQ func(provider.CQ) provider.CQ
}

// BeforeNewCQ, BeforeNewQP, BeforeNewSRQ and BeforeNewAH set the function
// the next NewCQ, NewQP, NewSRQ or NewAH runs first (once).
func (h *Hooks) BeforeNewCQ(f func())  { h.cq.Store(&f) }
func (h *Hooks) BeforeNewQP(f func())  { h.qp.Store(&f) }
func (h *Hooks) BeforeNewSRQ(f func()) { h.srq.Store(&f) }
func (h *Hooks) BeforeNewAH(f func())  { h.ah.Store(&f) }

func run(p *atomic.Pointer[func()]) {
	if f := p.Swap(nil); f != nil {
		(*f)()
	}
}

type hookedProvider struct {
	provider.Provider
	h *Hooks
}

func (p hookedProvider) NewContext() provider.Context {
	return hookedContext{p.Provider.NewContext(), p.h}
}

type hookedContext struct {
	provider.Context
	h *Hooks
}

func (c hookedContext) NewCQ(cqe int) (provider.CQ, error) {
	run(&c.h.cq)
	q, err := c.Context.NewCQ(cqe)
	if err == nil && c.h.WrapCQ != nil {
		q = c.h.WrapCQ(q)
	}
	return q, err
}

func (c hookedContext) NewQP(req provider.QPRequest) (provider.QP, error) {
	run(&c.h.qp)
	q, err := c.Context.NewQP(req)
	if err == nil && c.h.WrapQP != nil {
		q = c.h.WrapQP(q)
	}
	return q, err
}

func (c hookedContext) NewSRQ(maxWR, maxSGE uint32) (provider.SRQ, error) {
	run(&c.h.srq)
	return c.Context.NewSRQ(maxWR, maxSGE)
}

func (c hookedContext) NewAH() (provider.AH, error) {
	run(&c.h.ah)
	return c.Context.NewAH()
}

var hookedMu sync.Mutex

// OpenHooked opens the device name with its driver's provider wrapped by
// the returned Hooks (the provider's objects are its own; only the hooks
// run before them), and closes it when the test ends. The wrapper is
// registered only for the Open: a context another test opens meanwhile
// gets hooks of its own, which nothing sets.
func OpenHooked(t testing.TB, name string) (*uverbs.Context, *Hooks) {
	t.Helper()
	devs, err := uverbs.ListWithoutGIDs()
	if err != nil {
		t.Fatal(err)
	}
	driver := ""
	for _, d := range devs {
		if d.Name == name {
			driver = d.Driver
		}
	}
	hookedMu.Lock()
	defer hookedMu.Unlock()
	p, ok := provider.Lookup(driver)
	if !ok {
		t.Fatalf("no provider registered for %s (driver %q)", name, driver)
	}
	h := &Hooks{}
	if err := uverbs.RegisterProvider(driver, hookedProvider{p, h}); err != nil {
		t.Fatal(err)
	}
	c, err := uverbs.Open(name)
	if rerr := uverbs.RegisterProvider(driver, p); rerr != nil {
		t.Fatal(rerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close %s: %v", name, err)
		}
	})
	return c, h
}
