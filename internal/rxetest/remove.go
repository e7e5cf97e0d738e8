package rxetest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/uverbs"
)

// Removal is an `rdma link delete` of an rxe device under way. The kernel
// (6.1) holds the delete until every uverbs descriptor of the device is
// closed (rxe has no disassociate_ucontext, so ib_uverbs_remove_one waits
// for them), so it runs in a goroutine: Done is closed when it returned.
type Removal struct {
	Dev    string // the rxe device, "rxe1"
	Netdev string // the netdev it was made on, "v1"
	Addr   net.IP // its IPv4 address, for the GID the restored device must show

	Start   time.Time
	started bool
	done    chan struct{}
	out     []byte
	err     error
	took    time.Duration
}

// Done is closed when the delete returned.
func (r *Removal) Done() <-chan struct{} { return r.done }

// Result is the delete's output and error; call it after Done.
func (r *Removal) Result() (string, time.Duration, error) {
	<-r.done
	return strings.TrimSpace(string(r.out)), r.took, r.err
}

// Finished reports whether the delete has returned.
func (r *Removal) Finished() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// RemoveDevice prepares `rdma link delete dev` (Delete starts it) and, in
// t.Cleanup, waits for
// it (bounded by hang.Scale: a delete still blocked then means something
// of the process holds the device; the test fails naming it) and adds the
// device back as the guest's init makes it (`rdma link add dev type rxe
// netdev NETDEV`), waiting for port 1 ACTIVE and its IPv4-mapped GID, so
// later tests of the package find it as before. A failed restore fails
// the test loudly. Register it before the cleanups that close what the
// test made on the device: cleanups run last-in first-out, so those
// close first and let the delete finish.
func RemoveDevice(t *testing.T, dev string) *Removal {
	t.Helper()
	// Not on a machine of the user's (scripts/vm runs the tests on the
	// host when it has an RDMA device): deleting its device is not a
	// test's to do. A plain skip, required or not.
	if os.Getenv("GOVERBS_VM_GUEST") != "1" && os.Getenv("GOVERBS_RXE_REMOVE") != "1" {
		t.Skipf("deletes and adds back %s: only in goverbs' throw-away guest (GOVERBS_VM_GUEST=1) or with GOVERBS_RXE_REMOVE=1", dev)
	}
	if _, err := exec.LookPath("rdma"); err != nil {
		skip(t, "no rdma tool (iproute2) to delete a device: "+err.Error())
	}
	// The netdev and the IPv4-mapped GID as they are now: what the
	// restored device must have again.
	d, err := uverbs.Lookup(dev)
	if err != nil {
		t.Fatalf("remove %s: %v", dev, err)
	}
	netdev, ip := d.Parent, ipv4GID(&d)
	if netdev == "" || ip == nil {
		t.Fatalf("remove %s: want an rxe device on a netdev with an IPv4-mapped GID on port 1, have parent %q, GIDs %v", dev, netdev, d.Port(1))
	}
	r := &Removal{Dev: dev, Netdev: netdev, Addr: ip, done: make(chan struct{})}
	t.Cleanup(func() { r.restore(t) })
	return r
}

// Delete starts the delete, in a goroutine, and returns at once.
func (r *Removal) Delete(t testing.TB) {
	t.Helper()
	r.Start = time.Now()
	r.started = true
	go func() {
		defer close(r.done)
		r.out, r.err = exec.Command("rdma", "link", "delete", r.Dev).CombinedOutput()
		r.took = time.Since(r.Start)
	}()
	t.Logf("rdma link delete %s (netdev %s, %s) started", r.Dev, r.Netdev, r.Addr)
}

// WaitFinished waits up to hang.Scale(d) for the delete to return and
// reports whether it did.
func (r *Removal) WaitFinished(d time.Duration) bool {
	select {
	case <-r.done:
		return true
	case <-time.After(hang.Scale(d)):
		return false
	}
}

func (r *Removal) restore(t *testing.T) {
	t.Helper()
	if !r.started {
		return
	}
	if !r.WaitFinished(30 * time.Second) {
		// Nothing can add the device back while its delete is blocked:
		// the rest of the package would run without it.
		t.Errorf("rdma link delete %s still blocked after %v: something holds a uverbs descriptor of the device; later tests will not find it\n%s", r.Dev, hang.Scale(30*time.Second), Table())
		return
	}
	out, took, err := r.Result()
	t.Logf("rdma link delete %s returned after %v: %v %s", r.Dev, took.Round(time.Millisecond), err, out)
	if err := Restore(r.Dev, r.Netdev, r.Addr); err != nil {
		t.Errorf("RESTORE FAILED, later tests will not find %s: %v", r.Dev, err)
	}
}

// Restore adds an rxe device back on netdev (unless it exists) and waits
// for its port ACTIVE with the IPv4-mapped GID of ip, as the guest's init
// (rxe_ready) does.
func Restore(dev, netdev string, ip net.IP) error {
	if _, err := uverbs.LookupWithoutGIDs(dev); err != nil {
		if out, err := exec.Command("rdma", "link", "add", dev, "type", "rxe", "netdev", netdev).CombinedOutput(); err != nil {
			return fmt.Errorf("rdma link add %s type rxe netdev %s: %v: %s", dev, netdev, err, bytes.TrimSpace(out))
		}
	}
	wait := hang.Scale(20 * time.Second)
	deadline := time.Now().Add(wait)
	for {
		d, err := uverbs.Lookup(dev)
		if err == nil && d.Port(1) != nil && d.Port(1).State == "ACTIVE" && ip.Equal(ipv4GID(&d)) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ACTIVE with the GID of %s %v after it was added (%v, port %+v)", dev, ip, wait, err, d.Port(1))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ipv4GID is the address of port 1's first IPv4-mapped GID, or nil.
func ipv4GID(d *uverbs.DeviceInfo) net.IP {
	if p := d.Port(1); p != nil {
		for _, g := range p.GIDs {
			if g.IsIPv4() {
				return g.GID.To4()
			}
		}
	}
	return nil
}

// Table is `rdma link` and `rdma resource show`, for a failure's message.
func Table() string {
	a, _ := exec.Command("rdma", "link").CombinedOutput()
	b, _ := exec.Command("rdma", "resource", "show").CombinedOutput()
	return string(a) + string(b)
}
