package uverbs

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
)

// Destroy describes how to destroy one kernel object: the native ioctl
// method, and the legacy command used where the kernel lacks it.
type Destroy struct {
	Op         string // "PD_DESTROY", for errors
	Object     uint16
	Method     uint16
	HandleAttr uint16
	Handle     uint32
	// RespAttr/Resp: an output some destroy methods require (CQ, QP).
	RespAttr uint16
	Resp     unsafe.Pointer
	RespLen  int
	Legacy   ioctl.Cmd
}

// Destroy runs d: the ioctl method first, then the legacy command if the
// kernel does not have the method.
func (c *Context) Destroy(d *Destroy) error {
	err := ioctl.ErrNotSupported
	if !c.file.UsesWrite() {
		var call ioctl.Call
		call.Reset(d.Object, d.Method, c.file.DriverID())
		call.InIDR(d.HandleAttr, d.Handle)
		if d.Resp != nil {
			call.Out(d.RespAttr, d.Resp, d.RespLen, ioctl.AttrMandatory)
		}
		err = c.file.Do(&call, d.Op)
	}
	if errors.Is(err, ioctl.ErrNotSupported) {
		err = c.file.Write(&d.Legacy, d.Op)
	}
	return err
}

// PD is a protection domain: memory regions, queue pairs and address
// handles created in it may be used together.
type PD struct {
	ctx    *Context
	handle uint32
	mu     sync.Mutex
	closed bool
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
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
	if err := c.Track(pd); err != nil {
		pd.destroy()
		return nil, err
	}
	return pd, nil
}

// Context returns the device context the PD belongs to.
func (pd *PD) Context() *Context { return pd.ctx }

// Handle returns the kernel handle, or an error after Close.
func (pd *PD) Handle() (uint32, error) {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return 0, ErrClosed
	}
	return pd.handle, nil
}

func (pd *PD) destroy() error {
	req := ioctl.DeallocPD{Handle: pd.handle}
	return pd.ctx.Destroy(&Destroy{
		Op: "PD_DESTROY", Object: ioctl.UVERBS_OBJECT_PD, Method: ioctl.UVERBS_METHOD_PD_DESTROY,
		HandleAttr: ioctl.UVERBS_ATTR_DESTROY_PD_HANDLE, Handle: pd.handle,
		Legacy: ioctl.Cmd{Command: ioctl.IB_USER_VERBS_CMD_DEALLOC_PD, In: unsafe.Pointer(&req), InLen: ioctl.SizeofDeallocPD},
	})
}

// Close deallocates the PD. It fails, and the PD stays usable, while memory
// regions, queue pairs or address handles still use it. Close is idempotent.
func (pd *PD) Close() error {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return nil
	}
	if err := pd.destroy(); err != nil {
		return fmt.Errorf("uverbs: %s: dealloc PD: %w", pd.ctx.info.Name, err)
	}
	pd.closed = true
	pd.ctx.Untrack(pd)
	return nil
}
