package uverbs_test

import (
	"fmt"
	"log"
	"strings"
	"testing"

	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/uverbs"
)

// The devices of this machine, without reading their GID tables (on rxe,
// 1024 sysfs files a port). They need RDMA devices: in the rxe guest,
// `scripts/vm -- go test -run Example ./uverbs` shows them.
func ExampleListWithoutGIDs() {
	devs, err := uverbs.ListWithoutGIDs()
	if err != nil {
		log.Fatal(err) // uverbs.ErrNoDevice when there is none
	}
	for _, d := range devs {
		fmt.Println(d.Name, d.Driver, d.NodeType)
	}
}

// Open a device, look at its first port, pick the GID to use and allocate
// a protection domain. Close releases everything the context still holds.
func ExampleOpen() {
	ctx, err := uverbs.Open("rxe0")
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Close()
	port, err := ctx.QueryPort(1)
	if err != nil {
		log.Fatal(err)
	}
	// The RoCE v2 GID with the port's IPv4 address: not index 0, which
	// is usually the IPv6 link-local GID.
	gid, err := ctx.DefaultGID(1)
	if err != nil {
		log.Fatal(err)
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		log.Fatal(err)
	}
	defer pd.Close()
	fmt.Println(ctx.Name(), port.State, port.ActiveMTU, gid.GID, gid.Type)
}

// TestExamples runs this package's examples on the guest's devices and
// checks what they print (they have no Output comment: see rxetest.Example).
func TestExamples(t *testing.T) {
	for _, c := range []struct {
		name string
		f    func()
		want string
	}{
		{"ExampleListWithoutGIDs", ExampleListWithoutGIDs, "rxe0 rxe"},
		{"ExampleOpen", ExampleOpen, "rxe0 "},
	} {
		out := rxetest.Example(t, c.f)
		if c.want == "" && out != "" || !strings.Contains(out, c.want) {
			t.Errorf("%s printed %q, want %q in it", c.name, out, c.want)
		}
		t.Logf("%s: %s", c.name, out)
	}
}
