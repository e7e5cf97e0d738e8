package rxe

import (
	"encoding/binary"
	"strings"
	"testing"
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/uverbs/provider"
	gwr "github.com/goverbs/goverbs/wr" // (wr names work requests here)
)

// TestWriteSendMW checks the send WQE bytes of BIND_MW, LOCAL_INV and
// SEND_WITH_INV at the offsets of struct rxe_send_wr, as the kernel reads
// them: wr.mw {addr, length, mr_lkey, mw_rkey, rkey, access} from the
// union at wr.wr, and ex.invalidate_rkey in host order (where imm_data,
// sharing the union, is big endian).
func TestWriteSendMW(t *testing.T) {
	buf := alignedBuf(512)
	w := (*ioctl.RxeSendWqe)(unsafe.Pointer(&buf[0]))
	raw := func(off, n int) []byte { return buf[off : off+n] }
	u32 := func(off int) uint32 { return binary.LittleEndian.Uint32(raw(off, 4)) }
	u64 := func(off int) uint64 { return binary.LittleEndian.Uint64(raw(off, 8)) }
	q := &qp{typ: ioctl.IB_UVERBS_QPT_RC}

	// Stale bytes of an earlier WQE in the slot must not survive.
	for i := range buf {
		buf[i] = 0xa5
	}
	q.writeSend(w, &provider.SendWR{ID: 7, Opcode: gwr.OpBindMW, Flags: gwr.SendSignaled,
		Bind: provider.MWBind{MWRKey: 0x1234500, RKey: 0x1234511, LKey: 0x77, Access: 2, Addr: 0x7f0000001000, Length: 8192}})
	if got := u64(ioctl.RxeSendWqeOffWrID); got != 7 {
		t.Errorf("wr_id %d", got)
	}
	if got := u32(ioctl.RxeSendWqeOffOpcode); got != ioctl.IB_UVERBS_WR_BIND_MW {
		t.Errorf("opcode %d, want %d", got, ioctl.IB_UVERBS_WR_BIND_MW)
	}
	mw := ioctl.RxeSendWqeOffWr
	for _, f := range []struct {
		name      string
		got, want uint64
	}{
		{"addr", u64(mw), 0x7f0000001000},
		{"length", u64(mw + 8), 8192},
		{"mr_lkey", uint64(u32(mw + 16)), 0x77},
		{"mw_rkey", uint64(u32(mw + 20)), 0x1234500},
		{"rkey", uint64(u32(mw + 24)), 0x1234511},
		{"access", uint64(u32(mw + 28)), 2},
		{"dma.num_sge", uint64(w.Dma.Num_sge), 0},
		{"dma.length", uint64(w.Dma.Length), 0},
		{"state", uint64(w.State), 0},
	} {
		if f.got != f.want {
			t.Errorf("BIND_MW %s = %#x, want %#x", f.name, f.got, f.want)
		}
	}
	if off := unsafe.Offsetof(ioctl.RxeWrMW{}.Access); off != 28 {
		t.Errorf("wr.mw.access at %d", off)
	}

	for _, op := range []provider.Opcode{gwr.OpLocalInv, gwr.OpSendWithInv} {
		q.writeSend(w, &provider.SendWR{ID: 8, Opcode: op, InvRKey: 0xabcdef12, Imm: 0x11111111})
		if got := u32(ioctl.RxeSendWqeOffImm); got != 0xabcdef12 {
			t.Errorf("%v: ex.invalidate_rkey %#x, want 0xabcdef12 in host order", op, got)
		}
		if got := u32(ioctl.RxeSendWqeOffOpcode); got != uint32(op) {
			t.Errorf("%v: opcode %d", op, got)
		}
	}
	// Immediate data stays big endian.
	q.writeSend(w, &provider.SendWR{Opcode: gwr.OpSendWithImm, Imm: 0x01020304})
	if got := raw(ioctl.RxeSendWqeOffImm, 4); string(got) != "\x01\x02\x03\x04" {
		t.Errorf("imm_data bytes % x", got)
	}
}

// TestValidSendMW: what the provider refuses before the ring, per QP type.
func TestValidSendMW(t *testing.T) {
	good := provider.MWBind{MWRKey: 0x100, RKey: 0x105, LKey: 1, Access: ioctl.IB_UVERBS_ACCESS_REMOTE_WRITE, Addr: 0x1000, Length: 64}
	sge := []provider.SGE{{Addr: 0x1000, Length: 8, LKey: 1}}
	type qpt = uint32
	rc, uc, ud := qpt(ioctl.IB_UVERBS_QPT_RC), qpt(ioctl.IB_UVERBS_QPT_UC), qpt(ioctl.IB_UVERBS_QPT_UD)
	for _, tc := range []struct {
		name string
		typ  uint32
		wr   provider.SendWR
		want string // "" for accepted
	}{
		{"bind RC", rc, provider.SendWR{Opcode: gwr.OpBindMW, Bind: good}, ""},
		{"bind UC", uc, provider.SendWR{Opcode: gwr.OpBindMW, Bind: good}, ""},
		{"bind UD", ud, provider.SendWR{Opcode: gwr.OpBindMW, Bind: good}, "needs an RC or UC QP"},
		{"bind SGE", rc, provider.SendWR{Opcode: gwr.OpBindMW, Bind: good, SGEs: sge}, "no SGEs"},
		{"bind inline", rc, provider.SendWR{Opcode: gwr.OpBindMW, Bind: good, Flags: gwr.SendInline}, "cannot carry inline"},
		{"bind other index", rc, provider.SendWR{Opcode: gwr.OpBindMW, Bind: provider.MWBind{MWRKey: 0x100, RKey: 0x205, Access: 2, Length: 1}}, "names another window"},
		{"bind local write", rc, provider.SendWR{Opcode: gwr.OpBindMW, Bind: provider.MWBind{MWRKey: 0x100, RKey: 0x101, Access: 1, Length: 1}}, "only remote"},
		{"bind wraps", rc, provider.SendWR{Opcode: gwr.OpBindMW, Bind: provider.MWBind{MWRKey: 0x100, RKey: 0x101, Access: 2, Addr: ^uint64(0), Length: 2}}, "wraps"},
		{"local inv RC", rc, provider.SendWR{Opcode: gwr.OpLocalInv, InvRKey: 0x105}, ""},
		{"local inv UC", uc, provider.SendWR{Opcode: gwr.OpLocalInv, InvRKey: 0x105}, "needs an RC QP"},
		{"local inv SGE", rc, provider.SendWR{Opcode: gwr.OpLocalInv, SGEs: sge}, "no SGEs"},
		{"send inv RC", rc, provider.SendWR{Opcode: gwr.OpSendWithInv, SGEs: sge}, ""},
		{"send inv RC inline", rc, provider.SendWR{Opcode: gwr.OpSendWithInv, SGEs: sge, Flags: gwr.SendInline}, ""},
		{"send inv UD", ud, provider.SendWR{Opcode: gwr.OpSendWithInv, SGEs: sge}, "needs an RC QP"},
	} {
		q := &qp{typ: tc.typ, caps: provider.QPCaps{MaxSendSGE: 2, MaxInline: 64}}
		err := q.validSend(0, &tc.wr)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && err == nil:
			t.Errorf("%s: accepted", tc.name)
		case tc.want != "" && !strings.Contains(err.Error(), tc.want):
			t.Errorf("%s: error %q does not contain %q", tc.name, err, tc.want)
		}
	}
}

// TestPollWithInv: a receive completion of SEND_WITH_INV carries the
// invalidated rkey in the ex union in host order and IB_WC_WITH_INVALIDATE.
func TestPollWithInv(t *testing.T) {
	mem := alignedBuf(ioctl.RxeQueueBufOffData + 4*128)
	binary.LittleEndian.PutUint32(mem[0:], 7) // 128-byte slots
	binary.LittleEndian.PutUint32(mem[4:], 3)
	binary.LittleEndian.PutUint32(mem[ioctl.RxeQueueBufOffProducer:], 2)
	e := mem[ioctl.RxeQueueBufOffData:]
	wcOff := func(f string) int {
		switch f {
		case "ex":
			return int(unsafe.Offsetof(ioctl.WC{}.Ex))
		case "flags":
			return int(unsafe.Offsetof(ioctl.WC{}.Wc_flags))
		}
		return int(unsafe.Offsetof(ioctl.WC{}.Opcode))
	}
	binary.LittleEndian.PutUint32(e[wcOff("ex"):], 0x00abcd42)
	binary.LittleEndian.PutUint32(e[wcOff("flags"):], uint32(gwr.WCWithInv))
	binary.LittleEndian.PutUint32(e[wcOff("opcode"):], uint32(gwr.WCRecv))
	binary.BigEndian.PutUint32(e[128+wcOff("ex"):], 0xfeed)
	binary.LittleEndian.PutUint32(e[128+wcOff("flags"):], uint32(gwr.WCWithImm))
	c := &cq{}
	c.resp.Mi.Size = uint32(len(mem))
	if err := c.Attach(&fakeDevice{mem: mem}, 1, 4); err != nil {
		t.Fatal(err)
	}
	wc := make([]provider.WC, 4)
	for i := range wc {
		wc[i].InvRKey = 0xdead // stale values from an earlier poll
	}
	if n := c.Poll(wc); n != 2 {
		t.Fatalf("polled %d", n)
	}
	if wc[0].InvRKey != 0x00abcd42 || wc[0].Imm != 0 {
		t.Errorf("SEND_WITH_INV receive: InvRKey %#x Imm %#x", wc[0].InvRKey, wc[0].Imm)
	}
	if wc[1].InvRKey != 0 || wc[1].Imm != 0xfeed {
		t.Errorf("immediate receive: InvRKey %#x Imm %#x", wc[1].InvRKey, wc[1].Imm)
	}
}
