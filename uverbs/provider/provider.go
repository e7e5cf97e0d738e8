// Package provider is the contract between the core of goverbs and one
// driver's userspace half (rxe today; siw and mlx5 later).
//
// The core (package uverbs) issues every kernel command: GET_CONTEXT,
// CQ_CREATE, QP_CREATE and so on. A provider adds its private request and
// response data ("udata") to those commands, then owns the data path that
// follows: it maps the queues the kernel handed out, writes work requests in
// its hardware's format, rings its doorbell (a system call on rxe, an MMIO
// store into a UAR page on mlx5), and decodes completions.
//
// Users of goverbs never import this package; provider authors do.
package provider

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/goverbs/goverbs/ioctl"
)

// ErrQueueFull is returned by PostSend and PostRecv when the queue cannot
// take the whole batch. Nothing of that batch was posted.
var ErrQueueFull = errors.New("work queue full")

// Device is what the core lends a provider for one open device.
type Device interface {
	// File is the command descriptor (/dev/infiniband/uverbsN).
	File() *ioctl.File
	// Mmap maps length bytes of the command descriptor at offset: rings on
	// rxe, UAR and doorbell pages on mlx5.
	Mmap(offset int64, length int) ([]byte, error)
	// Munmap undoes Mmap.
	Munmap(b []byte) error
}

// Provider creates per-device driver contexts.
type Provider interface {
	// Name is the driver's short name: "rxe".
	Name() string
	// DriverID is the RDMA_DRIVER_* value the kernel checks in every ioctl.
	DriverID() uint32
	// CheckABI rejects a driver ABI version (sysfs abi_version of the
	// uverbs device) this provider does not speak.
	CheckABI(version int) error
	// NewContext returns a context to be attached to a GET_CONTEXT.
	NewContext() Context
}

// Context is a provider's state for one open device.
type Context interface {
	// Udata returns the private request and response of GET_CONTEXT;
	// either may be nil.
	Udata() (in, out []byte)
	// Attach runs once GET_CONTEXT succeeded (mlx5 maps its UAR pages here).
	Attach(dev Device) error
	// NewCQ prepares a completion queue of at least cqe entries.
	NewCQ(cqe int) (CQ, error)
	// NewQP prepares a queue pair.
	NewQP(req QPRequest) (QP, error)
	// NewSRQ prepares a shared receive queue.
	NewSRQ(maxWR, maxSGE uint32) (SRQ, error)
	// NewAH prepares an address handle (UD).
	NewAH() (AH, error)
	// Close releases what Attach mapped.
	Close() error
}

// CQ is a provider's completion queue. Poll is called by one goroutine at
// a time.
type CQ interface {
	Udata() (in, out []byte)
	// Attach runs after CQ_CREATE granted cqe entries.
	Attach(dev Device, handle uint32, cqe int) error
	// Poll moves up to len(wc) completions into wc, without a system call
	// where the hardware allows, and returns how many.
	Poll(wc []WC) int
	// Empty reports whether no completion is waiting to be polled.
	Empty() bool
	// Close unmaps the queue; the core destroys the kernel object first.
	Close() error
}

// SRQ is a provider's shared receive queue. PostRecv is called by one
// goroutine at a time.
type SRQ interface {
	Udata() (in, out []byte)
	// Attach runs after CREATE_SRQ granted maxWR and maxSGE.
	Attach(dev Device, handle, maxWR, maxSGE uint32) error
	// PostRecv posts the whole batch or nothing (ErrQueueFull).
	PostRecv(wrs []RecvWR) error
	// ModifyUdata is the private data of MODIFY_SRQ (rxe needs 8 bytes).
	ModifyUdata() []byte
	Close() error
}

// CQArmer is implemented by providers that arm a CQ for an event without
// the kernel (mlx5 writes its doorbell record). Without it the core sends
// REQ_NOTIFY_CQ.
type CQArmer interface {
	Arm(solicitedOnly bool) error
}

// QPRequest is what the core asks of a provider QP.
type QPRequest struct {
	Type         uint32 // IB_UVERBS_QPT_*
	MaxSendWR    uint32
	MaxRecvWR    uint32
	MaxSendSGE   uint32
	MaxRecvSGE   uint32
	MaxInline    uint32
	HasSRQ       bool
	SignalAll    bool
	PageSizeHint int
}

// QPCaps are the capabilities the kernel granted.
type QPCaps struct {
	MaxSendWR, MaxRecvWR, MaxSendSGE, MaxRecvSGE, MaxInline uint32
}

// QP is a provider's queue pair data path. PostSend and PostRecv are called
// by one goroutine at a time (each may have its own).
type QP interface {
	Udata() (in, out []byte)
	// Attach runs after QP_CREATE.
	Attach(dev Device, handle, qpn uint32, caps QPCaps) error
	// PostSend posts the whole batch and rings the doorbell once, or posts
	// nothing and returns an error (ErrQueueFull when it does not fit).
	PostSend(wrs []SendWR) error
	// QueueSend is PostSend without the doorbell: the work requests are in
	// the send queue, and the device starts on them at the next Ring or
	// PostSend. Callers batch several QueueSends under one Ring.
	QueueSend(wrs []SendWR) error
	// Ring rings the send doorbell once for every work request queued so
	// far. It may run concurrently with QueueSend and PostSend (the core
	// keeps it from racing Close): rxe's doorbell is a POST_SEND write
	// that makes the kernel read the producer index; a provider whose
	// doorbell copies queue entries must order that itself.
	Ring() error
	// PostRecv posts the whole batch or nothing.
	PostRecv(wrs []RecvWR) error
	Close() error
}

// Hooks a hardware provider needs around the core's commands. Each is an
// optional interface, as CQArmer is: the core calls it when the provider's
// object implements it, and rxe implements none (the kernel's rxe does
// that work). docs/providers.md maps them to rdma-core's mlx5.

// QPState is a queue pair state (IB_QPS_*: RESET 0, INIT 1, RTR 2, RTS 3,
// SQD 4, SQE 5, ERR 6).
type QPState uint8

// QPStateReset is the state in which a hardware provider must forget the
// QP's completions and reset its queue indices (QPModifier).
const QPStateReset QPState = 0

// QPModifier is a QP that takes part in MODIFY_QP: BeforeModify runs before
// the command (mask is the IB_QP_* attribute mask; to is the new state
// when mask has IB_QP_STATE) and may refuse it; AfterModify runs once the
// kernel accepted it. rdma-core's mlx5_modify_qp does its work after the
// command: on a move to RESET it cleans both CQs of the QP's completions
// (CQCleaner) and resets its send and receive indices and doorbell
// records; the core cleans the CQs itself, before AfterModify.
type QPModifier interface {
	BeforeModify(mask uint32, to QPState) error
	AfterModify(mask uint32, to QPState) error
}

// QPDestroyer is a QP with work to do before DESTROY_QP (mlx5_destroy_qp
// takes the context's QP table lock); an error keeps the QP. After the
// command the core cleans the CQs (CQCleaner), then Close unmaps.
type QPDestroyer interface {
	BeforeDestroy() error
}

// CQCleaner is a CQ whose ring can hold completions of a QP that no longer
// exists or was reset (rdma-core's __mlx5_cq_clean): Clean drops those of
// QP qpn (and returns their receive buffers to srq, if the QP used one).
// The core calls it after a QP that uses the CQ went to RESET and after
// the QP was destroyed (no completion of it can come then).
type CQCleaner interface {
	Clean(qpn uint32, srq SRQ)
}

// AHState is the closed state of an address handle, for a provider's AH
// to embed (rxe.AH does): uverbs.AH.Close marks it once the kernel
// destroyed the AH, and a UD send checks it (one atomic load, in
// qp.PostSend and QueueSend) and refuses a closed AH before anything is
// posted. The device reads the AH only when it sends, after the post: rxe
// fails a send whose AH is gone with a local QP operation error and moves
// the QP to ERR, and one whose ah_num the kernel gave to a new AH of the
// same PD goes to that AH's address.
type AHState struct{ closed atomic.Bool }

// AHClosed reports whether the address handle was destroyed.
func (s *AHState) AHClosed() bool { return s.closed.Load() }

// MarkAHClosed records that the address handle was destroyed.
func (s *AHState) MarkAHClosed() { s.closed.Store(true) }

// ClosableAH is a provider AH that embeds AHState.
type ClosableAH interface {
	AH
	AHClosed() bool
	MarkAHClosed()
}

var (
	registryMu sync.Mutex
	registry   = map[string]Provider{}
)

// Register makes p the provider of devices whose driver is p.Name() (as
// sysfs names it: "rxe", "siw", "mlx5"). A provider package registers
// itself in init, and a program links it in with an import (uverbs
// imports uverbs/rxe). A second provider for the same driver replaces the
// first. A nil p, or one whose Name is empty, is refused.
func Register(p Provider) error {
	if p == nil {
		return errors.New("uverbs/provider: Register of a nil provider")
	}
	name := p.Name()
	if name == "" {
		return fmt.Errorf("uverbs/provider: Register of a %T whose Name is empty", p)
	}
	registryMu.Lock()
	defer registryMu.Unlock()
	registry[name] = p
	return nil
}

// Lookup returns the provider registered for a driver.
func Lookup(driver string) (Provider, bool) {
	registryMu.Lock()
	defer registryMu.Unlock()
	p, ok := registry[driver]
	return p, ok
}

// Names lists the registered drivers, sorted.
func Names() []string {
	registryMu.Lock()
	defer registryMu.Unlock()
	var ns []string
	for n := range registry {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	return ns
}
