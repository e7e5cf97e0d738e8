package ioctl

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/internal/sentinel"
)

// ErrClosed is returned for any use of a closed File or object. It is
// goverbs.ErrClosed for errors.Is, as every package's ErrClosed is.
var ErrClosed = sentinel.Closed("use of closed uverbs object")

// ErrNotSupported wraps the errno values by which a kernel says it lacks an
// ioctl method or the ioctl interface itself (EPROTONOSUPPORT, ENOTTY,
// EOPNOTSUPP). Callers fall back to the legacy command on it.
var ErrNotSupported = errors.New("not supported by this kernel")

// Error is a failed uverbs command. It unwraps to the unix.Errno, so
// errors.Is(err, unix.EBUSY) works, and to ErrNotSupported where that applies.
type Error struct {
	Op    string // e.g. "CQ_CREATE" or "write MODIFY_QP"
	Errno unix.Errno
}

func (e *Error) Error() string {
	msg := e.Errno.Error()
	if h := hint(e.Errno); h != "" {
		msg += " (" + h + ")"
	}
	return e.Op + ": " + msg
}

// Unwrap returns the errno and, for the "method absent" family, ErrNotSupported.
func (e *Error) Unwrap() []error {
	if e.Errno == unix.EPROTONOSUPPORT || e.Errno == unix.ENOTTY || e.Errno == unix.EOPNOTSUPP {
		return []error{e.Errno, ErrNotSupported}
	}
	return []error{e.Errno}
}

// hint says what an errno usually means for a uverbs command.
func hint(e unix.Errno) string {
	switch e {
	case unix.EBUSY:
		return "the object is still in use: destroy what depends on it first"
	case unix.ENOENT:
		return "unknown object handle"
	case unix.EPROTONOSUPPORT:
		return "method or attribute not supported by this kernel"
	case unix.ENOTTY:
		return "no ioctl interface on this device"
	case unix.ENOMEM:
		return "kernel out of memory or locked-memory limit reached (ulimit -l)"
	case unix.EPERM, unix.EACCES:
		return "permission denied on the device or memory"
	case unix.ENOSPC:
		return "response buffer too small"
	}
	return ""
}

// File owns an open /dev/infiniband/uverbsN descriptor and knows how to
// reach the kernel's commands on it.
type File struct {
	mu       sync.RWMutex // write-held by Close; read-held by commands
	fd       int
	driverID uint32
	closed   bool
	// writeViaSyscall is set once INVOKE_WRITE turned out to be absent (or
	// when forced): legacy commands then go through write().
	writeViaSyscall atomic.Bool
	cleanup         runtime.Cleanup
}

// Open opens a uverbs character device for commands of the given driver.
func Open(path string, driverID uint32) (*File, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	f := &File{fd: fd, driverID: driverID}
	// A safety net only: owners close explicitly.
	f.cleanup = runtime.AddCleanup(f, func(fd int) { unix.Close(fd) }, fd)
	return f, nil
}

// Fd returns the descriptor, or -1 after Close.
func (f *File) Fd() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.closed {
		return -1
	}
	return f.fd
}

// DriverID returns the driver id placed in every ioctl header.
func (f *File) DriverID() uint32 { return f.driverID }

// ForceWrite makes legacy commands use write() instead of INVOKE_WRITE, as
// on kernels without the ioctl interface. Tests use it to run that path.
func (f *File) ForceWrite(on bool) { f.writeViaSyscall.Store(on) }

// UsesWrite reports whether legacy commands go through write().
func (f *File) UsesWrite() bool { return f.writeViaSyscall.Load() }

// Either is rdma-core's rule for a verb that has both an ioctl method and
// a legacy command, written once: native (the RDMA_VERBS_IOCTL method)
// unless this File speaks write() only, and legacy (INVOKE_WRITE, or
// write()) where the kernel answers that it lacks the method
// (ErrNotSupported).
func (f *File) Either(native, legacy func() error) error {
	err := ErrNotSupported
	if !f.UsesWrite() {
		err = native()
	}
	if errors.Is(err, ErrNotSupported) {
		err = legacy()
	}
	return err
}

// Close closes the descriptor. It is idempotent. Objects whose rings are
// still mapped keep the kernel context alive: unmap them first.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	f.cleanup.Stop()
	return unix.Close(f.fd)
}

func (f *File) acquire() (int, error) {
	f.mu.RLock()
	if f.closed {
		f.mu.RUnlock()
		return -1, ErrClosed
	}
	return f.fd, nil
}

// Do issues the call. op names it in errors.
func (f *File) Do(c *Call, op string) error {
	if c.err != nil {
		return c.err
	}
	fd, err := f.acquire()
	if err != nil {
		return err
	}
	defer f.mu.RUnlock()
	c.buf.hdr.Length = uint16(SizeofIoctlHdr + SizeofAttr*int(c.buf.hdr.Num_attrs))
	c.buf.hdr.Driver_id = f.driverID
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), RDMA_VERBS_IOCTL, uintptr(unsafe.Pointer(&c.buf)))
	runtime.KeepAlive(c)
	if e != 0 {
		return &Error{Op: op, Errno: e}
	}
	return nil
}

// Cmd is one legacy uverbs command (ib_user_verbs.h): the core request
// struct, whose first field is the user pointer to the response when the
// command has one, the core response, and the provider's private data.
type Cmd struct {
	Command   uint32         // IB_USER_VERBS_CMD_*
	In        unsafe.Pointer // core request struct, starting with its response field if any
	InLen     int
	Out       unsafe.Pointer // core response struct, or nil
	OutLen    int
	DriverIn  []byte // provider request (UHW_IN)
	DriverOut []byte // provider response (UHW_OUT)
}

// Write runs a legacy command the way rdma-core does: through the
// INVOKE_WRITE ioctl method when the kernel has it, else with write() on the
// descriptor. A kernel without INVOKE_WRITE is remembered.
func (f *File) Write(cmd *Cmd, op string) error {
	if !f.writeViaSyscall.Load() {
		err := f.invokeWrite(cmd, op)
		// Only "no ioctl at all" and "no INVOKE_WRITE method" mean the
		// kernel lacks the path; EOPNOTSUPP is one verb's answer.
		if err == nil || !(errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EPROTONOSUPPORT)) {
			return err
		}
		f.writeViaSyscall.Store(true)
	}
	return f.writeSyscall(cmd, op)
}

func (f *File) invokeWrite(cmd *Cmd, op string) error {
	var c Call
	c.Reset(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_INVOKE_WRITE, f.driverID)
	// The 8-byte command header is not part of CORE_IN; the response
	// pointer inside the request is ignored on this path.
	c.InPtr(UVERBS_ATTR_CORE_IN, cmd.In, cmd.InLen, AttrMandatory)
	if cmd.Out != nil {
		c.Out(UVERBS_ATTR_CORE_OUT, cmd.Out, cmd.OutLen, AttrMandatory)
	}
	c.InConst(UVERBS_ATTR_WRITE_CMD, uint64(cmd.Command))
	if len(cmd.DriverIn) > 0 {
		c.InBytes(AttrUHWIn, cmd.DriverIn, 0)
	}
	if len(cmd.DriverOut) > 0 {
		c.OutBytes(AttrUHWOut, cmd.DriverOut, 0)
	}
	return f.Do(&c, op)
}

// EncodeWrite returns the bytes write() sends for cmd, with the response
// pointer set to resp (core response followed by the driver response).
func EncodeWrite(cmd *Cmd, resp []byte) ([]byte, error) {
	if len(resp) > 0 && cmd.InLen < 8 {
		return nil, fmt.Errorf("ioctl: write command %d: request of %d bytes has no room for the response pointer", cmd.Command, cmd.InLen)
	}
	total := SizeofCmdHdr + cmd.InLen + len(cmd.DriverIn)
	if total%4 != 0 || total/4 > 0xffff {
		return nil, fmt.Errorf("ioctl: write command %d: request of %d bytes is not a word multiple below 256 KiB", cmd.Command, total)
	}
	if len(resp)%4 != 0 || len(resp)/4 > 0xffff {
		return nil, fmt.Errorf("ioctl: write command %d: response of %d bytes is not a word multiple below 256 KiB", cmd.Command, len(resp))
	}
	buf := make([]byte, total)
	h := (*CmdHdr)(unsafe.Pointer(&buf[0]))
	h.Command = cmd.Command
	h.In_words = uint16(total / 4)
	h.Out_words = uint16(len(resp) / 4)
	copy(buf[SizeofCmdHdr:], unsafe.Slice((*byte)(cmd.In), cmd.InLen))
	copy(buf[SizeofCmdHdr+cmd.InLen:], cmd.DriverIn)
	if len(resp) > 0 {
		// The response pointer is the first field of every request that
		// has a response.
		*(*uint64)(unsafe.Pointer(&buf[SizeofCmdHdr])) = uint64(uintptr(unsafe.Pointer(&resp[0])))
	}
	return buf, nil
}

func (f *File) writeSyscall(cmd *Cmd, op string) error {
	resp := make([]byte, cmd.OutLen+len(cmd.DriverOut))
	buf, err := EncodeWrite(cmd, resp)
	if err != nil {
		return err
	}
	fd, err := f.acquire()
	if err != nil {
		return err
	}
	defer f.mu.RUnlock()
	n, _, e := unix.Syscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
	runtime.KeepAlive(buf)
	runtime.KeepAlive(resp)
	if e != 0 {
		return &Error{Op: "write " + op, Errno: e}
	}
	if int(n) != len(buf) {
		return fmt.Errorf("write %s: short write %d of %d bytes", op, n, len(buf))
	}
	if cmd.Out != nil {
		copy(unsafe.Slice((*byte)(cmd.Out), cmd.OutLen), resp)
	}
	copy(cmd.DriverOut, resp[cmd.OutLen:])
	return nil
}
