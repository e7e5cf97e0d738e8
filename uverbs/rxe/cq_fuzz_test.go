package rxe

import (
	"encoding/binary"
	"testing"
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/uverbs/provider"
)

// fakeDevice hands out a byte slice as the "mapping" of a queue: the
// kernel's side of the ring, which the fuzzer controls.
type fakeDevice struct{ mem []byte }

func (d *fakeDevice) File() *ioctl.File { return nil }
func (d *fakeDevice) Mmap(off int64, n int) ([]byte, error) {
	return d.mem[:min(n, len(d.mem))], nil
}
func (d *fakeDevice) Munmap([]byte) error { return nil }

// alignedBuf returns n zero bytes aligned for the ring's atomics and the
// 8-byte fields of the completion entries, as an mmap would be.
func alignedBuf(n int) []byte {
	w := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), len(w)*8)[:n]
}

// FuzzCQPoll: the completion ring is memory the kernel writes (struct
// rxe_queue_buf: element size, index mask, producer and consumer indices,
// then ib_uverbs_wc entries). Attach must reject a header whose slots do
// not fit the mapping, and Poll must never read outside it or panic,
// whatever the header, the indices and the entries say.
func FuzzCQPoll(f *testing.F) {
	// A valid ring: 4 slots of 128 bytes, two completions waiting.
	data := make([]byte, 4*128)
	for i := range 2 {
		w := data[i*128:]
		binary.LittleEndian.PutUint64(w[0:], uint64(100+i)) // wr_id
		binary.LittleEndian.PutUint32(w[8:], 0)             // status
		binary.LittleEndian.PutUint32(w[20:], 64)           // byte_len
		binary.LittleEndian.PutUint32(w[28:], 17)           // qp_num
	}
	f.Add(uint32(7), uint32(3), uint32(2), uint32(0), data)
	f.Add(uint32(7), uint32(3), uint32(1), uint32(3), data) // wrapped
	f.Add(uint32(6), uint32(7), uint32(5), uint32(5), data) // empty, 64-byte slots
	f.Add(uint32(5), uint32(0), uint32(1), uint32(0), data) // slots smaller than a WC
	f.Fuzz(func(t *testing.T, log2, mask, prod, cons uint32, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		mem := alignedBuf(ioctl.RxeQueueBufOffData + len(data))
		binary.LittleEndian.PutUint32(mem[0:], log2)
		binary.LittleEndian.PutUint32(mem[4:], mask)
		binary.LittleEndian.PutUint32(mem[ioctl.RxeQueueBufOffProducer:], prod)
		binary.LittleEndian.PutUint32(mem[ioctl.RxeQueueBufOffConsumer:], cons)
		copy(mem[ioctl.RxeQueueBufOffData:], data)
		c := &cq{}
		c.resp.Mi.Size = uint32(len(mem))
		if err := c.Attach(&fakeDevice{mem: mem}, 1, 4); err != nil {
			return
		}
		// Every slot Poll can read lies inside the mapping.
		base := uintptr(unsafe.Pointer(&mem[0]))
		last := uintptr(c.r.slot(c.r.mask)) - base
		if last+ioctl.SizeofWC > uintptr(len(mem)) {
			t.Fatalf("accepted a ring (log2 elem %d, mask %#x) whose last slot ends at byte %d of a %d-byte mapping",
				log2, mask, last+ioctl.SizeofWC, len(mem))
		}
		wc := make([]provider.WC, 8)
		n := c.Poll(wc)
		if n < 0 || n > len(wc) {
			t.Fatalf("Poll returned %d for %d entries", n, len(wc))
		}
		c.Empty()
		c.Close()
	})
}
