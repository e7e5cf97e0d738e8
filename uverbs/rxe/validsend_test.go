package rxe

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/uverbs/provider"
	gwr "github.com/goverbs/goverbs/wr" // (wr names work requests here)
)

// TestValidSend: what the provider refuses before the ring for the post
// path's traps (SGE count, inline size and opcode, atomics, RDMA on the
// wrong QP type, UD without an AH, unknown opcodes), each error naming
// the request.
func TestValidSend(t *testing.T) {
	one := []provider.SGE{{Addr: 0x1000, Length: 8, LKey: 1}}
	three := []provider.SGE{one[0], one[0], one[0]}
	big := []provider.SGE{{Addr: 0x1000, Length: 65, LKey: 1}}
	type qpt = uint32
	rc, uc, ud := qpt(ioctl.IB_UVERBS_QPT_RC), qpt(ioctl.IB_UVERBS_QPT_UC), qpt(ioctl.IB_UVERBS_QPT_UD)
	for _, tc := range []struct {
		name string
		typ  uint32
		wr   provider.SendWR
		want string // "" for accepted
	}{
		{"send", rc, provider.SendWR{Opcode: gwr.OpSend, SGEs: one}, ""},
		{"too many SGEs", rc, provider.SendWR{Opcode: gwr.OpSend, SGEs: three}, "3 SGEs, the QP takes 2"},
		{"inline at max", rc, provider.SendWR{Opcode: gwr.OpSend, Flags: gwr.SendInline, SGEs: []provider.SGE{{Addr: 0x1000, Length: 64}}}, ""},
		{"inline over max", rc, provider.SendWR{Opcode: gwr.OpSend, Flags: gwr.SendInline, SGEs: big}, "65 bytes inline, the QP takes 64"},
		{"inline read", rc, provider.SendWR{Opcode: gwr.OpRDMARead, Flags: gwr.SendInline, SGEs: one}, "cannot carry inline"},
		{"inline atomic", rc, provider.SendWR{Opcode: gwr.OpAtomicFetchAndAdd, Flags: gwr.SendInline, SGEs: one}, "cannot carry inline"},
		{"SGE lengths overflow", rc, provider.SendWR{Opcode: gwr.OpSend, SGEs: []provider.SGE{{Length: 1 << 31}, {Length: 1 << 31}}}, "overflow"},
		{"write UD", ud, provider.SendWR{Opcode: gwr.OpRDMAWrite, SGEs: one, AH: &AH{}}, "not allowed"},
		{"read UC", uc, provider.SendWR{Opcode: gwr.OpRDMARead, SGEs: one}, "not allowed"},
		{"write UC", uc, provider.SendWR{Opcode: gwr.OpRDMAWriteWithImm, SGEs: one}, ""},
		{"atomic UC", uc, provider.SendWR{Opcode: gwr.OpAtomicCmpAndSwp, SGEs: one}, "need an RC QP"},
		{"atomic 4 bytes", rc, provider.SendWR{Opcode: gwr.OpAtomicCmpAndSwp, SGEs: []provider.SGE{{Length: 4}}}, "exactly one 8-byte SGE"},
		{"atomic no SGE", rc, provider.SendWR{Opcode: gwr.OpAtomicCmpAndSwp}, "exactly one 8-byte SGE"},
		{"atomic misaligned", rc, provider.SendWR{Opcode: gwr.OpAtomicFetchAndAdd, SGEs: one, RemoteAddr: 0x1004}, "not 8-byte aligned"},
		{"atomic", rc, provider.SendWR{Opcode: gwr.OpAtomicFetchAndAdd, SGEs: one, RemoteAddr: 0x1008}, ""},
		{"UD no AH", ud, provider.SendWR{Opcode: gwr.OpSend, SGEs: one}, "address handle"},
		{"UD AH without number", ud, provider.SendWR{Opcode: gwr.OpSend, SGEs: one, AH: &AH{}}, "address handle"},
		{"UD send", ud, provider.SendWR{Opcode: gwr.OpSendWithImm, SGEs: one, AH: &AH{resp: ioctl.RxeCreateAHResp{Num: 1}}}, ""},
		{"unknown opcode", rc, provider.SendWR{Opcode: 99, SGEs: one}, "not supported"},
	} {
		q := &qp{typ: tc.typ, caps: provider.QPCaps{MaxSendSGE: 2, MaxInline: 64}}
		err := q.validSend(3, &tc.wr)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && err == nil:
			t.Errorf("%s: accepted", tc.name)
		case tc.want != "" && (!strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "request 3")):
			t.Errorf("%s: error %q does not contain %q and the request's index", tc.name, err, tc.want)
		}
	}
}

// TestQueueSendBadNth: a batch whose last request is bad is refused
// whole: the producer index does not move and the good requests before
// it are not in the ring (rdma-core would post them and return bad_wr;
// goverbs posts none and names the request).
func TestQueueSendBadNth(t *testing.T) {
	const slots, slot = 4, 256
	mem := alignedBuf(ioctl.RxeQueueBufOffData + slots*slot)
	binary.LittleEndian.PutUint32(mem[0:], 8)       // log2 of 256-byte slots
	binary.LittleEndian.PutUint32(mem[4:], slots-1) // index mask
	r, err := newRing(mem)
	if err != nil {
		t.Fatal(err)
	}
	q := &qp{typ: ioctl.IB_UVERBS_QPT_RC, caps: provider.QPCaps{MaxSendSGE: 1}, sq: r}
	one := []provider.SGE{{Addr: 0x1000, Length: 8, LKey: 1}}
	wrs := []provider.SendWR{
		{ID: 10, Opcode: gwr.OpSend, SGEs: one},
		{ID: 11, Opcode: gwr.OpSend, SGEs: one},
		{ID: 12, Opcode: gwr.OpSend, SGEs: []provider.SGE{one[0], one[0]}},
	}
	err = q.QueueSend(wrs)
	if err == nil || !strings.Contains(err.Error(), "request 2 (id 12)") {
		t.Fatalf("batch with a bad third request: %v, want an error naming request 2 (id 12)", err)
	}
	if p := binary.LittleEndian.Uint32(mem[ioctl.RxeQueueBufOffProducer:]); p != 0 {
		t.Errorf("producer index %d after a refused batch, want 0", p)
	}
	for i, b := range mem[ioctl.RxeQueueBufOffData:] {
		if b != 0 {
			t.Fatalf("byte %d of the ring written by a refused batch", i)
		}
	}
	// The good part alone goes in.
	if err := q.QueueSend(wrs[:2]); err != nil {
		t.Fatal(err)
	}
	if p := binary.LittleEndian.Uint32(mem[ioctl.RxeQueueBufOffProducer:]); p != 2 {
		t.Errorf("producer index %d, want 2", p)
	}
	// A full queue (3 usable slots of 4) refuses the batch whole too.
	if err := q.QueueSend(wrs[:2]); err != provider.ErrQueueFull {
		t.Errorf("two more into one free slot: %v, want ErrQueueFull", err)
	}
}
