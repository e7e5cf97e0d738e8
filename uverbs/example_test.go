package uverbs_test

import (
	"fmt"
	"log"
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
	rxetest.RunExamples(t, []rxetest.ExampleCase{
		{Name: "ExampleListWithoutGIDs", F: ExampleListWithoutGIDs, Want: "rxe0 rxe"},
		{Name: "ExampleOpen", F: ExampleOpen, Want: "rxe0 "},
	})
}
