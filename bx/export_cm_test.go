package bx

import (
	"fmt"
	"net/netip"

	"github.com/goverbs/goverbs/qp"
)

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

// LaneAttrForTest queries the QP of the peer's lane i.
func (p *Peer) LaneAttrForTest(i int) (qp.Attr, error) {
	l := p.lanes[i]
	l.mu.Lock()
	q := l.qp
	l.mu.Unlock()
	if q == nil {
		return qp.Attr{}, fmt.Errorf("lane %d has no QP", i)
	}
	return q.Query()
}
