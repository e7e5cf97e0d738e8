package ioctl_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/ioctl"
)

func TestErrorUnwrap(t *testing.T) {
	for _, tc := range []struct {
		errno        unix.Errno
		notSupported bool
		hint         string
	}{
		{unix.EBUSY, false, "still in use"},
		{unix.ENOENT, false, "unknown object handle"},
		{unix.EINVAL, false, ""},
		{unix.EPROTONOSUPPORT, true, "not supported by this kernel"},
		{unix.ENOTTY, true, "no ioctl interface"},
		{unix.EOPNOTSUPP, true, ""},
		{unix.ENOMEM, false, "ulimit -l"},
		{unix.ENOSPC, false, "response buffer too small"},
	} {
		t.Run(tc.errno.Error(), func(t *testing.T) {
			var err error = &ioctl.Error{Op: "CQ_CREATE", Errno: tc.errno}
			wrapped := fmt.Errorf("cq: create: %w", err)
			for _, e := range []error{err, wrapped} {
				if !errors.Is(e, tc.errno) {
					t.Errorf("errors.Is(%v, %v) = false", e, tc.errno)
				}
				if got := errors.Is(e, ioctl.ErrNotSupported); got != tc.notSupported {
					t.Errorf("errors.Is(%v, ErrNotSupported) = %v, want %v", e, got, tc.notSupported)
				}
				var ie *ioctl.Error
				if !errors.As(e, &ie) || ie.Errno != tc.errno {
					t.Errorf("errors.As(%v, *ioctl.Error) failed", e)
				}
			}
			if errors.Is(err, unix.EAGAIN) {
				t.Errorf("%v Is EAGAIN", err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "CQ_CREATE: ") || !strings.Contains(msg, tc.errno.Error()) {
				t.Errorf("message %q: want the op name and the errno text", msg)
			}
			if tc.hint != "" && !strings.Contains(msg, tc.hint) {
				t.Errorf("message %q: want the hint %q", msg, tc.hint)
			}
			if tc.hint == "" && tc.errno == unix.EINVAL && strings.Contains(msg, "(") {
				t.Errorf("message %q: EINVAL has no hint", msg)
			}
		})
	}
}

// openNull opens /dev/null as if it were a uverbs device of driver rxe. It
// is no uverbs fd: a real ioctl on it gets ENOTTY from the kernel, and a
// write() succeeds with its full length.
func openNull(t *testing.T) *ioctl.File {
	t.Helper()
	f, err := ioctl.Open("/dev/null", ioctl.RDMA_DRIVER_RXE)
	if err != nil {
		t.Skipf("no /dev/null: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestOpenMissing(t *testing.T) {
	_, err := ioctl.Open("/nonexistent/uverbs9", ioctl.RDMA_DRIVER_RXE)
	if err == nil || !errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), "/nonexistent/uverbs9") {
		t.Errorf("Open of a missing path: %v, want ENOENT naming the path", err)
	}
}

func TestDoENOTTY(t *testing.T) {
	f := openNull(t)
	if f.DriverID() != ioctl.RDMA_DRIVER_RXE {
		t.Errorf("DriverID = %d", f.DriverID())
	}
	if f.Fd() < 0 {
		t.Fatalf("Fd = %d", f.Fd())
	}
	var r ioctl.QueryPortRespEx
	c := ioctl.NewCall(ioctl.UVERBS_OBJECT_DEVICE, ioctl.UVERBS_METHOD_QUERY_PORT, ioctl.RDMA_DRIVER_MLX5)
	c.InConst(ioctl.UVERBS_ATTR_QUERY_PORT_PORT_NUM, 1)
	c.Out(ioctl.UVERBS_ATTR_QUERY_PORT_RESP, unsafe.Pointer(&r), ioctl.SizeofQueryPortRespEx, ioctl.AttrMandatory)
	err := f.Do(c, "QUERY_PORT")
	if !errors.Is(err, unix.ENOTTY) || !errors.Is(err, ioctl.ErrNotSupported) {
		t.Fatalf("Do on /dev/null = %v, want ENOTTY that Is ErrNotSupported", err)
	}
	if !strings.Contains(err.Error(), "QUERY_PORT") {
		t.Errorf("error %q does not name the op", err)
	}
	// Do puts the file's driver id into the header, whatever the Call said.
	if d := decode(t, c.Encoded()); d.driverID != ioctl.RDMA_DRIVER_RXE {
		t.Errorf("after Do, driver_id = %d, want the file's %d", d.driverID, ioctl.RDMA_DRIVER_RXE)
	}
}

func TestDoEncodingErrorBeforeSyscall(t *testing.T) {
	f := openNull(t)
	c := ioctl.NewCall(ioctl.UVERBS_OBJECT_DEVICE, 0, ioctl.RDMA_DRIVER_RXE)
	for i := 0; i <= ioctl.MaxAttrs; i++ {
		c.InU32(uint16(i), 0)
	}
	if c.Err() == nil {
		t.Fatal("no error for too many attributes")
	}
	// A syscall would have answered ENOTTY; the encoding error comes first.
	err := f.Do(c, "X")
	if err != c.Err() || errors.Is(err, unix.ENOTTY) {
		t.Errorf("Do = %v, want the encoding error %v and no syscall", err, c.Err())
	}
	// Also on a closed file: the encoding error is checked first.
	f.Close()
	if err := f.Do(c, "X"); err != c.Err() {
		t.Errorf("Do on a closed file with a bad call = %v, want %v", err, c.Err())
	}
}

func TestWriteFallsBackToWrite(t *testing.T) {
	f := openNull(t)
	if f.UsesWrite() {
		t.Fatal("a new File uses write() before INVOKE_WRITE was tried")
	}
	m := modifyQPRTR()
	err := f.Write(&ioctl.Cmd{Command: ioctl.IB_USER_VERBS_CMD_MODIFY_QP, In: unsafe.Pointer(m), InLen: ioctl.SizeofModifyQP}, "MODIFY_QP")
	if err != nil {
		t.Fatalf("Write MODIFY_QP on /dev/null: %v (INVOKE_WRITE gets ENOTTY, write() must follow)", err)
	}
	if !f.UsesWrite() {
		t.Error("UsesWrite = false after INVOKE_WRITE answered ENOTTY")
	}
	// With a response: write() to /dev/null leaves the response buffer
	// zero, and Write copies it to Out and DriverOut.
	var resp ioctl.AllocPDResp
	resp.Handle = 0xffffffff
	drvOut := []byte{0xff, 0xff, 0xff, 0xff}
	var req ioctl.AllocPD
	err = f.Write(&ioctl.Cmd{Command: ioctl.IB_USER_VERBS_CMD_ALLOC_PD, In: unsafe.Pointer(&req), InLen: ioctl.SizeofAllocPD,
		Out: unsafe.Pointer(&resp), OutLen: ioctl.SizeofAllocPDResp, DriverOut: drvOut}, "ALLOC_PD")
	if err != nil {
		t.Fatalf("Write ALLOC_PD: %v", err)
	}
	if resp.Handle != 0 || binary.NativeEndian.Uint32(drvOut) != 0 {
		t.Errorf("response not copied back: handle %#x, driver out % x", resp.Handle, drvOut)
	}
	// A framing error surfaces before any syscall.
	var odd [6]byte
	err = f.Write(&ioctl.Cmd{Command: 1, In: unsafe.Pointer(&odd), InLen: len(odd)}, "ODD")
	if err == nil || !strings.Contains(err.Error(), "word multiple") {
		t.Errorf("Write of a 14-byte request = %v, want the word-multiple error", err)
	}
}

func TestForceWrite(t *testing.T) {
	f := openNull(t)
	f.ForceWrite(true)
	if !f.UsesWrite() {
		t.Fatal("ForceWrite(true) not reflected by UsesWrite")
	}
	var req ioctl.AllocPD
	var resp ioctl.AllocPDResp
	if err := f.Write(&ioctl.Cmd{Command: ioctl.IB_USER_VERBS_CMD_ALLOC_PD, In: unsafe.Pointer(&req), InLen: 8,
		Out: unsafe.Pointer(&resp), OutLen: 4}, "ALLOC_PD"); err != nil {
		t.Fatal(err)
	}
	f.ForceWrite(false)
	if f.UsesWrite() {
		t.Error("ForceWrite(false) not reflected by UsesWrite")
	}
}

func TestClose(t *testing.T) {
	f, err := ioctl.Open("/dev/null", ioctl.RDMA_DRIVER_RXE)
	if err != nil {
		t.Skip(err)
	}
	fd := f.Fd()
	if err := f.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close = %v, want nil (idempotent)", err)
	}
	if f.Fd() != -1 {
		t.Errorf("Fd after Close = %d, want -1", f.Fd())
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
		// Another parallel test may have reused the number; only log.
		t.Logf("fd %d is valid again after Close (reused by a parallel open?)", fd)
	}
	c := ioctl.NewCall(ioctl.UVERBS_OBJECT_PD, ioctl.UVERBS_METHOD_PD_DESTROY, ioctl.RDMA_DRIVER_RXE)
	c.InIDR(0, 1)
	if err := f.Do(c, "PD_DESTROY"); !errors.Is(err, ioctl.ErrClosed) {
		t.Errorf("Do after Close = %v, want ErrClosed", err)
	}
	var req ioctl.AllocPD
	if err := f.Write(&ioctl.Cmd{Command: ioctl.IB_USER_VERBS_CMD_ALLOC_PD, In: unsafe.Pointer(&req), InLen: 8}, "ALLOC_PD"); !errors.Is(err, ioctl.ErrClosed) {
		t.Errorf("Write after Close = %v, want ErrClosed", err)
	}
	f.ForceWrite(true)
	if err := f.Write(&ioctl.Cmd{Command: ioctl.IB_USER_VERBS_CMD_ALLOC_PD, In: unsafe.Pointer(&req), InLen: 8}, "ALLOC_PD"); !errors.Is(err, ioctl.ErrClosed) {
		t.Errorf("write() path after Close = %v, want ErrClosed", err)
	}
}

func TestCloseConcurrent(t *testing.T) {
	f := openNull(t)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			c := ioctl.NewCall(0, 0, ioctl.RDMA_DRIVER_RXE)
			err := f.Do(c, "X")
			if !errors.Is(err, unix.ENOTTY) && !errors.Is(err, ioctl.ErrClosed) {
				t.Errorf("Do racing Close = %v, want ENOTTY or ErrClosed", err)
			}
		}()
		go func() { defer wg.Done(); f.Close() }()
	}
	wg.Wait()
	if f.Fd() != -1 {
		t.Error("file open after concurrent Close")
	}
}

// --- seeing what File.Do really hands the kernel ---
