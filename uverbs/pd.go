package uverbs

import (
	"fmt"
	"unsafe"

	"github.com/goverbs/goverbs/internal/uvobj"
	"github.com/goverbs/goverbs/ioctl"
)

// PD is a protection domain: memory regions, queue pairs and address
// handles created in it may be used together.
type PD struct {
	ctx    *Context
	handle uint32
	once   uvobj.Once
	// handleBase is where qp and mr hold the PD open across a create
	// that names its handle (uvobj.HoldHandle).
	handleBase
}

// handleBase is embedded under a name of this package's: nothing of it
// shows on PD.
type handleBase = uvobj.HandleBase

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	if c.bad() {
		return nil, errNilContext
	}
	if c.IsClosed() {
		return nil, ErrClosed
	}
	var req ioctl.AllocPD
	var resp ioctl.AllocPDResp
	err := c.file.Write(&ioctl.Cmd{
		Command: ioctl.IB_USER_VERBS_CMD_ALLOC_PD,
		In:      unsafe.Pointer(&req), InLen: ioctl.SizeofAllocPD,
		Out: unsafe.Pointer(&resp), OutLen: ioctl.SizeofAllocPDResp,
	}, "ALLOC_PD")
	if err != nil {
		return nil, fmt.Errorf("uverbs: %s: alloc PD: %w", c.info.Name, err)
	}
	pd := &PD{ctx: c, handle: resp.Handle}
	uvobj.SetHandle(&pd.handleBase, &pd.once, pd.handle, 0)
	if err := c.tab.Track(pd); err != nil {
		pd.destroy()
		return nil, err
	}
	return pd, nil
}

// Context returns the device context the PD belongs to.
func (pd *PD) Context() *Context {
	if pd == nil {
		return nil
	}
	return pd.ctx
}

// Handle returns the kernel handle, or an error after Close (or for a nil
// or zero PD, which has none). The number names this PD only while it is
// open: once a Close destroyed it, the kernel gives it to the next object
// the context creates, so a handle read before a Close and used after it
// names another PD, or nothing. goverbs' own creates (qp.Create,
// qp.CreateSRQ, CreateAH, mr.Register, mr.AllocMW) do not use it so: they
// hold the PD open from their look at the handle to the kernel's answer,
// and a Close meanwhile waits for them.
func (pd *PD) Handle() (uint32, error) {
	if pd.bad() {
		return 0, errNilPD
	}
	if pd.once.IsClosed() {
		return 0, ErrClosed
	}
	return pd.handle, nil
}

// IsClosed reports whether the PD was closed (by Close, or by closing its
// Context). It is true of a nil or zero PD.
func (pd *PD) IsClosed() bool {
	if pd.bad() {
		return true
	}
	return pd.once.IsClosed()
}

func (pd *PD) destroy() error { return uvobj.DeallocPD(pd.ctx.file, pd.handle) }

// Close deallocates the PD. It fails, and the PD stays usable, while memory
// regions, queue pairs or address handles still use it. Close is idempotent.
func (pd *PD) Close() error {
	if pd.bad() {
		return errNilPD
	}
	return pd.once.Close(&pd.ctx.tab, pd, 0, pd.destroy,
		func(err error) error { return fmt.Errorf("uverbs: %s: dealloc PD: %w", pd.ctx.info.Name, err) }, nil)
}
