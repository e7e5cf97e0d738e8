// Package rxe is the userspace half of Soft-RoCE (the rdma_rxe kernel
// driver): its work and completion queues are rings in kernel memory mapped
// into the process, and its doorbell is a POST_SEND command with no work
// requests in it.
package rxe

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
)

// ring is one mapped rxe queue (struct rxe_queue_buf): a header with the
// element size and index mask, the producer index at byte 128, the consumer
// index at byte 256 and the elements from byte 384. Indices are stored masked.
type ring struct {
	mem      []byte // the mapping, owned by the queue that made it
	mask     uint32
	elemSize uintptr
	data     unsafe.Pointer
	prod     *uint32
	cons     *uint32
}

func newRing(mem []byte) (ring, error) {
	if len(mem) <= ioctl.RxeQueueBufOffData {
		return ring{}, fmt.Errorf("rxe: queue mapping of %d bytes is smaller than its header", len(mem))
	}
	hdr := (*ioctl.RxeQueueBuf)(unsafe.Pointer(&mem[0]))
	r := ring{
		mem:      mem,
		mask:     hdr.Index_mask,
		elemSize: uintptr(1) << hdr.Log2_elem_size,
		data:     unsafe.Pointer(&mem[ioctl.RxeQueueBufOffData]),
		prod:     (*uint32)(unsafe.Pointer(&mem[ioctl.RxeQueueBufOffProducer])),
		cons:     (*uint32)(unsafe.Pointer(&mem[ioctl.RxeQueueBufOffConsumer])),
	}
	need := uintptr(ioctl.RxeQueueBufOffData) + (uintptr(r.mask)+1)*r.elemSize
	if hdr.Log2_elem_size > 16 || uintptr(len(mem)) < need {
		return ring{}, fmt.Errorf("rxe: queue header (%d slots of %d bytes) does not fit its %d-byte mapping", r.mask+1, r.elemSize, len(mem))
	}
	return r, nil
}

func (r *ring) slot(i uint32) unsafe.Pointer {
	return unsafe.Add(r.data, uintptr(i&r.mask)*r.elemSize)
}

// free returns how many elements a producer may still add: one slot stays
// empty to tell a full ring from an empty one.
func (r *ring) free(prod uint32) uint32 {
	cons := atomic.LoadUint32(r.cons)
	return (cons - prod - 1) & r.mask
}
