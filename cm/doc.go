// Package cm is the RDMA connection manager (rdma_cm) in pure Go: it speaks
// the kernel's ucma ABI on /dev/infiniband/rdma_cm itself, without
// librdmacm or cgo.
//
// A user holds a Channel (the opened rdma_cm descriptor, whose events arrive
// through Go's netpoller) and IDs made on it, one per endpoint, each in a
// port space (TCP for RC, UDP for UD). In order:
//
//	ch, _ := cm.Open()                            // defer ch.Close(): destroys every ID left
//	id, _ := ch.CreateID(cm.TCP)
//	_ = id.ResolveAddr(ctx, netip.Addr{}, dst)    // ADDR_RESOLVED, or an *EventError
//	_ = id.ResolveRoute(ctx)                      // ROUTE_RESOLVED
//	dev, port, _ := id.Device()                   // the uverbs device the route uses
//	// uverbs.Open(dev), AllocPD, cq.Create ... then:
//	q, _ := id.CreateQP(pd, qp.Config{...})       // created and moved to INIT by the kernel's attributes
//	ev, _ := id.Connect(ctx, cm.ConnParam{...})   // RTR and RTS from INIT_QP_ATTR, then RTU
//	...
//	_ = id.Disconnect()
//	_ = id.Close()                                // destroys the QP, then the kernel ID
//
// A listener binds, listens, and takes connection requests with
// GetRequest; each request is a new ID (the event's ID) that the user
// accepts (after CreateQP) or rejects, and closes.
//
// On a UDP ID bound to a device address (or with a resolved address),
// JoinMulticast joins a multicast group and attaches the ID's QP to it
// (now, or when CreateQP makes the QP); the returned Multicast holds the
// group's address handle attributes, QPN (MulticastQPN) and Q_Key to send
// to it. LeaveMulticast leaves; Close leaves every group first.
//
// Every step that waits for the kernel takes a context; one already done
// when the step is called starts nothing in the kernel (no request the
// peer would act on while this side reports the context's error). A
// failure is an *EventError naming the step and the event (address
// error, route error, unreachable, rejected with its reason and private
// data, disconnected), matched with errors.Is against ErrAddress,
// ErrRoute, ErrUnreachable, ErrRejected, ErrConnRefused, ErrDisconnected,
// ErrDeviceRemoved (after an ID's DEVICE_REMOVAL no event comes for it:
// every later wait returns that error at once). A command on an ID racing
// its Close runs before the destroy or returns ErrClosed. Every object
// has an idempotent Close.
package cm
