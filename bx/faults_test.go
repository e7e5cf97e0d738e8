package bx_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

func counters(t *testing.T, dev string) map[string]uint64 {
	t.Helper()
	dir := "/sys/class/infiniband/" + dev + "/ports/1/hw_counters/"
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("hw_counters of %s: %v", dev, err)
	}
	m := map[string]uint64{}
	for _, e := range ents {
		b, err := os.ReadFile(dir + e.Name())
		if err != nil {
			continue
		}
		v, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		m[e.Name()] = v
	}
	return m
}

// TestIncast: 32 senders push to one receiver whose receive capacity is
// small (4 buffers per sender). Credits keep every sender within the
// buffers posted for it: no RNR NAK, no retransmission for want of a
// buffer, every message delivered in order per stream.
func TestIncast(t *testing.T) {
	da, db := rxetest.Pair(t)
	const senders, msgs = 32, 60
	if testing.Short() {
		t.Skip("-short")
	}
	recv, err := bx.New(bx.Config{Device: db, Token: token, MaxPeers: senders, Credits: 4, Lanes: 1, MaxMessage: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	addr, err := recv.Listen("10.99.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, wd := hang.For(t, "", 120*time.Second) // a hang bound (no progress), not a speed bound
	var peers []*bx.Peer
	for range senders {
		e, err := bx.New(bx.Config{Device: da, Token: token, MaxPeers: 1, Credits: 4, Lanes: 1, MaxMessage: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		p, err := e.Dial(ctx, addr.String())
		if err != nil {
			t.Fatal(err)
		}
		peers = append(peers, p)
	}
	before := [2]map[string]uint64{counters(t, da), counters(t, db)}
	var wg sync.WaitGroup
	errs := make(chan error, senders*2)
	for i, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range msgs {
				if err := p.Stream(uint32(i)).Send(ctx, fmt.Appendf(nil, "%d/%d", i, k)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	// The receiver drains every sender's stream in order.
	index := map[uint64]int{}
	for i, p := range peers {
		index[p.Endpoint().ID()] = i
	}
	total := 0
	var mu sync.Mutex
	for range senders {
		p, err := recv.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		i, ok := index[p.ID()]
		if !ok {
			t.Fatalf("accepted an unknown peer %x", p.ID())
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := p.Stream(uint32(i))
			for k := range msgs {
				m, err := s.Recv(ctx)
				if err != nil {
					errs <- fmt.Errorf("stream %d message %d: %v", i, k, hang.Cause(ctx, err))
					return
				}
				if want := fmt.Sprintf("%d/%d", i, k); string(m.Data()) != want {
					errs <- fmt.Errorf("stream %d: got %q, want %q", i, m.Data(), want)
				}
				m.Release()
				mu.Lock()
				total++
				mu.Unlock()
				wd.Progress()
			}
		}()
	}
	wg.Wait()
	fatalErrs(t, errs)
	if total != senders*msgs {
		t.Fatalf("delivered %d messages, want %d", total, senders*msgs)
	}
	after := [2]map[string]uint64{counters(t, da), counters(t, db)}
	for i, dev := range []string{da, db} {
		for _, c := range []string{"rcvd_rnr_err", "send_rnr_err", "retry_rnr_exceeded_err", "rnr_nak_retry_err"} {
			if d := after[i][c] - before[i][c]; d != 0 {
				t.Errorf("%s %s rose by %d", dev, c, d)
			}
		}
		t.Logf("%s: sent_pkts +%d rcvd_pkts +%d retry +%d seq_err +%d", dev, after[i]["sent_pkts"]-before[i]["sent_pkts"],
			after[i]["rcvd_pkts"]-before[i]["rcvd_pkts"], after[i]["completer_retry_err"]-before[i]["completer_retry_err"],
			after[i]["rcvd_seq_err"]-before[i]["rcvd_seq_err"])
	}
	st, _, _ := recv.AllocatorStats()
	t.Logf("receiver: %d credit updates, eager pool %d bytes registered", recv.Stats().CreditUpdates.Load(), st.Registered)
}

// TestStalledReceiver: a receiver that never releases what it got stops
// returning credits; the sender blocks once they are spent and its context
// ends the wait cleanly.
func TestStalledReceiver(t *testing.T) {
	_, _, p, sp := pair(t, func(c *bx.Config) { c.Credits = 8 })
	ctx, _ := hang.For(t, "", 30*time.Second) // a hang bound (no progress), not a speed bound
	sent := 0
	for ; sent < 100; sent++ {
		// A send that has credits completes at once; one without
		// blocks. The bound tells them apart, so it scales with the
		// machine: a slow send must not pass for a blocked one.
		sctx, c := context.WithTimeout(ctx, hang.Scale(time.Second))
		err := p.Stream(1).Send(sctx, []byte("x"))
		c()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// 8 buffers: one kept for credit updates, the rest for data.
	if sent != 7 {
		t.Errorf("sent %d before blocking, want 7", sent)
	}
	// Releasing them lets the sender go on.
	for range sent {
		m, err := sp.Stream(1).Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m.Release()
	}
	if err := p.Stream(1).Send(ctx, []byte("after")); err != nil {
		t.Fatalf("send after the receiver caught up: %v", err)
	}
	m, err := sp.Stream(1).Recv(ctx)
	if err != nil || string(m.Data()) != "after" {
		t.Fatalf("got %v %v", m, err)
	}
	m.Release()
}

// TestForgedDescriptor: a peer that sends rendezvous messages it has no
// right to (a request above MaxMessage, a FIN for no rendezvous, a
// clear-to-send naming memory that is not its target or the wrong length)
// gets the connection closed with a protocol error by the side it tried to
// fool; memory is never exposed (a WRITE outside the peer's registered
// targets is refused by its QP).
func TestForgedDescriptor(t *testing.T) {
	for _, tc := range []struct {
		name string
		// forge sets up the forgery by the receiving side sp (before the
		// send) or makes the sending side p send it.
		forge func(p, sp *bx.Peer) error
		// large: p then sends a large message (its WRITE meets the forged
		// CTS).
		large bool
		// victimIsSender: p detects it, else sp does.
		victimIsSender bool
	}{
		{name: "request above MaxMessage", forge: func(p, _ *bx.Peer) error { return p.SendRndvForTest(1, 5<<20) }},
		{name: "FIN for no rendezvous", forge: func(p, _ *bx.Peer) error { return p.SendFinForTest(1, 12345) }},
		{name: "CTS with a bad rkey", large: true, victimIsSender: true, forge: func(_, sp *bx.Peer) error {
			sp.Endpoint().ForgeCTSForTest(func(_ *uint64, rkey, _ *uint32) { *rkey ^= 0xdead00 })
			return nil
		}},
		{name: "CTS outside the target pool", large: true, victimIsSender: true, forge: func(_, sp *bx.Peer) error {
			sp.Endpoint().ForgeCTSForTest(func(addr *uint64, _, _ *uint32) { *addr += 1 << 40 })
			return nil
		}},
		{name: "CTS of another length", large: true, victimIsSender: true, forge: func(_, sp *bx.Peer) error {
			sp.Endpoint().ForgeCTSForTest(func(_ *uint64, _, n *uint32) { *n-- })
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, p, sp := pair(t, nil)
			if err := tc.forge(p, sp); err != nil {
				t.Fatal(err)
			}
			if tc.large {
				ctx, _ := hang.For(t, "", 20*time.Second) // a hang bound (no progress), not a speed bound
				// The send itself succeeds (bx owns the buffer); the
				// failure shows when the WRITE or the CTS is checked.
				if err := p.Stream(1).Send(ctx, make([]byte, 100_000)); err != nil {
					t.Logf("send: %v", err)
				}
			}
			victim, forger := sp, p
			if tc.victimIsSender {
				victim, forger = p, sp
			}
			select {
			case <-victim.Done():
			case <-time.After(hang.Scale(20 * time.Second)):
				t.Fatalf("the victim kept a peer that forged a rendezvous message for %v (%s)", hang.Scale(20*time.Second), hang.How())
			}
			if err := victim.Err(); !errors.Is(err, bx.ErrProtocol) {
				t.Errorf("victim: %v, want ErrProtocol", err)
			}
			select {
			case <-forger.Done():
				t.Logf("forger sees: %v", forger.Err())
				// Told by the victim's bye (not by a failure of its own),
				// the forger learns why.
				if ferr := forger.Err().Error(); strings.Contains(ferr, "peer closed the connection") && !strings.Contains(ferr, victim.Err().Error()) {
					t.Errorf("forger sees %q, without the victim's reason %q", ferr, victim.Err())
				}
			case <-time.After(hang.Scale(20 * time.Second)):
				t.Errorf("the forging peer was not disconnected in %v (%s)", hang.Scale(20*time.Second), hang.How())
			}
		})
	}
}

// TestPacketLoss drops 5% of the packets on the veth under both devices
// (tc netem): RC retransmission and, if retries run out, bx recovery keep
// every message exactly once and in order, and every call returns once.
// With windows, RC retransmissions rewind send queues that hold BIND_MWs.
func TestPacketLoss(t *testing.T) {
	t.Run("region", func(t *testing.T) { packetLoss(t, shared) })
	t.Run("windows", func(t *testing.T) { packetLoss(t, windowsOn) })
}

func packetLoss(t *testing.T, mod func(*bx.Config)) {
	srv, _, p, sp := pair(t, mod)
	for _, dev := range []string{"v0", "v1"} {
		if out, err := exec.Command("tc", "qdisc", "add", "dev", dev, "root", "netem", "loss", "5%").CombinedOutput(); err != nil {
			t.Skipf("tc netem on %s: %v %s", dev, err, out)
		}
		defer exec.Command("tc", "qdisc", "del", "dev", dev, "root").Run()
	}
	srv.Handle(2, func(ctx context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		return append([]byte("re:"), req.Data()...), nil
	})
	ctx, wd := hang.For(t, "", 120*time.Second) // a hang bound (no progress), not a speed bound
	const n = 300
	errc := make(chan error, 4)
	// Large messages go by rendezvous (RDMA WRITE of ~100 packets each):
	// losses inside a WRITE are retransmitted by RC; every payload must
	// arrive intact, once, in order.
	const large = 12
	go func() {
		for i := range large {
			b := make([]byte, 100_000+i)
			for k := 8; k < len(b); k++ {
				b[k] = byte(k*7 + i)
			}
			binary.LittleEndian.PutUint32(b, uint32(i))
			binary.LittleEndian.PutUint32(b[4:], crc32.ChecksumIEEE(b[8:]))
			if err := p.Stream(6).Send(ctx, b); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	go func() {
		for i := range large {
			m, err := sp.Stream(6).Recv(ctx)
			if err != nil {
				errc <- fmt.Errorf("large message %d: %w", i, err)
				return
			}
			d := m.Data()
			switch {
			case len(d) != 100_000+i:
				errc <- fmt.Errorf("large message %d: %d bytes", i, len(d))
			case binary.LittleEndian.Uint32(d) != uint32(i):
				errc <- fmt.Errorf("large message %d carries index %d", i, binary.LittleEndian.Uint32(d))
			case crc32.ChecksumIEEE(d[8:]) != binary.LittleEndian.Uint32(d[4:]):
				errc <- fmt.Errorf("large message %d: payload corrupted", i)
			}
			m.Release()
			wd.Progress()
		}
		errc <- nil
	}()
	go func() {
		for i := range n {
			if err := p.Stream(5).Send(ctx, fmt.Appendf(nil, "%d", i)); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	go func() {
		for i := range 50 {
			m, err := p.Call(ctx, 2, fmt.Appendf(nil, "c%d", i))
			if err != nil {
				errc <- err
				return
			}
			if want := fmt.Sprintf("re:c%d", i); string(m.Data()) != want {
				errc <- fmt.Errorf("call %d answered %q", i, m.Data())
			}
			m.Release()
			wd.Progress()
		}
		errc <- nil
	}()
	for i := range n {
		m, err := sp.Stream(5).Recv(ctx)
		if err != nil {
			t.Fatalf("message %d: %v", i, hang.Cause(ctx, err))
		}
		wd.Progress()
		if want := fmt.Sprint(i); string(m.Data()) != want {
			t.Fatalf("message %d is %q", i, m.Data())
		}
		m.Release()
	}
	for range 4 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	c := counters(t, "rxe0")
	t.Logf("rxe0 after loss: completer_retry_err %d rcvd_seq_err %d; bx duplicates dropped %d, recoveries %d",
		c["completer_retry_err"], c["rcvd_seq_err"], sp.Endpoint().Stats().Duplicates.Load(), p.Endpoint().Stats().Recoveries.Load())
}
