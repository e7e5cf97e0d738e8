package cm_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/qp"
)

// pollFor waits up to d for one completion on e's CQ.
func (e *end) pollFor(t *testing.T, d time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		n, err := e.cq.Poll(e.wc[:1])
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return true
		}
		time.Sleep(100 * time.Microsecond)
	}
	return false
}

// TestMulticast joins a group on rxe1 (QP made first) and on rxe0 (QP made
// after the join, attached by CreateQP), sends datagrams from rxe0 to the
// group and checks they arrive on rxe1 behind a GRH naming rxe0, and on
// rxe0 itself (multicast loopback of a member). After LeaveMulticast rxe1
// is no IGMP member and gets nothing while rxe0 still gets its copy; Close
// leaves rxe0's membership.
func TestMulticast(t *testing.T) {
	ctx, ch := cmSetup(t)
	group := netip.MustParseAddr("239.1.7.1")
	const qkey = 0x01234567
	const msgs = 3

	recv := boundID(t, ch, cm.UDP, addr1)
	r := newEnd(t, recv)
	for i := 0; i < 8; i++ {
		if err := r.qp.PostRecv([]qp.RecvWR{{ID: uint64(i), SGEs: []qp.SGE{must(r.mr.SGE(i*512, 512))}}}); err != nil {
			t.Fatal(err)
		}
	}
	if rxetest.IGMPMember(t, "v1", group) {
		t.Fatalf("v1 is a member of %v before the join", group)
	}
	start := time.Now()
	rm, err := recv.JoinMulticast(ctx, group, cm.JoinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	step(t, start, "rxe1 joined")
	wantMGID := net.ParseIP("::ffff:" + group.String())
	if rm.QPN != cm.MulticastQPN || rm.QKey != qkey || !rm.MGID().Equal(wantMGID) || rm.Addr != group {
		t.Fatalf("join: QPN %#x QKey %#x MGID %v addr %v; want %#x %#x %v %v", rm.QPN, rm.QKey, rm.MGID(), rm.Addr, cm.MulticastQPN, qkey, wantMGID, group)
	}
	t.Logf("group AH %+v, MLID %#x", rm.AH, rm.MLID)
	if !rxetest.IGMPMember(t, "v1", group) {
		t.Errorf("v1 is no IGMP member of %v after the join", group)
	}
	if _, err := recv.JoinMulticast(ctx, group, cm.JoinOptions{}); err == nil || !strings.Contains(err.Error(), "member already") {
		t.Errorf("second join of %v: %v", group, err)
	}

	send := boundID(t, ch, cm.UDP, addr0)
	sm, err := send.JoinMulticast(ctx, group, cm.JoinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := newEnd(t, send) // attached to the group by CreateQP
	for i := 0; i < 8; i++ {
		if err := s.qp.PostRecv([]qp.RecvWR{{ID: uint64(i), SGEs: []qp.SGE{must(s.mr.SGE(8192+i*512, 512))}}}); err != nil {
			t.Fatal(err)
		}
	}
	if got := send.Multicasts(); len(got) != 1 || got[0] != sm {
		t.Fatalf("sender's groups %v", got)
	}
	ah, err := s.pd.CreateAH(sm.AH)
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Close()
	sendOne := func(i int) {
		t.Helper()
		msg := fmt.Sprintf("multicast datagram %d", i)
		copy(s.mem.Bytes()[i*64:], msg)
		if err := s.qp.PostSend([]qp.SendWR{{ID: uint64(100 + i), Opcode: qp.OpSend, SGEs: []qp.SGE{must(s.mr.SGE(i*64, len(msg)))},
			AH: ah.Provider(), RemoteQPN: sm.QPN, RemoteQKey: sm.QKey}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < msgs; i++ {
		sendOne(i)
	}
	// rxe1 and rxe0 (loopback) each get every datagram.
	for _, x := range []struct {
		who  string
		e    *end
		base int
	}{{"rxe1", r, 0}, {"rxe0 (loopback)", s, 8192}} {
		for i := 0; i < msgs; i++ {
			wc := x.e.poll(t)
			msg := fmt.Sprintf("multicast datagram %d", i)
			off := x.base + int(wc.ID)*512
			if wc.Err() != nil || int(wc.ByteLen) != qp.GRHSize+len(msg) {
				t.Fatalf("%s: completion %+v (%v)", x.who, wc, wc.Err())
			}
			got := x.e.mem.Bytes()[off : off+qp.GRHSize+len(msg)]
			grh, err := qp.ParseGRH(got)
			if err != nil {
				t.Fatal(err)
			}
			if string(got[qp.GRHSize:]) != msg || !grh.SGID.Equal(net.ParseIP("::ffff:10.99.0.1")) || !grh.DGID.Equal(wantMGID) {
				t.Errorf("%s: datagram %d: %q from %v to %v", x.who, i, got[qp.GRHSize:], grh.SGID, grh.DGID)
			}
		}
	}
	step(t, start, fmt.Sprintf("%d datagrams arrived on both devices", msgs))

	if err := recv.LeaveMulticast(group); err != nil {
		t.Fatal(err)
	}
	if rxetest.IGMPMember(t, "v1", group) {
		t.Errorf("v1 is still an IGMP member of %v after the leave", group)
	}
	if err := recv.LeaveMulticast(group); !errors.Is(err, cm.ErrNotJoined) {
		t.Errorf("second leave: %v, want ErrNotJoined", err)
	}
	sendOne(msgs)
	if !s.pollFor(t, hang.Scale(20*time.Second)) {
		t.Fatal("rxe0 did not get its own datagram after rxe1 left")
	}
	// rxe0's copy arrived; rxe1's would come over the veth at about the
	// same time: give it a generous moment.
	if r.pollFor(t, 300*time.Millisecond) {
		t.Errorf("rxe1 received a datagram after leaving the group: %+v", r.wc[0])
	}
	if !rxetest.IGMPMember(t, "v0", group) {
		t.Errorf("v0 is no IGMP member of %v", group)
	}
	if err := send.Close(); err != nil {
		t.Fatal(err)
	}
	if rxetest.IGMPMember(t, "v0", group) {
		t.Errorf("v0 is still an IGMP member of %v after Close of the ID", group)
	}
	step(t, start, "left")
}

// TestMulticastBadInput: joins the kernel or the package refuse, leaving
// what was not joined, and Close (or a cancelled context) while a join
// waits; no group and no cm_id stays behind.
func TestMulticastBadInput(t *testing.T) {
	ctx, ch := cmSetup(t)
	group := netip.MustParseAddr("239.1.7.2")

	tcp := boundID(t, ch, cm.TCP, addr1)
	if _, err := tcp.JoinMulticast(ctx, group, cm.JoinOptions{}); err == nil || !strings.Contains(err.Error(), "UDP") {
		t.Errorf("join on a TCP ID: %v", err)
	} else {
		t.Log(err)
	}
	id := newID(t, ch, cm.UDP)
	if _, err := id.JoinMulticast(ctx, group, cm.JoinOptions{}); err == nil {
		t.Error("join on an unbound ID succeeded")
	} else {
		t.Log(err) // the kernel's EINVAL: the ID has no address
	}
	if err := id.Bind(netip.AddrPortFrom(addr1, 0)); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{addr0, netip.MustParseAddr("255.255.255.255"), netip.MustParseAddr("fe80::1"), {}} {
		if _, err := id.JoinMulticast(ctx, a, cm.JoinOptions{}); err == nil || !strings.Contains(err.Error(), "not a multicast address") {
			t.Errorf("join %v: %v", a, err)
		}
	}
	if err := id.LeaveMulticast(group); !errors.Is(err, cm.ErrNotJoined) {
		t.Errorf("leave of a group never joined: %v", err)
	}
	if len(id.Multicasts()) != 0 || rxetest.IGMPMember(t, "v1", group) {
		t.Fatalf("refused joins left groups: %v", id.Multicasts())
	}

	// A join whose context is already cancelled.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if m, err := id.JoinMulticast(cctx, group, cm.JoinOptions{}); err == nil {
		t.Logf("the join event beat the cancelled context; leaving %v", m)
		if err := id.LeaveMulticast(group); err != nil {
			t.Fatal(err)
		}
	} else if !errors.Is(err, context.Canceled) {
		t.Errorf("join with a cancelled context: %v", err)
	}
	if len(id.Multicasts()) != 0 || rxetest.IGMPMember(t, "v1", group) {
		t.Errorf("a cancelled join left the group behind: %v", id.Multicasts())
	}

	// Close while the join waits for its event.
	interrupted := 0
	for i := 0; i < 5; i++ {
		id, err := ch.CreateID(cm.UDP)
		if err != nil {
			t.Fatal(err)
		}
		if err := id.Bind(netip.AddrPortFrom(addr1, 0)); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := id.JoinMulticast(ctx, group, cm.JoinOptions{}); done <- err }()
		for len(id.Multicasts()) == 0 && len(done) == 0 {
			time.Sleep(50 * time.Microsecond)
		}
		if err := id.Close(); err != nil {
			t.Fatal(err)
		}
		err = <-done
		switch {
		case err == nil:
		case errors.Is(err, cm.ErrClosed):
			interrupted++
		default:
			t.Errorf("join across Close: %v", err)
		}
		if rxetest.IGMPMember(t, "v1", group) || len(id.Multicasts()) != 0 {
			t.Fatalf("Close during a join left the group %v behind", group)
		}
		if _, err := id.JoinMulticast(ctx, group, cm.JoinOptions{}); !errors.Is(err, cm.ErrClosed) {
			t.Errorf("join after Close: %v", err)
		}
	}
	t.Logf("%d of 5 joins were interrupted by Close, the others had completed", interrupted)
	if n := ch.IDs(); n != 2 {
		t.Errorf("%d IDs on the channel, want 2", n)
	}
}

// TestMulticastSendOnly: a send-only member (rxe0) makes no IGMP
// membership and its QP is not attached, yet its datagrams reach a full
// member (rxe1); rxe0 gets no copy of them.
func TestMulticastSendOnly(t *testing.T) {
	ctx, ch := cmSetup(t)
	group := netip.MustParseAddr("239.1.7.3")
	recv := boundID(t, ch, cm.UDP, addr1)
	r := newEnd(t, recv)
	if err := r.qp.PostRecv([]qp.RecvWR{{ID: 1, SGEs: []qp.SGE{must(r.mr.SGE(0, 512))}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := recv.JoinMulticast(ctx, group, cm.JoinOptions{}); err != nil {
		t.Fatal(err)
	}
	send := boundID(t, ch, cm.UDP, addr0)
	s := newEnd(t, send)
	if err := s.qp.PostRecv([]qp.RecvWR{{ID: 1, SGEs: []qp.SGE{must(s.mr.SGE(0, 512))}}}); err != nil {
		t.Fatal(err)
	}
	m, err := send.JoinMulticast(ctx, group, cm.JoinOptions{SendOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if !m.SendOnly || rxetest.IGMPMember(t, "v0", group) {
		t.Errorf("send-only join: SendOnly %v, v0 IGMP member %v", m.SendOnly, rxetest.IGMPMember(t, "v0", group))
	}
	ah, err := s.pd.CreateAH(m.AH)
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Close()
	msg := "send-only datagram"
	copy(s.mem.Bytes()[4096:], msg)
	if err := s.qp.PostSend([]qp.SendWR{{ID: 2, Opcode: qp.OpSend, Flags: qp.Signaled, SGEs: []qp.SGE{must(s.mr.SGE(4096, len(msg)))},
		AH: ah.Provider(), RemoteQPN: m.QPN, RemoteQKey: m.QKey}}); err != nil {
		t.Fatal(err)
	}
	if wc := s.poll(t); wc.Err() != nil || wc.ID != 2 {
		t.Fatalf("send completion %+v (%v)", wc, wc.Err())
	}
	wc := r.poll(t)
	if got := string(r.mem.Bytes()[qp.GRHSize : qp.GRHSize+len(msg)]); wc.Err() != nil || got != msg {
		t.Fatalf("rxe1 received %+v %q", wc, got)
	}
	if s.pollFor(t, 300*time.Millisecond) {
		t.Errorf("the send-only member received a datagram: %+v", s.wc[0])
	}
	if err := send.LeaveMulticast(group); err != nil {
		t.Fatal(err)
	}
}
