// Package uverbs opens RDMA devices through the kernel's uverbs ABI
// (/dev/infiniband/uverbsN), without rdma-core or cgo: device discovery,
// the device context, protection domains, address handles, completion
// channels and asynchronous events. Completion queues, queue pairs and
// memory regions are made on a Context or a PD by packages cq, qp and mr.
//
// # Finding a device
//
// List and Lookup read sysfs (/sys/class/infiniband and
// /sys/class/infiniband_verbs): a DeviceInfo per device, with its driver,
// its ports, their state and their GID tables. ListWithoutGIDs and
// LookupWithoutGIDs leave the GID tables out (on rxe they are 1024 files a
// port); Context.GIDs reads one with a single command. Both return
// ErrNoDevice when there is no device, or none of that name.
//
// # What a user holds
//
//   - Context (Open, OpenWith): an open device, the uverbs command
//     descriptor with its kernel context and the provider's state. Attr
//     holds the device limits queried at Open (QueryDevice asks again);
//     QueryPort, GIDs and DefaultGID (the RoCE v2 GID with an IPv4
//     address when there is one, not index 0) describe a port. The
//     Context owns every object made on it or on its PDs, here and in cq,
//     qp and mr (memory regions and windows).
//   - PD (Context.AllocPD): a protection domain. Memory regions, queue
//     pairs and address handles made in one PD may be used together.
//   - AH (PD.CreateAH): the destination of UD sends, from an AHAttr.
//   - CompChannel (Context.CreateCompChannel): completion events, read
//     through Go's netpoller, so a goroutine waiting for a completion is
//     parked rather than a thread blocked in a system call; a CQ created
//     with cq.Options.Events gets one.
//   - AsyncEvent values from Context.Events: port up and down, QP and CQ
//     errors, as the kernel reports them outside the data path. There is
//     nothing to acknowledge; read the channel promptly.
//
// The work request and completion types that qp and cq take and return
// (SGE, SendWR, RecvWR, WC, WCStatus, ...) are declared here as aliases of
// package wr's.
//
// # Lifecycle
//
//	ctx, err := uverbs.Open("rxe0")
//	...
//	defer ctx.Close()                   // destroys whatever is still open on it
//	pd, err := ctx.AllocPD()
//	// mr.Register(pd, buf, access), cq.Create(ctx, n), qp.Create(pd, cfg) ...
//
// Objects may be closed one by one, dependents first: PD.Close fails, and
// the PD stays usable, while memory regions, queue pairs or address
// handles still use it. Context.Close destroys what is left, newest first,
// then unmaps the provider's pages and closes the descriptor. Every Close
// is idempotent.
//
// # Concurrency
//
// A Context and a CompChannel are safe for concurrent use. PD and AH keep
// their state behind a lock, so Handle and Close may race safely. The rules
// for posting and polling are those of packages qp and cq.
//
// # Errors
//
// Errors say which step failed, most with the device ("uverbs: rxe0:
// alloc PD: ..."). ErrNoDevice is returned for a device that is not there.
// Any use of a closed object returns ErrClosed (the same value as
// ioctl.ErrClosed). A failed kernel command is an *ioctl.Error that
// unwraps to its unix.Errno, so errors.Is(err, unix.EBUSY) works, and to
// ioctl.ErrNotSupported when the kernel lacks the method. A method of a
// nil pointer, or of a zero value that no constructor made (new(Context),
// a field never set up), returns an error that is goverbs.ErrNil and
// names the type (a getter returns its zero value, IsClosed true); it
// touches no descriptor (a zero Context's is 0, stdin).
//
// # Providers
//
// The driver-specific half of each verb (ring layout, work request and
// completion formats, doorbells) is a Provider from package
// uverbs/provider, chosen by the device's driver name. rxe (Soft-RoCE,
// package uverbs/rxe) is built in; RegisterProvider adds another. What cq,
// qp and mr need to make their objects on a Context (its command
// descriptor, provider, object table and user handles, the destroy with
// its legacy fallback, the close-once sequence) is in the module's
// internal/uvobj, not on Context. docs/providers.md describes the split;
// README.md lists the packages.
package uverbs
