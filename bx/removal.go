package bx

import (
	"errors"
	"fmt"

	"github.com/goverbs/goverbs/cm"
)

// Device removal (`rdma link delete`, a driver unloaded) with rdma_cm
// lanes. The kernel reports DEVICE_REMOVAL to every rdma_cm ID bound to the
// device and then waits until every uverbs descriptor of the device is
// closed (rxe cannot disassociate a live context): the endpoint's, so the
// removal waits for Endpoint.Close. Meanwhile the lanes' QPs may even go
// on working, and nothing else tells. So the listener's and every
// connected lane's DEVICE_REMOVAL ends the endpoint's peers with an error
// matching ErrPeerGone and cm.ErrDeviceRemoved that says to close the
// endpoint; a handshake after it fails with that error too. Lanes set up
// by exchange (the default) hear of no removal: their peers go on until
// Close (docs/reliability.md).

// deviceRemoved shuts every peer down with the removal error, once.
func (e *Endpoint) deviceRemoved() {
	c := e.lcm
	c.mu.Lock()
	if c.removed != nil {
		c.mu.Unlock()
		return
	}
	c.removed = fmt.Errorf("%w: %w: %s (rdma_cm DEVICE_REMOVAL); close the endpoint, the removal waits for it", ErrPeerGone, cm.ErrDeviceRemoved, e.cfg.Device)
	why := c.removed
	c.mu.Unlock()
	for _, p := range e.peerList() {
		p.shutdown(why, true)
	}
}

// removedErr is the removal error, or nil.
func (c *endpointCM) removedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.removed
}

// watchLane waits, until the ID is closed (its lane's recovery or
// teardown) or the endpoint stops, for a connected lane's DEVICE_REMOVAL;
// the other events after ESTABLISHED (DISCONNECTED, TIMEWAIT_EXIT) it
// drops: a lane's failure shows in its completions.
func (e *Endpoint) watchLane(id *cm.ID) {
	go func() {
		for {
			ev, err := id.Wait(e.stopCh)
			if err != nil {
				if errors.Is(err, cm.ErrDeviceRemoved) {
					e.deviceRemoved()
				}
				return
			}
			if ev.Type == cm.DeviceRemoval {
				e.deviceRemoved()
				return
			}
		}
	}()
}
