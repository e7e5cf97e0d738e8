package rxe

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/ioctl"
)

// The doorbell is a bare SYSCALL whose error comes back as -errno in r1:
// a real write(2) that the kernel refuses must still fail with its errno.
func TestDoorbellErrno(t *testing.T) {
	q := &qp{fd: -1, db: &doorbell{}} // no such fd: EBADF, from the kernel
	err := q.ring()
	var ie *ioctl.Error
	if !errors.As(err, &ie) || ie.Errno != unix.EBADF {
		t.Fatalf("doorbell on fd -1: %v, want an *ioctl.Error with EBADF", err)
	}

	// A write the kernel takes returns its length, which is no error.
	f, err := os.CreateTemp(t.TempDir(), "db")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	q = &qp{fd: int(f.Fd()), db: &doorbell{}}
	if err := q.ring(); err != nil {
		t.Fatalf("doorbell written to a file: %v, want nil", err)
	}
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != ioctl.SizeofCmdHdr+ioctl.SizeofPostSend {
		t.Fatalf("file holds %d bytes, want the %d of one POST_SEND", st.Size(), ioctl.SizeofCmdHdr+ioctl.SizeofPostSend)
	}
}

func TestSyscallErrno(t *testing.T) {
	for _, c := range []struct {
		r    int
		want unix.Errno
	}{
		{0, 0},
		{40, 0},
		{-int(unix.EINVAL), unix.EINVAL},
		{-1, unix.EPERM},
		{-4095, unix.Errno(4095)},
		{-4096, 0}, // below the errno range: a value, not an error
	} {
		if got := syscallErrno(uintptr(c.r)); got != c.want {
			t.Errorf("syscallErrno(%d) = %v, want %v", c.r, got, c.want)
		}
	}
}
