package uverbs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/goverbs/goverbs/internal/sentinel"
	"github.com/goverbs/goverbs/internal/uvobj"
	"github.com/goverbs/goverbs/ioctl"
	"golang.org/x/sys/unix"
)

// CompChannel is a completion channel: the kernel writes an event to it when
// an armed CQ attached to it gets a completion. Its descriptor lives in Go's
// netpoller, so a goroutine waiting for a completion is parked, not a thread
// blocked in a system call.
//
// One goroutine per channel reads its events and wakes the waiter of the CQ
// each event names. A CompChannel is safe for concurrent use.
type CompChannel struct {
	ctx  *Context
	file *os.File
	fd   int
	// fileBase is where cq names the descriptor in CQ_CREATE, held open
	// (uvobj.WithFile).
	fileBase

	mu      sync.Mutex
	waiters map[uint64]chan struct{}
	started bool
	owned   bool // Own: no reader goroutine, Next reads the events
	closed  bool
	done    chan struct{}
	events  atomic.Uint64
	err     atomic.Pointer[error]

	// intr is Interrupt's request, taken by the Next it ends (or by the
	// next one to start).
	intr atomic.Bool

	// Next's: the ctx it was last given and how to stop watching it.
	nctx  context.Context
	nstop func() bool
	next  *eventReader
}

// eventReader reads a channel's events with a raw read(2) and parks in the
// netpoller when there is none (syscall.RawConn.Read). os.File.Read would
// enter the system call through the runtime's entersyscall, and the first
// one after the process went idle wakes sysmon from its deep sleep: a futex
// wake on the critical path of every wake-up, then sysmon polling every
// 20 us on the other CPU, which keeps that CPU busy so the scheduler stacks
// the peer's wake-up on ours (docs/perf.md, "Twelfth session"). The
// descriptor is non-blocking, so the read never blocks and needs no
// entersyscall. Built once per reader, it allocates nothing per event.
type eventReader struct {
	rc  syscall.RawConn
	fn  func(fd uintptr) bool
	buf [ioctl.SizeofCompEventDesc]byte
	n   uintptr
	e   syscall.Errno
}

func newEventReader(f *os.File) (*eventReader, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	r := &eventReader{rc: rc}
	r.fn = func(fd uintptr) bool {
		for {
			n, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&r.buf[0])), uintptr(len(r.buf)))
			switch e {
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return false // park until readable, then call again
			}
			r.n, r.e = n, e
			return true
		}
	}
	return r, nil
}

// read returns the length of the event read into r.buf, io.EOF at end of
// file, or the error of the read or of the wait (a deadline, a close).
func (r *eventReader) read() (int, error) {
	r.n, r.e = 0, 0
	if err := r.rc.Read(r.fn); err != nil {
		return 0, err
	}
	switch {
	case r.e != 0:
		return 0, r.e
	case r.n == 0:
		return 0, io.EOF
	}
	return int(r.n), nil
}

// CreateCompChannel creates a completion channel.
func (c *Context) CreateCompChannel() (*CompChannel, error) {
	if c.bad() {
		return nil, errNilContext
	}
	if c.IsClosed() {
		return nil, ErrClosed
	}
	var req ioctl.CreateCompChannel
	var resp ioctl.CreateCompChannelResp
	err := c.file.Write(&ioctl.Cmd{
		Command: ioctl.IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL,
		In:      unsafe.Pointer(&req), InLen: ioctl.SizeofCreateCompChannel,
		Out: unsafe.Pointer(&resp), OutLen: ioctl.SizeofCreateCompChannelResp,
	}, "CREATE_COMP_CHANNEL")
	if err != nil {
		return nil, fmt.Errorf("uverbs: %s: create completion channel: %w", c.info.Name, err)
	}
	fd := int(resp.Fd)
	f, err := pollable(fd, "uverbs-comp-channel")
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("uverbs: %s: completion channel: %w", c.info.Name, err)
	}
	r, err := newEventReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("uverbs: %s: completion channel: %w", c.info.Name, err)
	}
	ch := &CompChannel{ctx: c, file: f, fd: fd, waiters: map[uint64]chan struct{}{}, done: make(chan struct{}), next: r}
	uvobj.SetFile(&ch.fileBase, f)
	if err := c.tab.Track(ch); err != nil {
		f.Close()
		return nil, err
	}
	return ch, nil
}

// pollable makes fd non-blocking and hands it to the netpoller.
func pollable(fd int, name string) (*os.File, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, err
	}
	unix.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), name), nil
}

// Fd returns the channel's descriptor: -1 (no channel) for a nil or zero
// CompChannel, and once it is closed. The number names the channel only
// while it is open: a Close meanwhile frees it for the next file the
// process opens (Linux gives the lowest free number), so a number read
// before a Close and used after it names another file. cq.CreateWith
// does not use it so: it holds the descriptor open across CQ_CREATE.
func (ch *CompChannel) Fd() int {
	if ch.bad() {
		return -1
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed {
		return -1 // the number may be another file's by now
	}
	return ch.fd
}

// fileBase is embedded under a name of this package's: nothing of it
// shows on CompChannel.
type fileBase = uvobj.FileBase

// Context returns the device context.
func (ch *CompChannel) Context() *Context {
	if ch.bad() {
		return nil
	}
	return ch.ctx
}

// Events is the number of completion events read so far.
func (ch *CompChannel) Events() uint64 {
	if ch.bad() {
		return 0
	}
	return ch.events.Load()
}

// Register returns a channel that receives a token whenever an event for
// userHandle (the CQ's user handle) arrives; the token is not queued twice.
func (ch *CompChannel) Register(userHandle uint64) (<-chan struct{}, error) {
	if ch.bad() {
		return nil, errNilCompChannel
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed {
		return nil, ErrClosed
	}
	if ch.owned {
		return nil, errors.New("uverbs: completion channel: owned by one reader (Own), Register is not possible")
	}
	if _, dup := ch.waiters[userHandle]; dup {
		return nil, fmt.Errorf("uverbs: completion channel: user handle %d registered twice", userHandle)
	}
	w := make(chan struct{}, 1)
	ch.waiters[userHandle] = w
	if !ch.started {
		ch.started = true
		go ch.read()
	}
	return w, nil
}

// Own makes the caller the channel's only reader: no goroutine reads it,
// and Next reads its events directly, one goroutine hop less per event.
// It is for a channel with one CQ on it (cq.Options.Events). It fails once
// Register was called.
func (ch *CompChannel) Own() error {
	if ch.bad() {
		return errNilCompChannel
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	switch {
	case ch.closed:
		return ErrClosed
	case ch.started || len(ch.waiters) > 0:
		return errors.New("uverbs: completion channel: Own after Register")
	}
	ch.owned = true
	return nil
}

// ErrInterrupted is what Next returns when Interrupt ended its wait.
var ErrInterrupted = errors.New("uverbs: completion channel: wait interrupted")

// Interrupt makes the Next that is waiting return ErrInterrupted, or, if
// none is, the next Next to start (one interrupt is kept, not counted).
// It is for handing the wait over from one goroutine to another (a
// transport whose caller takes the wait from its progress goroutine) and
// for bounding a wait by a timer that is reused. It never blocks.
func (ch *CompChannel) Interrupt() {
	if ch.bad() {
		return
	}
	ch.intr.Store(true)
	ch.file.SetReadDeadline(time.Unix(1, 0))
}

// Next parks the calling goroutine in the netpoller until the channel has
// an event, reads it and returns the CQ user handle it names; or returns
// ctx's error once ctx is done, or ErrClosed after Close. Only for an
// owned channel (Own), from one goroutine at a time. It allocates nothing
// while it is given the same ctx as the time before.
func (ch *CompChannel) Next(ctx context.Context) (uint64, error) {
	if ch.bad() {
		return 0, errNilCompChannel
	}
	if !ch.owned {
		return 0, errors.New("uverbs: completion channel: Next without Own")
	}
	if ctx == nil {
		return 0, errors.New("uverbs: completion channel: Next with a nil context")
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if ctx != ch.nctx {
		// A done ctx cuts the read short by a deadline in the past. One
		// registration per ctx: the progress loop of a transport passes
		// the same one every time.
		ch.mu.Lock()
		if ch.closed {
			ch.mu.Unlock()
			return 0, ErrClosed
		}
		if ch.nstop != nil {
			ch.nstop()
		}
		ch.nctx, ch.nstop = ctx, nil
		ch.file.SetReadDeadline(time.Time{})
		if ctx.Done() != nil {
			f := ch.file
			ch.nstop = context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Unix(1, 0)) })
		}
		ch.mu.Unlock()
	}
	if ch.intr.CompareAndSwap(true, false) {
		ch.file.SetReadDeadline(time.Time{})
		return 0, ErrInterrupted
	}
	for {
		n, err := ch.next.read()
		switch {
		case err == nil && n == len(ch.next.buf):
			ch.events.Add(1)
			return binary.NativeEndian.Uint64(ch.next.buf[:]), nil
		case err == nil:
			continue // a short read: not an event
		case errors.Is(err, os.ErrDeadlineExceeded):
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			// Interrupt's deadline, or one set for a ctx given before
			// this one.
			ch.file.SetReadDeadline(time.Time{})
			if ch.intr.CompareAndSwap(true, false) {
				return 0, ErrInterrupted
			}
		case errors.Is(err, os.ErrClosed) || errors.Is(err, io.EOF) || ch.isClosed():
			// A RawConn's read of a file closed under it fails with
			// "use of closed file" (internal/poll), not os.ErrClosed.
			return 0, ErrClosed
		default:
			return 0, fmt.Errorf("uverbs: completion channel read: %w", err)
		}
	}
}

// Unregister forgets a CQ's user handle.
func (ch *CompChannel) Unregister(userHandle uint64) {
	if ch.bad() {
		return
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	delete(ch.waiters, userHandle)
}

// Err returns the error that stopped the reader, if any.
func (ch *CompChannel) Err() error {
	if ch.bad() {
		return errNilCompChannel
	}
	if p := ch.err.Load(); p != nil {
		return *p
	}
	return nil
}

// Done is closed when the channel's reader stopped (Close, or a read
// error); a nil or zero channel's is closed.
func (ch *CompChannel) Done() <-chan struct{} {
	if ch.bad() {
		return sentinel.Done
	}
	return ch.done
}

func (ch *CompChannel) read() {
	defer close(ch.done)
	r, err := newEventReader(ch.file)
	if err != nil {
		e := fmt.Errorf("uverbs: completion channel: %w", err)
		ch.err.Store(&e)
		return
	}
	buf := &r.buf
	for {
		n, err := r.read()
		if err != nil {
			if !errors.Is(err, os.ErrClosed) && !errors.Is(err, io.EOF) && !ch.isClosed() {
				e := fmt.Errorf("uverbs: completion channel read: %w", err)
				ch.err.Store(&e)
			}
			return
		}
		if n != len(buf) {
			continue
		}
		ch.events.Add(1)
		h := binary.NativeEndian.Uint64(buf[:])
		ch.mu.Lock()
		w := ch.waiters[h]
		ch.mu.Unlock()
		if w != nil {
			select {
			case w <- struct{}{}:
			default:
			}
		}
	}
}

// isClosed reports whether Close was called.
func (ch *CompChannel) isClosed() bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.closed
}

// Close closes the channel. Destroy the CQs that use it first: the kernel
// keeps the channel alive for them, but nobody reads it any more. It is
// idempotent.
func (ch *CompChannel) Close() error {
	if ch.bad() {
		return errNilCompChannel
	}
	ch.mu.Lock()
	if ch.closed {
		ch.mu.Unlock()
		return nil
	}
	ch.closed = true
	started := ch.started
	if ch.nstop != nil {
		ch.nstop()
	}
	ch.mu.Unlock()
	err := ch.file.Close()
	if started {
		<-ch.done
	} else {
		close(ch.done)
	}
	ch.ctx.tab.Untrack(ch)
	return err
}
