package ps

import (
	"fmt"
	"net"

	"github.com/goverbs/goverbs/uverbs"
)

// ActiveDevice is an ACTIVE RDMA device and the IPv4 address of its RoCE v2
// GID.
type ActiveDevice struct {
	Name string
	IP   net.IP
}

// ActiveDevices lists the devices with an ACTIVE port 1 and an IPv4 RoCE v2
// GID, in the order uverbs.List returns them (rxe0, rxe1 in the guest).
func ActiveDevices() ([]ActiveDevice, error) {
	devs, err := uverbs.List()
	if err != nil {
		return nil, err
	}
	var out []ActiveDevice
	for _, d := range devs {
		p := d.Port(1)
		if p == nil || p.State != "ACTIVE" {
			continue
		}
		if g, err := uverbs.ChooseGID(p.GIDs); err == nil {
			out = append(out, ActiveDevice{Name: d.Name, IP: g.GID.To4()})
		}
	}
	return out, nil
}

// DeviceForIP returns the ACTIVE device whose RoCE v2 GID is ip. An empty
// or unspecified ip takes the only device, if there is one.
func DeviceForIP(ip string) (string, error) {
	devs, err := ActiveDevices()
	if err != nil {
		return "", err
	}
	want := net.ParseIP(ip)
	if want == nil || want.IsUnspecified() {
		if len(devs) == 1 {
			return devs[0].Name, nil
		}
		return "", fmt.Errorf("%w: %d devices and no address to choose by (give a device)", ErrNoDevice, len(devs))
	}
	for _, d := range devs {
		if d.IP.Equal(want) {
			return d.Name, nil
		}
	}
	return "", fmt.Errorf("%w: none has the GID of %s (give a device)", ErrNoDevice, ip)
}
