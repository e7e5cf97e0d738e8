package bx

import "net/netip"

// CMAddrForTest is the endpoint's rdma_cm listener (Config.LaneSetup CM),
// invalid before Listen.
func (e *Endpoint) CMAddrForTest() netip.AddrPort {
	if e.lcm == nil {
		return netip.AddrPort{}
	}
	return e.cmAddr()
}

// CMConnectDataForTest is the private data a lane's connect request to
// the peer's endpoint carries: the peer's key, epoch and lane index.
func (p *Peer) CMConnectDataForTest(epoch uint32, lane int) []byte {
	return cmConnectData(p.lcm.key, epoch, lane)
}
