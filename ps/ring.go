package ps

import (
	"hash/fnv"
	"sort"
	"strconv"
)

// Ring places keys and dense tensor names on servers by consistent hashing
// with virtual nodes. A server's identity on the ring is its index in the
// server list ("server-0", ...), not its address, so a server restarted on
// another port keeps its keys.
type Ring struct {
	points []uint64
	owner  []int
	n      int
}

// DefaultVNodes is the number of virtual nodes per server.
const DefaultVNodes = 128

// MaxVNodes bounds the virtual nodes per server NewRing makes.
const MaxVNodes = 1 << 12

// MaxServers bounds the servers of a ring (and of a Client): a ring holds
// up to MaxServers*MaxVNodes points (4 Mi, 64 MiB).
const MaxServers = 1 << 10

// NewRing builds a ring of n servers, each at vnodes points (DefaultVNodes
// for 0 or less, at most MaxVNodes). A ring of no servers (n 0 or less)
// places every key on server 0, and so does the ring NewRing returns for
// n above MaxServers, which it refuses: its Servers() is 0, not n.
func NewRing(n, vnodes int) *Ring {
	if vnodes <= 0 {
		vnodes = DefaultVNodes
	}
	vnodes = min(vnodes, MaxVNodes)
	if n < 0 || n > MaxServers {
		n = 0
	}
	type pt struct {
		h uint64
		s int
	}
	pts := make([]pt, 0, n*vnodes)
	for s := range n {
		for v := range vnodes {
			pts = append(pts, pt{hashString("server-" + strconv.Itoa(s) + "#" + strconv.Itoa(v)), s})
		}
	}
	sort.Slice(pts, func(i, j int) bool { return pts[i].h < pts[j].h || pts[i].h == pts[j].h && pts[i].s < pts[j].s })
	r := &Ring{n: n, points: make([]uint64, len(pts)), owner: make([]int, len(pts))}
	for i, p := range pts {
		r.points[i], r.owner[i] = p.h, p.s
	}
	return r
}

// Servers is the number of servers (0 for a nil or zero Ring).
func (r *Ring) Servers() int {
	if r == nil {
		return 0
	}
	return r.n
}

func (r *Ring) lookup(h uint64) int {
	if r.n == 1 {
		return 0
	}
	i := sort.Search(len(r.points), func(i int) bool { return r.points[i] >= h })
	if i == len(r.points) {
		i = 0
	}
	return r.owner[i]
}

// Key returns the server of a sparse key of a table: 0 for a nil or zero
// Ring, or one of no servers.
func (r *Ring) Key(table string, key uint64) int {
	if r.bad() {
		return 0
	}
	return r.lookup(mix(key ^ hashString(table)))
}

// Tensor returns the server of a dense tensor: 0 for a nil or zero Ring,
// or one of no servers.
func (r *Ring) Tensor(name string) int {
	if r.bad() {
		return 0
	}
	return r.lookup(hashString(name))
}

func hashString(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return mix(h.Sum64())
}
