package uverbs

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/goverbs/goverbs/internal/uvobj"
	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/uverbs/provider"
	_ "github.com/goverbs/goverbs/uverbs/rxe" // registers itself: rxe is built in
	"golang.org/x/sys/unix"
)

// ErrClosed is returned for any use of a closed object.
var ErrClosed = ioctl.ErrClosed

// Provider is implemented by a driver's userspace half; see package provider.
type Provider = provider.Provider

// RegisterProvider makes a provider available for devices whose driver has
// the given name (as DeviceInfo.Driver reports it). A provider package
// usually registers itself (provider.Register in its init); rxe is built
// in. An empty driver name or a nil p is refused.
func RegisterProvider(driver string, p Provider) error {
	switch {
	case p == nil:
		return fmt.Errorf("uverbs: RegisterProvider(%q) of a nil provider", driver)
	case driver == "":
		return fmt.Errorf("uverbs: RegisterProvider of %T for an empty driver name", p)
	case driver == p.Name():
		return provider.Register(p)
	}
	return provider.Register(renamed{p, driver})
}

// renamed serves a provider under another driver name.
type renamed struct {
	Provider
	name string
}

func (r renamed) Name() string { return r.name }

// Context is an open device: the uverbs command descriptor with its kernel
// context. It owns every object created on it; Close destroys what is left.
//
// A Context is safe for concurrent use.
type Context struct {
	info  DeviceInfo
	file  *ioctl.File
	prov  Provider
	pctx  provider.Context
	attr  DeviceAttr
	nvecs uint32
	// asyncFD is the async event descriptor GET_CONTEXT made on the
	// write() path, or -1.
	asyncFD int
	async   asyncEvents
	// tab holds the live child objects and the user handles given to
	// the kernel with CQs, QPs and SRQs (events name their object by it).
	tab uvobj.Table
	// objBase holds what cq, qp and mr reach through uvobj.Of: the
	// descriptor, the provider, tab. Nothing of it is exported.
	objBase
}

// objBase is embedded under a name of this package's, so that no field
// of Context is exported.
type objBase = uvobj.Base

// Options tune Open.
type Options struct {
	// LegacyWrite sends legacy commands with write() instead of the
	// INVOKE_WRITE ioctl method, as rdma-core does on kernels without the
	// ioctl interface.
	LegacyWrite bool
}

// Open opens the RDMA device of the given name ("rxe0").
func Open(name string) (*Context, error) { return OpenWith(name, Options{}) }

// OpenWith opens a device with options.
func OpenWith(name string, opts Options) (*Context, error) {
	// The GID table is not needed to open; GIDs reads it when asked.
	info, err := lookup(name, false)
	if err != nil {
		return nil, err
	}
	p, ok := provider.Lookup(info.Driver)
	if !ok {
		return nil, fmt.Errorf("uverbs: device %s: no provider for driver %q (goverbs has: %s)", name, info.Driver, strings.Join(provider.Names(), ", "))
	}
	if err := p.CheckABI(info.ABIVersion); err != nil {
		return nil, fmt.Errorf("uverbs: device %s: %w", name, err)
	}
	f, err := ioctl.Open(info.DevPath, p.DriverID())
	if err != nil {
		return nil, fmt.Errorf("uverbs: device %s: %w", name, err)
	}
	f.ForceWrite(opts.LegacyWrite)
	c := &Context{info: info, file: f, prov: p, pctx: p.NewContext(), asyncFD: -1}
	if err := c.getContext(); err != nil {
		f.Close()
		return nil, fmt.Errorf("uverbs: device %s: %w", name, err)
	}
	if err := c.allocAsyncFD(); err != nil {
		f.Close()
		return nil, fmt.Errorf("uverbs: device %s: %w", name, err)
	}
	if err := c.pctx.Attach(device{c}); err != nil {
		c.closeAsync()
		f.Close()
		return nil, fmt.Errorf("uverbs: device %s: %w", name, err)
	}
	if c.attr, err = c.queryDevice(); err != nil {
		c.closeAsync()
		c.pctx.Close()
		f.Close()
		return nil, fmt.Errorf("uverbs: device %s: %w", name, err)
	}
	*uvobj.Of(&c.objBase) = uvobj.Parts{File: c.file, Driver: c.pctx, Device: device{c}, Objects: &c.tab}
	return c, nil
}

func (c *Context) getContext() error {
	in, out := c.pctx.Udata()
	if !c.file.UsesWrite() {
		var call ioctl.Call
		var support uint64
		call.Reset(ioctl.UVERBS_OBJECT_DEVICE, ioctl.UVERBS_METHOD_GET_CONTEXT, c.file.DriverID())
		call.Out(ioctl.UVERBS_ATTR_GET_CONTEXT_NUM_COMP_VECTORS, unsafe.Pointer(&c.nvecs), 4, 0)
		call.Out(ioctl.UVERBS_ATTR_GET_CONTEXT_CORE_SUPPORT, unsafe.Pointer(&support), 8, 0)
		if len(in) > 0 {
			call.InBytes(ioctl.AttrUHWIn, in, 0)
		}
		if len(out) > 0 {
			call.OutBytes(ioctl.AttrUHWOut, out, 0)
		}
		err := c.file.Do(&call, "GET_CONTEXT")
		if err == nil || !errors.Is(err, ioctl.ErrNotSupported) {
			return err
		}
		// No ioctl interface: everything goes through write() from now.
		c.file.ForceWrite(true)
	}
	var req ioctl.GetContext
	var resp ioctl.GetContextResp
	err := c.file.Write(&ioctl.Cmd{
		Command: ioctl.IB_USER_VERBS_CMD_GET_CONTEXT,
		In:      unsafe.Pointer(&req), InLen: ioctl.SizeofGetContext,
		Out: unsafe.Pointer(&resp), OutLen: ioctl.SizeofGetContextResp,
		DriverIn: in, DriverOut: out,
	}, "GET_CONTEXT")
	if err != nil {
		return err
	}
	c.nvecs = resp.Num_comp_vectors
	// The legacy command always creates the context's async event file and
	// installs a descriptor for it in this process: it is ours to close.
	c.asyncFD = int(resp.Async_fd)
	return nil
}

// Info returns what sysfs said of the device when it was opened, without
// the GID tables (see GIDs).
func (c *Context) Info() DeviceInfo { return c.orZero().info }

// Name returns the device name.
func (c *Context) Name() string { return c.orZero().info.Name }

// NumCompVectors is the number of completion vectors of the device.
func (c *Context) NumCompVectors() int { return int(c.orZero().nvecs) }

// Attr returns the device attributes queried at Open.
func (c *Context) Attr() DeviceAttr { return c.orZero().attr }

// IsClosed reports whether Close was called (the name every goverbs
// object uses: cq.CQ, qp.QP, mr.MR, uverbs.AH...). It is true of a nil
// or zero Context, which has no device open.
func (c *Context) IsClosed() bool {
	if c.bad() {
		return true
	}
	return c.tab.IsClosed()
}

// Closed is IsClosed.
//
// Deprecated: use IsClosed, as on every other goverbs object.
func (c *Context) Closed() bool { return c.IsClosed() }

// Close destroys every object still open on the context, newest first,
// unmaps the provider's pages and closes the descriptor. An object the
// kernel refuses to destroy (a QP still attached to a multicast group) is
// marked closed and unmapped all the same, and the error says so: closing
// the descriptor then destroys it. It is idempotent.
// A nil or zero Context has nothing to close: Close returns an error that
// is goverbs.ErrNil.
func (c *Context) Close() error {
	if c.bad() {
		return errNilContext
	}
	objs, ok := c.tab.Shut()
	if !ok {
		return nil
	}
	var errs []error
	for i := len(objs) - 1; i >= 0; i-- {
		if err := objs[i].Close(); err != nil && !errors.Is(err, ErrClosed) {
			errs = append(errs, err)
		}
	}
	// What the kernel refused to destroy goes with the descriptor, once
	// nothing maps it any more.
	errs = append(errs, c.tab.AbandonFailed(), c.pctx.Close(), c.closeAsync(), c.file.Close())
	return errors.Join(errs...)
}

// device implements provider.Device.
type device struct{ c *Context }

func (d device) File() *ioctl.File { return d.c.file }

func (d device) Mmap(offset int64, length int) ([]byte, error) {
	fd := d.c.file.Fd()
	if fd < 0 {
		return nil, ErrClosed
	}
	b, err := unix.Mmap(fd, offset, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes at offset %#x: %w", length, offset, err)
	}
	return b, nil
}

func (d device) Munmap(b []byte) error { return unix.Munmap(b) }
