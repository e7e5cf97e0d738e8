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
// It reads each ACTIVE device's GID table through the device (one ioctl)
// rather than sysfs (a file per index, 1024 on rxe).
func ActiveDevices() ([]ActiveDevice, error) {
	devs, err := uverbs.ListWithoutGIDs()
	if err != nil {
		return nil, err
	}
	var out []ActiveDevice
	for _, d := range devs {
		p := d.Port(1)
		if p == nil || p.State != "ACTIVE" {
			continue
		}
		gids, err := portGIDs(d.Name)
		if err != nil {
			return nil, err
		}
		if g, err := uverbs.ChooseGID(gids); err == nil {
			out = append(out, ActiveDevice{Name: d.Name, IP: g.GID.To4()})
		}
	}
	return out, nil
}

// portGIDs is port 1's GID table of the device name.
func portGIDs(name string) ([]uverbs.GID, error) {
	c, err := uverbs.Open(name)
	if err != nil {
		return nil, fmt.Errorf("ps: device %s: %w", name, err)
	}
	defer c.Close()
	return c.GIDs(1)
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
