package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/cq"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
	"github.com/goverbs/goverbs/qp"
)

// TestPerfKeysCM pins the binary keys of -R to perftest's struct
// pingpong_dest as rdma_write_keys sends it on 64-bit Linux: big-endian
// ints, 4 bytes of padding before vaddr, the GID raw, gid_index last.
func TestPerfKeysCM(t *testing.T) {
	a := perfQPInfo{LID: 0x1234, QPN: 0xabcdef, PSN: 0x123456, RKey: 0xdeadbeef, Addr: 0x0102030405060708,
		GID: net.ParseIP("::ffff:10.99.0.2")}
	b := formatKeysCM(a, 128, 1)
	want, _ := hex.DecodeString("00001234" + "00000080" + "00abcdef" + "00123456" + "deadbeef" + "00000000" +
		"0102030405060708" + "00000000000000000000ffff0a630002" + "00000000" + "00000001")
	if !bytes.Equal(b, want) {
		t.Fatalf("formatKeysCM:\n got %x\nwant %x", b, want)
	}
	got := parseKeysCM(b)
	if got.LID != a.LID || got.QPN != a.QPN || got.PSN != a.PSN || got.RKey != a.RKey || got.Addr != a.Addr || !got.GID.Equal(a.GID) {
		t.Errorf("parseKeysCM(formatKeysCM(%+v)) = %+v", a, got)
	}
}

// silentCMPeer connects (client) or accepts (server) the exchange's
// rdma_cm connection with a QP of its own and then says nothing; it returns
// a function that tears it down.
func silentCMPeer(t *testing.T, id *cm.ID) func() {
	t.Helper()
	name, _, err := id.Device()
	if err != nil {
		t.Fatal(err)
	}
	ctx := rxetest.Open(t, name)
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	c, err := cq.Create(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := id.CreateQP(pd, qp.Config{SendCQ: c, RecvCQ: c, MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}); err != nil {
		t.Fatal(err)
	}
	return func() { id.Close() }
}

// TestPerfSilentPeerCM: with -R, a peer whose rdma_cm connection is made
// but who then says nothing (posts no receive, sends nothing) fails the
// versions step after perfStall, on either side.
func TestPerfSilentPeerCM(t *testing.T) {
	cli, srv := rxetest.Pair(t)
	host, gidx := serverTarget(t, srv)
	addr := netip.MustParseAddr(host)
	t.Run("client", func(t *testing.T) {
		port := perfPort
		perfPort++
		ch, lis, _, err := cmListen(cm.TCP, addr, uint16(port), 1)
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		bg := goverbsBG(t, "perf", "send_lat", "-R", "-d", cli, "-x", strconv.Itoa(gidx), "-p", strconv.Itoa(port), host)
		ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(30*time.Second))
		defer cancel()
		req, err := lis.GetRequest(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer silentCMPeer(t, req.ID)()
		if _, err := req.ID.Accept(ctx, cm.ConnParam{RetryCount: 7, RNRRetryCount: 7}); err != nil {
			t.Fatal(err)
		}
		r, took := bg.wait()
		checkSilentPeer(t, r, took)
	})
	t.Run("server", func(t *testing.T) {
		port := perfPort
		perfPort++
		bg := goverbsBG(t, "perf", "send_lat", "-R", "-d", srv, "-x", strconv.Itoa(gidx), "-p", strconv.Itoa(port))
		waitCMListenPort(t, port, bg.done)
		ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(30*time.Second))
		defer cancel()
		ch, id, err := cmResolve(ctx, cm.TCP, addr, uint16(port), netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		defer silentCMPeer(t, id)()
		if _, err := id.Connect(ctx, cm.ConnParam{RetryCount: 7, RNRRetryCount: 7}); err != nil {
			t.Fatal(err)
		}
		r, took := bg.wait()
		checkSilentPeer(t, r, took)
	})
}
