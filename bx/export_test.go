package bx

// BreakLanesForTest forces every QP to the peer to ERR, as a failed link or
// an outside `ibv_modify_qp` would.
func (p *Peer) BreakLanesForTest() error {
	for _, l := range p.lanes {
		l.mu.Lock()
		q := l.qp
		l.mu.Unlock()
		if err := q.ToError(); err != nil {
			return err
		}
	}
	return nil
}

// SendRndvForTest sends a hand-made rendezvous descriptor, as a faulty or
// hostile peer could.
func (p *Peer) SendRndvForTest(stream uint32, addr uint64, rkey, n uint32) error {
	b, err := p.e.eager.Alloc(HeaderSize + rndvSize)
	if err != nil {
		return err
	}
	d := rndv{Addr: addr, RKey: rkey, Len: n}
	d.encode(b.Bytes()[HeaderSize:])
	return p.send(p.e.stopCh, stream, header{Type: typRndv, Length: rndvSize}, b, nil)
}
