package ioctl

import (
	"encoding/binary"
	"fmt"
	"unsafe"
)

// MaxAttrs bounds the attributes of one call. The largest uverbs method of
// interest (QP_CREATE) takes 15 core attributes plus the two driver ones.
const MaxAttrs = 20

// Attribute flags (rdma_user_ioctl_cmds.h).
const (
	AttrMandatory   = UVERBS_ATTR_F_MANDATORY
	AttrValidOutput = UVERBS_ATTR_F_VALID_OUTPUT
)

// Driver-namespace attribute ids carrying the provider's private request and
// response ("udata").
const (
	AttrUHWIn  = UVERBS_ATTR_UHW_IN
	AttrUHWOut = UVERBS_ATTR_UHW_OUT
)

// callBuf is the memory the kernel reads: the header immediately followed by
// the attributes.
type callBuf struct {
	hdr   IoctlHdr
	attrs [MaxAttrs]Attr
}

// Call builds one RDMA_VERBS_IOCTL invocation. The zero value is not usable:
// start with NewCall or Reset. A Call keeps every buffer it was given alive
// until it is reset, so their addresses stay valid for the kernel.
//
// A Call is not safe for concurrent use.
type Call struct {
	buf  callBuf
	keep [MaxAttrs]unsafe.Pointer
	err  error
}

// NewCall starts a call of method on object for the given driver id (the
// kernel rejects a driver id that is not the device's with EINVAL).
func NewCall(object, method uint16, driverID uint32) *Call {
	c := new(Call)
	c.Reset(object, method, driverID)
	return c
}

// Reset clears c for a new call.
func (c *Call) Reset(object, method uint16, driverID uint32) {
	*c = Call{}
	c.buf.hdr.Object_id = object
	c.buf.hdr.Method_id = method
	c.buf.hdr.Driver_id = driverID
}

// Object and Method name the call, for errors.
func (c *Call) Object() uint16 { return c.buf.hdr.Object_id }

// Method returns the method id of the call.
func (c *Call) Method() uint16 { return c.buf.hdr.Method_id }

// add appends an attribute and returns its index, or -1 when the call
// already failed to encode (see Err).
func (c *Call) add(id uint16, length int, flags uint16, data uint64, keep unsafe.Pointer) int {
	n := int(c.buf.hdr.Num_attrs)
	if c.err != nil {
		return -1
	}
	if n == MaxAttrs {
		c.err = fmt.Errorf("ioctl: more than %d attributes in one call", MaxAttrs)
		return -1
	}
	if length < 0 || length > 0xffff {
		c.err = fmt.Errorf("ioctl: attribute %#x: length %d out of range 0..65535", id, length)
		return -1
	}
	c.buf.attrs[n] = Attr{Attr_id: id, Len: uint16(length), Flags: flags, Data: data}
	c.keep[n] = keep
	c.buf.hdr.Num_attrs++
	return n
}

// InU64 adds an input attribute of 8 bytes, carried inline.
func (c *Call) InU64(id uint16, v uint64) int { return c.add(id, 8, AttrMandatory, v, nil) }

// InU32 adds an input attribute of 4 bytes, carried inline.
func (c *Call) InU32(id uint16, v uint32) int { return c.add(id, 4, AttrMandatory, uint64(v), nil) }

// InConst adds an enum or const input. The kernel wants these 8 bytes long
// whatever their C type (a port number of length 1 gives EINVAL).
func (c *Call) InConst(id uint16, v uint64) int { return c.add(id, 8, AttrMandatory, v, nil) }

// InIDR adds an existing object handle.
func (c *Call) InIDR(id uint16, handle uint32) int {
	return c.add(id, 0, AttrMandatory, uint64(handle), nil)
}

// NewIDR adds the attribute in which the kernel returns the handle of the
// object the call creates; read it with Data after Do.
func (c *Call) NewIDR(id uint16) int { return c.add(id, 0, AttrMandatory, 0, nil) }

// InFD adds a file descriptor (completion channel, async event fd).
func (c *Call) InFD(id uint16, fd int) int {
	return c.add(id, 0, AttrMandatory, uint64(uint32(int32(fd))), nil)
}

// InBytes adds an input blob. Up to 8 bytes travel inline in the data field;
// a pointer there would be silently misread as the value. Longer ones pass a
// pointer to p, which must not be modified until the call is done.
func (c *Call) InBytes(id uint16, p []byte, flags uint16) int {
	if len(p) <= 8 {
		var v [8]byte
		copy(v[:], p)
		return c.add(id, len(p), flags, binary.NativeEndian.Uint64(v[:]), nil)
	}
	return c.add(id, len(p), flags, uint64(uintptr(unsafe.Pointer(&p[0]))), unsafe.Pointer(&p[0]))
}

// InPtr adds an input struct of size bytes at p (inline when size <= 8).
func (c *Call) InPtr(id uint16, p unsafe.Pointer, size int, flags uint16) int {
	if size == 0 {
		return c.add(id, 0, flags, 0, nil)
	}
	return c.InBytes(id, unsafe.Slice((*byte)(p), size), flags)
}

// Out adds an output buffer of size bytes at p. The kernel writes it and
// marks the attribute with AttrValidOutput.
func (c *Call) Out(id uint16, p unsafe.Pointer, size int, flags uint16) int {
	if size == 0 || p == nil {
		return c.add(id, 0, flags, 0, nil)
	}
	return c.add(id, size, flags, uint64(uintptr(p)), p)
}

// OutBytes adds an output buffer.
func (c *Call) OutBytes(id uint16, p []byte, flags uint16) int {
	if len(p) == 0 {
		return c.add(id, 0, flags, 0, nil)
	}
	return c.Out(id, unsafe.Pointer(&p[0]), len(p), flags)
}

// Data returns the data field of attribute i after the call: the new handle
// of a NewIDR attribute. An index that names no attribute gives 0.
func (c *Call) Data(i int) uint64 {
	if i < 0 || i >= int(c.buf.hdr.Num_attrs) {
		return 0
	}
	return c.buf.attrs[i].Data
}

// Flags returns the flags of attribute i after the call, or 0.
func (c *Call) Flags(i int) uint16 {
	if i < 0 || i >= int(c.buf.hdr.Num_attrs) {
		return 0
	}
	return c.buf.attrs[i].Flags
}

// Err reports an encoding error (too many attributes, oversized blob).
func (c *Call) Err() error { return c.err }

// Encoded returns the bytes the kernel would read: header and attributes.
// Pointers appear as they are; tests replace them before comparing.
func (c *Call) Encoded() []byte {
	c.buf.hdr.Length = uint16(SizeofIoctlHdr + SizeofAttr*int(c.buf.hdr.Num_attrs))
	b := unsafe.Slice((*byte)(unsafe.Pointer(&c.buf)), int(c.buf.hdr.Length))
	return append([]byte(nil), b...)
}
