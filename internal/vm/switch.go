package vm

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// netSwitch is the cluster's virtual L2 network: one learning switch per
// NIC index (segment), each node's NIC d a port. qemu's dgram netdev sends
// each Ethernet frame as one datagram on a unix socket (guest.D.I -> sw.D.I)
// and receives on its own; nothing touches a host interface or address.
// Per-node link faults (loss, down) are applied here, in both directions.
type netSwitch struct {
	dir     string
	nodes   int
	segs    []*segment
	clusDir string
	loss    []atomic.Uint32 // per node, in 1/1e6
	down    []atomic.Bool
	done    chan struct{}
	wg      sync.WaitGroup
}

type segment struct {
	sw    *netSwitch
	d     int
	ports []*port
	mu    sync.Mutex
	macs  map[[6]byte]int
}

type port struct {
	conn  *net.UnixConn
	guest *net.UnixAddr
	out   chan []byte
	// counters: frames/bytes from the node (rx) and to it (tx), drops.
	rxFrames, rxBytes, txFrames, txBytes, dropped atomic.Uint64
}

func newSwitch(dir string, nodes, devices int, clusDir string) (*netSwitch, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	s := &netSwitch{dir: dir, nodes: nodes, clusDir: clusDir, loss: make([]atomic.Uint32, nodes),
		down: make([]atomic.Bool, nodes), done: make(chan struct{})}
	for d := 0; d < devices; d++ {
		seg := &segment{sw: s, d: d, macs: map[[6]byte]int{}}
		for i := 0; i < nodes; i++ {
			g, sw := s.paths(i, d)
			c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sw, Net: "unixgram"})
			if err != nil {
				s.close()
				return nil, err
			}
			c.SetReadBuffer(4 << 20)
			c.SetWriteBuffer(4 << 20)
			seg.ports = append(seg.ports, &port{conn: c, guest: &net.UnixAddr{Name: g, Net: "unixgram"}, out: make(chan []byte, 512)})
		}
		s.segs = append(s.segs, seg)
	}
	return s, nil
}

// paths returns the guest's and the switch's socket for node i, NIC d.
func (s *netSwitch) paths(i, d int) (guest, sw string) {
	return filepath.Join(s.dir, fmt.Sprintf("guest.%d.%d", d, i)), filepath.Join(s.dir, fmt.Sprintf("sw.%d.%d", d, i))
}

func (s *netSwitch) setLoss(n int, pct float64) { s.loss[n].Store(uint32(pct * 1e4)) }
func (s *netSwitch) setDown(n int, d bool)      { s.down[n].Store(d) }

func (s *netSwitch) run() {
	for _, seg := range s.segs {
		for i, p := range seg.ports {
			s.wg.Add(2)
			go seg.reader(i, p)
			go seg.writer(i, p)
		}
	}
	s.wg.Add(1)
	go s.control()
}

// lost decides whether a frame on node n's link is dropped.
func (s *netSwitch) lost(n int) bool {
	if s.down[n].Load() {
		return true
	}
	l := s.loss[n].Load()
	return l > 0 && rand.Uint32N(1e6) < l
}

func (seg *segment) reader(i int, p *port) {
	defer seg.sw.wg.Done()
	// The largest frame: MaxMTU plus an Ethernet and a VLAN header (a
	// shorter buffer truncates a datagram silently).
	buf := make([]byte, MaxMTU+18)
	for {
		n, _, err := p.conn.ReadFromUnix(buf)
		if err != nil {
			select {
			case <-seg.sw.done:
				return
			default:
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return
		}
		if n < 14 {
			continue
		}
		p.rxFrames.Add(1)
		p.rxBytes.Add(uint64(n))
		if seg.sw.lost(i) {
			p.dropped.Add(1)
			continue
		}
		var dst, src [6]byte
		copy(dst[:], buf[0:6])
		copy(src[:], buf[6:12])
		seg.mu.Lock()
		if src[0]&1 == 0 {
			seg.macs[src] = i
		}
		to, known := seg.macs[dst]
		seg.mu.Unlock()
		frame := append([]byte(nil), buf[:n]...)
		if known && dst[0]&1 == 0 {
			if to != i {
				seg.send(to, frame)
			}
			continue
		}
		for j := range seg.ports { // flood: broadcast, multicast, unknown
			if j != i {
				seg.send(j, frame)
			}
		}
	}
}

// send queues a frame for node j (tail drop when its queue is full, like
// a real switch; rxe retransmits).
func (seg *segment) send(j int, frame []byte) {
	q := seg.ports[j]
	if seg.sw.lost(j) {
		q.dropped.Add(1)
		return
	}
	select {
	case q.out <- frame:
	default:
		q.dropped.Add(1)
	}
}

func (seg *segment) writer(j int, p *port) {
	defer seg.sw.wg.Done()
	for {
		select {
		case <-seg.sw.done:
			return
		case f := <-p.out:
			// The guest binds its socket when qemu starts: until then
			// (or after it died) writes fail; drop.
			if _, err := p.conn.WriteToUnix(f, p.guest); err != nil {
				p.dropped.Add(1)
				continue
			}
			p.txFrames.Add(1)
			p.txBytes.Add(uint64(len(f)))
		}
	}
}

// control applies link.N requests from the guests (`goverbs vm link`) and
// publishes the counters in the cluster share (switch.stats).
func (s *netSwitch) control() {
	defer s.wg.Done()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	last := ""
	for k := 0; ; k++ {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		reqs, _ := filepath.Glob(filepath.Join(s.clusDir, "link.*.req"))
		for _, q := range reqs {
			b, err := os.ReadFile(q)
			if err != nil {
				continue
			}
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(q), "link."), ".req"))
			msg := "ok\n"
			if err != nil || n < 0 || n >= s.nodes {
				msg = "no such node\n"
			} else if err := s.apply(n, strings.Fields(string(b))); err != nil {
				msg = err.Error() + "\n"
			}
			os.WriteFile(strings.TrimSuffix(q, ".req")+".tmp", []byte(msg), 0o644)
			os.Rename(strings.TrimSuffix(q, ".req")+".tmp", strings.TrimSuffix(q, ".req")+".done")
			os.Remove(q)
		}
		if k%5 == 0 {
			if st := s.stats(); st != last {
				last = st
				os.WriteFile(filepath.Join(s.clusDir, "switch.stats.tmp"), []byte(st), 0o644)
				os.Rename(filepath.Join(s.clusDir, "switch.stats.tmp"), filepath.Join(s.clusDir, "switch.stats"))
			}
		}
	}
}

// apply: "up", "down", "loss PCT".
func (s *netSwitch) apply(n int, f []string) error {
	switch {
	case len(f) == 1 && f[0] == "up":
		s.setDown(n, false)
		s.setLoss(n, 0)
	case len(f) == 1 && f[0] == "down":
		s.setDown(n, true)
	case len(f) == 2 && f[0] == "loss":
		p, err := strconv.ParseFloat(strings.TrimSuffix(f[1], "%"), 64)
		if err != nil || !(p >= 0 && p <= 100) { // NaN too: it would mean no loss
			return fmt.Errorf("loss wants a percentage 0..100, not %q", f[1])
		}
		s.setLoss(n, p)
	default:
		return fmt.Errorf("want up, down or loss PCT, not %q", strings.Join(f, " "))
	}
	return nil
}

// stats: one line per port, frames and bytes from and to the node.
func (s *netSwitch) stats() string {
	var b bytes.Buffer
	for _, seg := range s.segs {
		for i, p := range seg.ports {
			state := "up"
			if s.down[i].Load() {
				state = "down"
			}
			fmt.Fprintf(&b, "switch seg %d node %d: from-node %d frames %d bytes, to-node %d frames %d bytes, dropped %d, link %s loss %.2f%%\n",
				seg.d, i, p.rxFrames.Load(), p.rxBytes.Load(), p.txFrames.Load(), p.txBytes.Load(), p.dropped.Load(),
				state, float64(s.loss[i].Load())/1e4)
		}
	}
	return b.String()
}

func (s *netSwitch) close() {
	select {
	case <-s.done:
		return
	default:
	}
	close(s.done)
	for _, seg := range s.segs {
		for _, p := range seg.ports {
			p.conn.Close()
		}
	}
	s.wg.Wait()
}
