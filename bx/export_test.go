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
