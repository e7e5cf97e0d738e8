package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/mr"
	"github.com/goverbs/goverbs/qp"
	"github.com/goverbs/goverbs/uverbs"
	"github.com/goverbs/goverbs/wr"
)

// perfQP is one QP and its buffer: the first half is what we send (and
// where reads and atomics land), the second half what the peer writes,
// reads and sends into (after the GRH room on UD).
type perfQP struct {
	idx  int
	qp   *qp.QP
	mem  *mr.Memory
	mr   *mr.MR
	buf  []byte
	half int
	psn  uint32
	ah   *uverbs.AH
	rem  perfQPInfo
	// remQKey is the Q_Key of the peer's UD QP: perftest's 0x11111111, or
	// with -R the one rdma_cm gave it.
	remQKey uint32

	// Built once, reused by every post: the hot loops allocate nothing.
	sges []qp.SGE
	wrs  []qp.SendWR
	rsge []qp.SGE
	rwrs []qp.RecvWR

	scnt, ccnt   int // bw client: posted and completed sends
	lastSig      int // bw client: sends already covered by a completion
	posted, rcnt int // receives posted and completed this size
	need         int // receives to repost
}

type perfRun struct {
	o      *perfOptions
	client bool
	info   io.Writer // the report header: stdout, or stderr with --json

	ctx      *uverbs.Context
	pd       *uverbs.PD
	port     uverbs.PortAttr
	gid      uverbs.GID
	mtu      uverbs.MTU
	inline   int
	outReads int
	maxUD    int

	sendCQ, recvCQ *cq.CQ
	qps            []*perfQP
	wc             []cq.WC
	waitCtx        context.Context

	base       time.Time
	tposted    []int64
	tcompleted []int64

	// -R: the event channel and the test's rdma_cm IDs, which own the QPs.
	cmch  *cm.Channel
	cmIDs []*cm.ID
}

// now is the monotonic time in ns since base: time.Since reads the
// monotonic clock (vDSO) and allocates nothing.
func (r *perfRun) now() int64 { return int64(time.Since(r.base)) }

func (r *perfRun) close() {
	if r.cmch != nil {
		r.cmClose()
		r.cmch.Close()
	}
	if r.ctx != nil {
		r.ctx.Close() // destroys AHs, QPs, CQs, MRs and the PD, newest first
	}
	for _, q := range r.qps {
		if q.mem != nil {
			q.mem.Close()
		}
	}
}

// perfUnknownVendors are devices perftest 4.5's ib_dev_name does not know
// (rxe: 0xffffff; siw: 0x626d74): it disables inline data on them.
var perfUnknownVendors = map[uint32]string{0xffffff: "rxe", 0x626d74: "siw"}

// setup opens the device and builds CQs, QPs and buffers; QPs end in INIT
// (RC) or RTS (UD). With -R the QPs are left to cmConnect.
func (r *perfRun) setup(stderr io.Writer) error {
	if err := r.openDevice(stderr); err != nil {
		return err
	}
	if err := r.limits(stderr); err != nil {
		return err
	}
	if err := r.queues(); err != nil {
		return err
	}
	return r.buffers()
}

// openDevice opens -d (or the first ACTIVE device) and reads its port,
// the GID to use and the path MTU.
func (r *perfRun) openDevice(stderr io.Writer) error {
	o := r.o
	name, err := pickDevice(o.dev)
	if err != nil {
		return err
	}
	o.dev = name
	if r.ctx, err = uverbs.Open(name); err != nil {
		return fmt.Errorf("couldn't get context for %s: %v", name, err)
	}
	attr := r.ctx.Attr()
	if o.ibPort > int(attr.PhysPortCnt) {
		return usageError("-i %d: %s has ports 1..%d", o.ibPort, name, attr.PhysPortCnt)
	}
	if r.port, err = r.ctx.QueryPort(o.ibPort); err != nil {
		return fmt.Errorf("couldn't get port info: %v", err)
	}
	if o.gidx >= 0 {
		r.gid, err = r.ctx.GID(o.ibPort, o.gidx)
		if err != nil {
			return usageError("-x %d: %v", o.gidx, err)
		}
	} else if r.gid, err = r.ctx.DefaultGID(o.ibPort); err != nil {
		return fmt.Errorf("no -x given and no usable GID on %s port %d: %v", name, o.ibPort, err)
	}
	r.mtu = r.port.ActiveMTU
	if o.mtu != 0 {
		m, _ := uverbs.MTUFromBytes(o.mtu)
		if r.mtu >= uverbs.MTU256 && m > r.mtu {
			fmt.Fprintf(stderr, "goverbs perf: -m %d is above %s port %d's active MTU %d; using %d\n", o.mtu, name, o.ibPort, r.mtu.Bytes(), r.mtu.Bytes())
		} else {
			r.mtu = m
		}
	}
	return nil
}

// limits fits the sizes, inline data, outstanding reads and queue depths
// to the device, as perftest does.
func (r *perfRun) limits(stderr io.Writer) error {
	o, name, attr := r.o, r.o.dev, r.ctx.Attr()
	// Sizes against the device: UD messages fit the MTU (-a stops there,
	// as perftest's size_max_pow), and nothing exceeds the port's limit.
	if o.conn == "UD" {
		r.maxUD = r.mtu.Bytes()
		if o.all {
			s := o.sizes[:0]
			for _, n := range o.sizes {
				if n <= r.maxUD {
					s = append(s, n)
				}
			}
			o.sizes = s
		} else if o.size > r.maxUD {
			return usageError("-s %d: a UD message must fit the path MTU (%d bytes on %s port %d)", o.size, r.maxUD, name, o.ibPort)
		}
	}
	maxSize := o.sizes[len(o.sizes)-1]
	if r.port.MaxMsgSize != 0 && uint64(maxSize) > uint64(r.port.MaxMsgSize) {
		return usageError("-s %d: larger than %s port %d's max message size %d", maxSize, name, o.ibPort, r.port.MaxMsgSize)
	}
	// Inline data: perftest's defaults (ctx_set_max_inline).
	r.inline = o.inline
	if r.inline < 0 {
		r.inline = 0
		if _, unknown := perfUnknownVendors[attr.VendorID]; !unknown && !o.kind.bw {
			switch {
			case o.kind.verb == verbWrite:
				r.inline = 220
			case o.kind.verb == verbSend && o.conn == "UD":
				r.inline = 188
			case o.kind.verb == verbSend:
				r.inline = 236
			}
		}
	}
	// Outstanding reads and atomics: the device maximum by default.
	r.outReads = 1
	if o.kind.verb == verbRead || o.kind.verb == verbAtomic {
		r.outReads = min(int(attr.MaxQPRdAtom), int(attr.MaxQPInitRdAtom), 255)
		if r.outReads < 1 {
			r.outReads = 1
		}
		if o.outReads > r.outReads {
			fmt.Fprintf(stderr, "goverbs perf: -o %d is above the device's %d outstanding reads; using %d\n", o.outReads, r.outReads, r.outReads)
		} else if o.outReads > 0 {
			r.outReads = o.outReads
		}
	}
	if n := int(attr.MaxQPWR); n > 0 && (o.txDepth > n || o.rxDepth > n) {
		return usageError("-t %d / -r %d: %s takes at most %d work requests per queue", o.txDepth, o.rxDepth, name, n)
	}
	return nil
}

// queues makes the PD and the CQs.
func (r *perfRun) queues() error {
	o := r.o
	var err error
	if r.pd, err = r.ctx.AllocPD(); err != nil {
		return fmt.Errorf("couldn't allocate PD: %v", err)
	}
	copt := cq.Options{Events: o.events}
	nq := o.qps
	if r.sendCQ, err = cq.CreateWith(r.ctx, o.txDepth*nq+1, copt); err != nil {
		return fmt.Errorf("couldn't create send CQ: %v", err)
	}
	r.recvCQ = r.sendCQ
	if o.kind.verb == verbSend {
		if r.recvCQ, err = cq.CreateWith(r.ctx, o.rxDepth*nq+1, copt); err != nil {
			return fmt.Errorf("couldn't create receive CQ: %v", err)
		}
	}
	if o.events {
		r.waitCtx = context.Background()
	}
	r.wc = make([]cq.WC, 16)
	return nil
}

// buffers makes each QP's registered buffer (two halves: sends from the
// first, receives into the second), its QP (unless rdma_cm makes it) and
// its work requests.
func (r *perfRun) buffers() error {
	o := r.o
	maxSize := o.sizes[len(o.sizes)-1]
	nq := o.qps
	var err error
	grh := 0
	if o.conn == "UD" {
		grh = qp.GRHSize
	}
	// At least a page: perftest's RDMA steps through a cycle buffer of a
	// page from the address we give it.
	half := (max(maxSize+grh, 64, os.Getpagesize()) + 4095) &^ 4095
	typ := qp.RC
	if o.conn == "UD" {
		typ = qp.UD
	}
	access := mr.LocalWrite | mr.RemoteWrite | mr.RemoteRead | mr.RemoteAtomic
	for i := 0; i < nq; i++ {
		q := &perfQP{idx: i, half: half, psn: rand.Uint32() & 0xffffff, remQKey: perfQKey}
		r.qps = append(r.qps, q)
		if q.mem, err = mr.Alloc(2 * half); err != nil {
			return fmt.Errorf("couldn't allocate %d bytes: %v", 2*half, err)
		}
		q.buf = q.mem.Bytes()[:2*half]
		if q.mr, err = mr.Register(r.pd, q.buf, access); err != nil {
			return fmt.Errorf("couldn't register MR: %v", err)
		}
		// With -R, cmConnect makes the QPs on their rdma_cm IDs.
		if !o.rdmaCM {
			if q.qp, err = qp.Create(r.pd, r.qpConfig()); err != nil {
				return fmt.Errorf("couldn't create QP: %v", err)
			}
			if typ == qp.UD {
				err = q.qp.ToRTS(qp.UDOptions{Port: uint8(o.ibPort), QKey: perfQKey, PSN: q.psn})
			} else {
				err = q.qp.Init(uint8(o.ibPort), access)
			}
			if err != nil {
				return fmt.Errorf("couldn't bring the QP to %s: %v", map[bool]string{true: "RTS", false: "INIT"}[typ == qp.UD], err)
			}
		}
		// Receives land in the second half (behind the GRH room on UD).
		rs, err := q.mr.SGE(half, half)
		if err != nil {
			return err
		}
		q.rsge = []qp.SGE{rs}
		q.rwrs = make([]qp.RecvWR, o.rxDepth)
		for j := range q.rwrs {
			q.rwrs[j] = qp.RecvWR{ID: uint64(i), SGEs: q.rsge}
		}
		q.sges = make([]qp.SGE, o.postList)
		q.wrs = make([]qp.SendWR, o.postList)
	}
	return nil
}

func (r *perfRun) myInfo() []perfQPInfo {
	var lid uint16
	if r.port.LinkLayer != 2 {
		lid = r.port.LID
	}
	var out []perfQPInfo
	for _, q := range r.qps {
		out = append(out, perfQPInfo{LID: lid, QPN: q.qp.QPN(), PSN: q.psn, GID: r.gid.GID.To16(),
			Addr: q.mr.Addr() + uint64(q.half), RKey: q.mr.RKey(), MTU: r.mtu.Bytes()})
	}
	return out
}

// qpConfig is the test QPs' configuration.
func (r *perfRun) qpConfig() qp.Config {
	o := r.o
	typ := qp.RC
	if o.conn == "UD" {
		typ = qp.UD
	}
	return qp.Config{Type: typ, SendCQ: r.sendCQ, RecvCQ: r.recvCQ, MaxSendWR: uint32(o.txDepth),
		MaxRecvWR: uint32(o.rxDepth), MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: uint32(r.inline)}
}

// connect brings each QP to RTS towards its peer (RC), or makes the
// address handle (UD). With -R rdma_cm did both (cmConnect): the peer's
// addresses only give where RDMA goes.
func (r *perfRun) connect(rem []perfQPInfo) error {
	o := r.o
	if len(rem) != len(r.qps) {
		return fmt.Errorf("the peer has %d QPs, we have %d", len(rem), len(r.qps))
	}
	if o.rdmaCM {
		for i, q := range r.qps {
			qpn := q.rem.QPN
			q.rem = rem[i]
			if o.conn == "UD" {
				q.rem.QPN = qpn // from rdma_cm, as perftest's cma_master
			}
		}
		return nil
	}
	for i, q := range r.qps {
		q.rem = rem[i]
		if o.conn == "UD" {
			ah, err := r.pd.CreateAH(uverbs.AHAttr{Port: uint8(o.ibPort), DGID: rem[i].GID, DLID: rem[i].LID,
				SGIDIndex: uint8(r.gid.Index), UseSGID: true})
			if err != nil {
				return fmt.Errorf("couldn't create AH: %v", err)
			}
			q.ah = ah
			continue
		}
		mtu := r.mtu
		if rm, err := uverbs.MTUFromBytes(rem[i].MTU); err == nil && rm < mtu {
			mtu = rm
		}
		err := q.qp.Connect(qp.Remote{QPN: rem[i].QPN, PSN: rem[i].PSN, GID: rem[i].GID, LID: rem[i].LID},
			qp.ConnectOptions{Port: uint8(o.ibPort), GIDIndex: r.gid.Index, UseGID: true, MTU: mtu, PSN: q.psn,
				MaxRdAtomic: uint8(r.outReads), MaxDestRd: uint8(r.outReads)})
		if err != nil {
			return fmt.Errorf("couldn't connect QP %d: %v", i, err)
		}
	}
	return nil
}

// prepare builds the work requests for one message size.
func (r *perfRun) prepare(size int) error {
	o := r.o
	for _, q := range r.qps {
		q.scnt, q.ccnt, q.lastSig, q.posted, q.rcnt, q.need = 0, 0, 0, 0, 0, 0
		for j := range q.wrs {
			// Every WR of a post list sends from the same place; perftest
			// steps through a cycle buffer, which only matters for caches.
			s, err := q.mr.SGE(0, size)
			if err != nil {
				return err
			}
			q.sges[j] = s
			wr := qp.SendWR{ID: uint64(q.idx)<<32 | 1, SGEs: q.sges[j : j+1]}
			switch o.kind.verb {
			case verbSend:
				wr.Opcode = qp.OpSend
				if q.ah != nil {
					wr.AH, wr.RemoteQPN, wr.RemoteQKey = q.ah.Provider(), q.rem.QPN, q.remQKey
				}
			case verbWrite:
				wr.Opcode, wr.RemoteAddr, wr.RKey = qp.OpRDMAWrite, q.rem.Addr, q.rem.RKey
			case verbRead:
				wr.Opcode, wr.RemoteAddr, wr.RKey = qp.OpRDMARead, q.rem.Addr, q.rem.RKey
			case verbAtomic:
				wr.RemoteAddr, wr.RKey = q.rem.Addr, q.rem.RKey
				if o.atomic == "CMP_AND_SWAP" {
					wr.Opcode = qp.OpAtomicCmpAndSwp
				} else {
					wr.Opcode, wr.CompareAdd = qp.OpAtomicFetchAndAdd, 1
				}
			}
			if !o.kind.bw || (j+1)%o.cqMod == 0 {
				wr.Flags = qp.Signaled
				wr.ID = uint64(q.idx)<<32 | uint64(o.cqMod)
			}
			if size <= r.inline {
				wr.Flags |= qp.Inline
			}
			q.wrs[j] = wr
		}
		// write_lat: forget the last byte we sent at an earlier size. The
		// byte the peer writes is not cleared: perftest does not shake
		// hands between write_lat's sizes, so the peer's first write may
		// be here already (each size's last byte is a new one, zero until
		// then).
		q.buf[size-1] = 0
	}
	// Receives for this size: send_lat on both sides, send_bw on the server.
	// Each takes this size (and the GRH on UD), as perftest's: a peer that
	// sends more fails the receive rather than passes unnoticed.
	if o.kind.verb == verbSend && (!o.kind.bw || !r.client) {
		grh := 0
		if o.conn == "UD" {
			grh = qp.GRHSize
		}
		for _, q := range r.qps {
			rs, err := q.mr.SGE(q.half, size+grh)
			if err != nil {
				return err
			}
			q.rsge[0] = rs // q.rwrs share it
			if err := q.qp.PostRecv(q.rwrs); err != nil {
				return fmt.Errorf("couldn't post receives: %v", err)
			}
			q.posted = len(q.rwrs)
		}
	}
	n := o.iters * len(r.qps)
	if cap(r.tposted) < n {
		r.tposted = make([]int64, n)
		r.tcompleted = make([]int64, n)
	}
	r.tposted, r.tcompleted = r.tposted[:n], r.tcompleted[:n]
	clear(r.tposted)
	clear(r.tcompleted)
	return nil
}

// poll waits for one completion on c (busy polling, or sleeping on the
// CQ's events with -e) and checks it. It allocates nothing unless it fails.
// Busy polling gives up after perfStall without a completion: the peer is
// not running the same test (see stalled).
func (r *perfRun) poll(c *cq.CQ) (*cq.WC, error) {
	var since int64
	for spins := 0; ; spins++ {
		if spins&0xfff == 0xfff {
			if err := r.stalled(&since); err != nil {
				return nil, err
			}
		}
		n, err := c.Poll(r.wc[:1])
		if err != nil {
			return nil, fmt.Errorf("poll CQ failed: %v", err)
		}
		if n > 0 {
			w := &r.wc[0]
			if w.Status != wr.WCSuccess {
				return nil, fmt.Errorf("completion with error: %v (status %d, wr_id %#x, vendor_err %#x)", w.Status, uint32(w.Status), w.ID, w.VendorErr)
			}
			return w, nil
		}
		if r.waitCtx != nil {
			if err := c.Wait(r.waitCtx); err != nil {
				return nil, fmt.Errorf("waiting for a completion: %v", err)
			}
		}
	}
}

// stalled fails once perfStall has passed since *since (set on the first
// call). perftest's exchange does not carry the message size or the number
// of iterations, so a peer that disagrees on them shows as a latency loop
// that makes no progress: we say so rather than spin for ever.
func (r *perfRun) stalled(since *int64) error {
	now := r.now()
	if *since == 0 {
		*since = now
		return nil
	}
	if time.Duration(now-*since) > perfStall {
		return fmt.Errorf("no progress for %v: does the peer run the same test with the same -s, -n and -c?", perfStall)
	}
	return nil
}

// pollMany returns up to len(r.wc) completions, waiting for at least one
// with -e and returning 0 when there is none without.
func (r *perfRun) pollMany(c *cq.CQ) ([]cq.WC, error) {
	for {
		n, err := c.Poll(r.wc)
		if err != nil {
			return nil, fmt.Errorf("poll CQ failed: %v", err)
		}
		for i := 0; i < n; i++ {
			if w := &r.wc[i]; w.Status != wr.WCSuccess {
				return nil, fmt.Errorf("completion with error: %v (status %d, wr_id %#x, vendor_err %#x)", w.Status, uint32(w.Status), w.ID, w.VendorErr)
			}
		}
		if n > 0 || r.waitCtx == nil {
			return r.wc[:n], nil
		}
		if err := c.Wait(r.waitCtx); err != nil {
			return nil, fmt.Errorf("waiting for a completion: %v", err)
		}
	}
}

// sendLat is run_iter_lat_send: the client sends first, the server answers.
func (r *perfRun) sendLat() error {
	q := r.qps[0]
	iters, rx := r.o.iters, len(q.rwrs)
	scnt, rcnt := 0, 0
	for scnt < iters || rcnt < iters {
		if rcnt < iters && !(scnt < 1 && r.client) {
			if _, err := r.poll(r.recvCQ); err != nil {
				return err
			}
			rcnt++
			if rcnt+rx <= iters {
				if err := q.qp.PostRecv(q.rwrs[:1]); err != nil {
					return fmt.Errorf("couldn't post receive: rcnt=%d: %v", rcnt, err)
				}
			}
		}
		if scnt < iters {
			if err := r.sendOne(q, scnt); err != nil {
				return err
			}
			scnt++
		}
	}
	return nil
}

// sendOne is the send of sendLat and oneSidedLat: send i (from 0) of q
// stamped and posted, and its completion polled.
func (r *perfRun) sendOne(q *perfQP, i int) error {
	r.tposted[i] = r.now()
	if err := q.qp.PostSend(q.wrs[:1]); err != nil {
		return fmt.Errorf("couldn't post send: scnt=%d: %v", i+1, err)
	}
	_, err := r.poll(r.sendCQ)
	return err
}

var perfLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// loadByte reads b[off] with an atomic load of the aligned word holding
// it, so that the spin in writeLat sees the peer's RDMA write (a plain
// load could be hoisted out of the loop). b is outside the Go heap and
// page aligned.
func loadByte(b []byte, off int) byte {
	w := atomic.LoadUint32((*uint32)(unsafe.Pointer(&b[off&^3])))
	sh := uint(off & 3)
	if !perfLittleEndian {
		sh = 3 - sh
	}
	return byte(w >> (8 * sh))
}

// writeLat is run_iter_lat_write: both sides RDMA WRITE the iteration
// number into the last byte of the peer's buffer and spin on the last byte
// of their own; the client writes first.
func (r *perfRun) writeLat(size int) error {
	q := r.qps[0]
	iters := r.o.iters
	pollOff, postOff := q.half+size-1, size-1
	scnt, ccnt, rcnt := 0, 0, 0
	for scnt < iters || ccnt < iters || rcnt < iters {
		if rcnt < iters && !(scnt < 1 && !r.client) {
			rcnt++
			var since int64
			for spins := 0; loadByte(q.buf, pollOff) != byte(rcnt); spins++ {
				if spins&0xfff == 0xfff {
					if err := r.stalled(&since); err != nil {
						return fmt.Errorf("waiting for the peer's write %d: %v", rcnt, err)
					}
				}
			}
		}
		if scnt < iters {
			r.tposted[scnt] = r.now()
			scnt++
			q.buf[postOff] = byte(scnt)
			if err := q.qp.PostSend(q.wrs[:1]); err != nil {
				return fmt.Errorf("couldn't post send: scnt=%d: %v", scnt, err)
			}
		}
		if ccnt < iters {
			if _, err := r.poll(r.sendCQ); err != nil {
				return err
			}
			ccnt++
		}
	}
	return nil
}

// oneSidedLat is run_iter_lat: the client alone posts a READ or atomic
// and waits for its completion.
func (r *perfRun) oneSidedLat() error {
	q := r.qps[0]
	for scnt := 0; scnt < r.o.iters; scnt++ {
		if err := r.sendOne(q, scnt); err != nil {
			return err
		}
	}
	return nil
}

// bwClient is run_iter_bw: keep up to tx_depth sends in flight per QP,
// post_list at a time, every cq_mod-th (and the last) signaled; stamp each
// post and each completion. A completion's wr_id carries its QP index and
// how many sends it accounts for.
func (r *perfRun) bwClient() error {
	o := r.o
	iters, pl, tx, cqMod := o.iters, o.postList, o.txDepth, o.cqMod
	tot := iters * len(r.qps)
	noPeak := o.noPeak
	totS, totC := 0, 0
	if noPeak {
		r.tposted[0] = r.now()
	}
	for totS < tot || totC < tot {
		for _, q := range r.qps {
			for q.scnt < iters && q.scnt+pl <= tx+q.ccnt {
				if pl == 1 {
					w := &q.wrs[0]
					if (q.scnt+1)%cqMod == 0 || q.scnt == iters-1 {
						w.Flags |= qp.Signaled
						w.ID = uint64(q.idx)<<32 | uint64(q.scnt+1-q.lastSig)
						q.lastSig = q.scnt + 1
					} else {
						w.Flags &^= qp.Signaled
					}
				}
				if !noPeak {
					r.tposted[totS] = r.now()
				}
				if err := q.qp.PostSend(q.wrs); err != nil {
					return fmt.Errorf("couldn't post send: qp %d scnt=%d: %v", q.idx, q.scnt, err)
				}
				q.scnt += pl
				totS += pl
			}
		}
		if totC < tot {
			wcs, err := r.pollMany(r.sendCQ)
			if err != nil {
				return err
			}
			for i := range wcs {
				id := wcs[i].ID
				q := r.qps[int(id>>32)]
				fill := int(id & 0xffffffff)
				q.ccnt += fill
				totC += fill
				if !noPeak {
					r.tcompleted[min(totC, tot)-1] = r.now()
				}
			}
		}
	}
	if noPeak {
		r.tcompleted[0] = r.now()
	}
	return nil
}

// bwServer is run_iter_bw_server for send_bw: take the receives, repost
// them in one batch per QP and poll. It stamps the first and last receive.
func (r *perfRun) bwServer() error {
	iters := r.o.iters
	tot := iters * len(r.qps)
	first := true
	for totR := 0; totR < tot; {
		wcs, err := r.pollMany(r.recvCQ)
		if err != nil {
			return err
		}
		if len(wcs) == 0 {
			continue
		}
		if first {
			r.tposted[0] = r.now()
			first = false
		}
		for i := range wcs {
			q := r.qps[int(wcs[i].ID)]
			q.rcnt++
			q.need++
			totR++
		}
		for _, q := range r.qps {
			if k := min(q.need, iters-q.posted); k > 0 {
				if err := q.qp.PostRecv(q.rwrs[:k]); err != nil {
					return fmt.Errorf("couldn't post receives: qp %d: %v", q.idx, err)
				}
				q.posted += k
			}
			q.need = 0
		}
	}
	r.tcompleted[0] = r.now()
	return nil
}

// perfMain runs one side of a test: setup, then perftest's exchange
// (perf_xchg.go) and, for each size, the measured loop, with perftest's
// handshakes between the phases, test by test as perftest 4.5 does them.
func perfMain(o *perfOptions, stdout, stderr io.Writer) error {
	r := &perfRun{o: o, client: o.server != "", info: stdout}
	if o.json {
		r.info = stderr
	}
	defer r.close()
	link, err := r.openLink(stderr)
	if err != nil {
		return err
	}
	p := &ptConn{l: link, client: r.client, gid: r.port.LinkLayer == 2 || o.gidx >= 0, rdma: o.rdmaCM, gidx: r.gid.Index}
	defer p.Close()
	if err := r.perftestPrelude(p, stderr); err != nil {
		return err
	}
	if o.rdmaCM {
		if err := r.cmConnect(p); err != nil {
			return err
		}
	}
	s := &perfShake{r: r, p: p, my: r.myInfo()}
	if err := s.beforeMeasure(); err != nil {
		return err
	}
	r.printHeader(s.my, s.rem)
	rep := r.newReport()
	// A passive server (write_bw, read_*, atomic_*): the client does it
	// all; perftest's bw server prints the client's results, its latency
	// server none.
	k := o.kind
	if active := r.client || k.verb == verbSend || (!k.bw && k.verb == verbWrite); !active {
		return r.passive(s, &rep, stdout)
	}
	return r.active(s, &rep, stdout)
}

// printWaiting prints perftest's banner on a server that waits for its
// client.
func printWaiting(w io.Writer) {
	fmt.Fprintf(w, "\n************************************\n* Waiting for client to connect... *\n************************************\n")
}

// waiting prints the banner on a server.
func (r *perfRun) waiting() {
	if !r.client {
		printWaiting(r.info)
	}
}

// openLink sets up the verbs objects and the connection perftest's
// exchange runs on: TCP (to --server, or accepted on --port), or with
// --rdma_cm an rdma_cm connection made first, since rdma_cm picks the
// device.
func (r *perfRun) openLink(stderr io.Writer) (ptLink, error) {
	o := r.o
	if o.rdmaCM {
		r.waiting()
		l, err := r.perfCMExchange(stderr)
		if err != nil {
			return nil, err
		}
		if err := r.setup(stderr); err != nil {
			l.Close()
			return nil, err
		}
		return l, nil
	}
	if err := r.setup(stderr); err != nil {
		return nil, err
	}
	var pc *perfConn
	var err error
	if r.client {
		pc, err = perfDial(o.server, o.port)
	} else {
		r.waiting()
		pc, err = perfListen(o.port)
	}
	if err != nil {
		return nil, err
	}
	return &ptTCP{c: pc.c}, nil
}

// perfShake is perftest's handshakes over the exchange's connection:
// this side's QPs (my) and, after the first exchange of all, the peer's
// (rem).
type perfShake struct {
	r       *perfRun
	p       *ptConn
	my, rem []perfQPInfo
}

// one shakes once, with the first QP's information.
func (s *perfShake) one() error { _, err := s.p.handshake(s.my[0], s.r.outReads); return err }

// all shakes once per QP; the first time it keeps the peer's QPs.
func (s *perfShake) all() error {
	got := make([]perfQPInfo, len(s.my))
	for i := range s.my {
		a, err := s.p.handshake(s.my[i], s.r.outReads)
		if err != nil {
			return err
		}
		got[i] = a
	}
	if s.rem == nil {
		s.rem = got
	}
	return nil
}

// close is perftest's closing handshake.
func (s *perfShake) close() error { return s.p.closeConn(s.my[0], s.r.outReads) }

// beforeMeasure runs the handshakes before the measurement and connects
// the QPs: send_lat and send_bw shake once per QP, connect, then once
// more and once per QP again; the others shake once (latency tests
// only), once per QP, connect, once per QP and once more.
func (s *perfShake) beforeMeasure() error {
	connect := func() error { return s.r.connect(s.rem) }
	steps := []func() error{s.all, connect, s.one, s.all}
	if k := s.r.o.kind; k.verb != verbSend {
		steps = []func() error{s.one, s.all, connect, s.all, s.one}
		if k.bw {
			steps = steps[1:]
		}
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// passive is a passive server's part: it waits for the client's whole
// measurement and, in a bw test, prints the results the client gives it.
func (r *perfRun) passive(s *perfShake, rep *perfReport, stdout io.Writer) error {
	// The next step waits for the client's whole measurement.
	s.p.bound = r.measureBound()
	if r.o.kind.bw {
		if err := s.one(); err != nil {
			return err
		}
		peer, err := s.p.bwReport(perfBWResult{})
		if err != nil {
			return err
		}
		rep.MeasuredBy = "client"
		rep.Bandwidth = append(rep.Bandwidth, peer)
		if !r.o.json {
			rep.printLast(stdout)
		}
	}
	if err := s.close(); err != nil {
		return err
	}
	return r.finish(rep, stdout)
}

// active measures each size and ends the exchange as perftest does.
func (r *perfRun) active(s *perfShake, rep *perfReport, stdout io.Writer) error {
	o, k := r.o, r.o.kind
	sendTest := k.verb == verbSend
	stopProf, err := startCPUProfile(o.cpuprof)
	if err != nil {
		return err
	}
	defer stopProf()

	var last perfBWResult
	for _, size := range o.sizes {
		if err := r.prepare(size); err != nil {
			return err
		}
		// send_lat and send_bw shake after posting the receives, so that
		// no message comes before its receive.
		if sendTest {
			if err := s.one(); err != nil {
				return err
			}
		}
		if err := r.measure(size); err != nil {
			return err
		}
		r.result(size, rep)
		if k.bw {
			last = rep.Bandwidth[len(rep.Bandwidth)-1]
		}
		if !o.json {
			rep.printLast(stdout)
		}
		// send_bw shakes after each size of -a.
		if sendTest && k.bw && o.all {
			if err := s.one(); err != nil {
				return err
			}
		}
	}
	switch {
	case k.bw && !sendTest:
		// The client gives its results to the passive server.
		if err := s.one(); err != nil {
			return err
		}
		if _, err := s.p.bwReport(last); err != nil {
			return err
		}
		if err := s.close(); err != nil {
			return err
		}
	case !k.bw && k.verb == verbWrite:
		// write_lat ends without closing.
	default:
		if err := s.close(); err != nil {
			return err
		}
	}
	return r.finish(rep, stdout)
}

// measure runs one size's measurement: the test's loop, timed from
// r.base.
func (r *perfRun) measure(size int) error {
	k := r.o.kind
	r.base = time.Now()
	switch {
	case k.bw && !r.client:
		return r.bwServer()
	case k.bw:
		return r.bwClient()
	case k.verb == verbSend:
		return r.sendLat()
	case k.verb == verbWrite:
		return r.writeLat(size)
	default:
		return r.oneSidedLat()
	}
}

// measureBound is how long a passive side's exchange waits for the peer's
// measurement: perfStall, plus the measurement of every size at a floor of
// 1 ms per message and 1 MB/s (the guest's rxe, under TCG, does 20-40 us
// and about 30 MB/s), so that a peer gone silent is found out, late but
// surely.
func (r *perfRun) measureBound() time.Duration {
	o := r.o
	msgs := float64(o.iters) * float64(o.qps)
	d := float64(perfStall)
	for _, size := range o.sizes {
		d += msgs * (float64(time.Millisecond) + float64(size)*float64(time.Second)/1e6)
	}
	// In float64 and capped: -n 2^31-1 of -s 8 MiB is 1.8e19 ns, past
	// int64, whose wrap-around made the bound negative (and the exchange
	// then waited only perfStall for the whole measurement).
	if d >= float64(perfMaxBound) {
		return perfMaxBound
	}
	return time.Duration(d)
}

// perfMaxBound is measureBound's cap: a year, longer than any
// measurement a person waits for, and far inside time.Duration.
const perfMaxBound = 365 * 24 * time.Hour

func (r *perfRun) finish(rep *perfReport, stdout io.Writer) error {
	if r.o.json {
		return rep.writeJSON(stdout)
	}
	fmt.Fprint(stdout, perfLine)
	return nil
}

func gidString(g net.IP) string {
	g = g.To16()
	s := ""
	for i, b := range g {
		if i > 0 {
			s += ":"
		}
		s += fmt.Sprintf("%02d", b)
	}
	return s
}
