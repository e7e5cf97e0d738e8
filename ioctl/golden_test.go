package ioctl_test

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
)

var update = flag.Bool("update", false, "rewrite ioctl/testdata/*.golden from the current encodings")

// ptr names a buffer the test handed to the builder. Its address differs per
// run, so the dump replaces it with a placeholder: the i-th pointer of a test
// becomes 0x5050505050505050 + i*0x0101010101010101.
type ptr struct {
	name string
	p    unsafe.Pointer
}

func placeholder(i int) uint64 { return 0x5050505050505050 + uint64(i)*0x0101010101010101 }

func hexBytes(b []byte) string {
	var s strings.Builder
	for i, c := range b {
		if i > 0 {
			s.WriteByte(' ')
		}
		fmt.Fprintf(&s, "%02x", c)
	}
	return s.String()
}

// renderCall turns the bytes of an RDMA_VERBS_IOCTL argument into a readable
// dump: the 24-byte header on one line, then one line per 16-byte attribute,
// each followed by its decoding. Attribute data equal to one of ptrs is
// replaced by that pointer's placeholder (in the bytes too) and named.
func renderCall(t *testing.T, title string, enc []byte, ptrs []ptr) string {
	t.Helper()
	enc = append([]byte(nil), enc...)
	var s strings.Builder
	fmt.Fprintf(&s, "# %s\n", title)
	for i, p := range ptrs {
		fmt.Fprintf(&s, "# pointer %s -> %#016x\n", p.name, placeholder(i))
	}
	if len(enc) < ioctl.SizeofIoctlHdr {
		t.Fatalf("%s: encoding of %d bytes is shorter than the header", title, len(enc))
	}
	ne := binary.NativeEndian
	h := enc[:ioctl.SizeofIoctlHdr]
	fmt.Fprintf(&s, "hdr     %s\n", hexBytes(h))
	fmt.Fprintf(&s, "        # length=%d object=%#x method=%#x num_attrs=%d reserved1=%#x driver_id=%d reserved2=%#x\n",
		ne.Uint16(h[0:]), ne.Uint16(h[2:]), ne.Uint16(h[4:]), ne.Uint16(h[6:]), ne.Uint64(h[8:]), ne.Uint32(h[16:]), ne.Uint32(h[20:]))
	rest := enc[ioctl.SizeofIoctlHdr:]
	if len(rest)%ioctl.SizeofAttr != 0 {
		t.Fatalf("%s: %d bytes of attributes is not a multiple of %d", title, len(rest), ioctl.SizeofAttr)
	}
	for i := 0; len(rest) > 0; i++ {
		a := rest[:ioctl.SizeofAttr]
		rest = rest[ioctl.SizeofAttr:]
		data := fmt.Sprintf("%#x", ne.Uint64(a[8:]))
		for j, p := range ptrs {
			if ne.Uint64(a[8:]) == uint64(uintptr(p.p)) {
				ne.PutUint64(a[8:], placeholder(j))
				data = "&" + p.name
				break
			}
		}
		fmt.Fprintf(&s, "attr%-3d %s\n", i, hexBytes(a))
		fmt.Fprintf(&s, "        # id=%#x len=%d flags=%#x attr_data=%#x data=%s\n",
			ne.Uint16(a[0:]), ne.Uint16(a[2:]), ne.Uint16(a[4:]), ne.Uint16(a[6:]), data)
	}
	return s.String()
}

// renderWrite dumps the bytes of a legacy write(): the 8-byte command header,
// then the core request and the driver data in 16-byte lines. The response
// pointer (first 8 bytes of the request) is replaced by placeholder(0) when
// it equals resp.
func renderWrite(t *testing.T, title string, buf []byte, coreLen int, resp unsafe.Pointer) string {
	t.Helper()
	buf = append([]byte(nil), buf...)
	ne := binary.NativeEndian
	var s strings.Builder
	fmt.Fprintf(&s, "# %s\n", title)
	if resp != nil {
		fmt.Fprintf(&s, "# pointer resp -> %#016x\n", placeholder(0))
		if len(buf) >= ioctl.SizeofCmdHdr+8 && ne.Uint64(buf[ioctl.SizeofCmdHdr:]) == uint64(uintptr(resp)) {
			ne.PutUint64(buf[ioctl.SizeofCmdHdr:], placeholder(0))
		}
	}
	if len(buf) < ioctl.SizeofCmdHdr {
		t.Fatalf("%s: write of %d bytes is shorter than the command header", title, len(buf))
	}
	fmt.Fprintf(&s, "cmdhdr    %s\n", hexBytes(buf[:ioctl.SizeofCmdHdr]))
	fmt.Fprintf(&s, "          # command=%#x in_words=%d out_words=%d (write of %d bytes)\n",
		ne.Uint32(buf[0:]), ne.Uint16(buf[4:]), ne.Uint16(buf[6:]), len(buf))
	region := func(name string, b []byte) {
		for off := 0; off < len(b); off += 16 {
			end := min(off+16, len(b))
			fmt.Fprintf(&s, "%-4s+%03x  %s\n", name, off, hexBytes(b[off:end]))
		}
	}
	body := buf[ioctl.SizeofCmdHdr:]
	coreLen = min(coreLen, len(body))
	region("core", body[:coreLen])
	region("drv", body[coreLen:])
	return s.String()
}

// golden compares got with testdata/name.golden, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run `go test ./ioctl -update` to create it)", err)
	}
	if !bytes.Equal(want, []byte(got)) {
		t.Errorf("encoding differs from %s (if the change is intended, run `go test ./ioctl -update`)\n--- want\n%s--- got\n%s", path, want, got)
	}
}

// attr is one decoded ib_uverbs_attr.
type attr struct {
	id, len, flags, attrData uint16
	data                     uint64
}

type decoded struct {
	length, object, method, numAttrs uint16
	reserved1                        uint64
	driverID, reserved2              uint32
	attrs                            []attr
}

func decode(t *testing.T, enc []byte) decoded {
	t.Helper()
	ne := binary.NativeEndian
	d := decoded{
		length: ne.Uint16(enc[0:]), object: ne.Uint16(enc[2:]), method: ne.Uint16(enc[4:]),
		numAttrs: ne.Uint16(enc[6:]), reserved1: ne.Uint64(enc[8:]),
		driverID: ne.Uint32(enc[16:]), reserved2: ne.Uint32(enc[20:]),
	}
	for a := enc[ioctl.SizeofIoctlHdr:]; len(a) >= ioctl.SizeofAttr; a = a[ioctl.SizeofAttr:] {
		d.attrs = append(d.attrs, attr{ne.Uint16(a[0:]), ne.Uint16(a[2:]), ne.Uint16(a[4:]), ne.Uint16(a[6:]), ne.Uint64(a[8:])})
	}
	return d
}

// checkFraming asserts the rules every call obeys.
func checkFraming(t *testing.T, c *ioctl.Call, driverID uint32) decoded {
	t.Helper()
	enc := c.Encoded()
	d := decode(t, enc)
	// Rule (uverbs-abi.md, "Verified by experiment"): hdr.length must be
	// exactly 24 + 16*num_attrs; rounding up gives EINVAL.
	if want := 24 + 16*int(d.numAttrs); int(d.length) != want || len(enc) != want {
		t.Errorf("hdr.length = %d, encoded %d bytes; kernel rule: length == 24 + 16*num_attrs = %d", d.length, len(enc), want)
	}
	if len(d.attrs) != int(d.numAttrs) {
		t.Errorf("num_attrs = %d but %d attributes encoded", d.numAttrs, len(d.attrs))
	}
	// Rule: driver_id must be the device's driver (mismatch: EINVAL).
	if d.driverID != driverID {
		t.Errorf("driver_id = %d, want %d (the Call's driver id)", d.driverID, driverID)
	}
	if d.reserved1 != 0 || d.reserved2 != 0 {
		t.Errorf("reserved header fields must be zero: reserved1=%#x reserved2=%#x", d.reserved1, d.reserved2)
	}
	if d.object != c.Object() || d.method != c.Method() {
		t.Errorf("object/method = %#x/%#x, Call says %#x/%#x", d.object, d.method, c.Object(), c.Method())
	}
	for i, a := range d.attrs {
		if a.attrData != 0 {
			t.Errorf("attr %d (id %#x): attr_data (reserved) = %#x, must be 0", i, a.id, a.attrData)
		}
		if a.flags&^ioctl.AttrMandatory != 0 {
			t.Errorf("attr %d (id %#x): flags %#x: only UVERBS_ATTR_F_MANDATORY may be set on input", i, a.id, a.flags)
		}
		if int(c.Flags(i)) != int(a.flags) || c.Data(i) != a.data {
			t.Errorf("attr %d: Flags/Data accessors disagree with the encoding", i)
		}
	}
	if c.Err() != nil {
		t.Errorf("Err() = %v", c.Err())
	}
	return d
}

// wantAttr checks one attribute and names the kernel rule it encodes.
func wantAttr(t *testing.T, d decoded, i int, id, length, flags uint16, data uint64, rule string) {
	t.Helper()
	if i >= len(d.attrs) {
		t.Errorf("attr %d missing (%s)", i, rule)
		return
	}
	a := d.attrs[i]
	if a.id != id || a.len != length || a.flags != flags || a.data != data {
		t.Errorf("attr %d = {id %#x len %d flags %#x data %#x}, want {id %#x len %d flags %#x data %#x}: %s",
			i, a.id, a.len, a.flags, a.data, id, length, flags, data, rule)
	}
}

func addr(p unsafe.Pointer) uint64 { return uint64(uintptr(p)) }

const rxe = ioctl.RDMA_DRIVER_RXE

func TestGoldenGetContext(t *testing.T) {
	var nvecs uint32
	var support uint64
	c := ioctl.NewCall(ioctl.UVERBS_OBJECT_DEVICE, ioctl.UVERBS_METHOD_GET_CONTEXT, rxe)
	c.Out(ioctl.UVERBS_ATTR_GET_CONTEXT_NUM_COMP_VECTORS, unsafe.Pointer(&nvecs), 4, 0)
	c.Out(ioctl.UVERBS_ATTR_GET_CONTEXT_CORE_SUPPORT, unsafe.Pointer(&support), 8, 0)
	d := checkFraming(t, c, rxe)
	if d.object != 0 || d.method != 3 {
		t.Errorf("GET_CONTEXT is object 0 method 3, got %d/%d", d.object, d.method)
	}
	const rule = "outputs always pass a pointer, even of <= 8 bytes"
	wantAttr(t, d, 0, ioctl.UVERBS_ATTR_GET_CONTEXT_NUM_COMP_VECTORS, 4, 0, addr(unsafe.Pointer(&nvecs)), rule)
	wantAttr(t, d, 1, ioctl.UVERBS_ATTR_GET_CONTEXT_CORE_SUPPORT, 8, 0, addr(unsafe.Pointer(&support)), rule)
	golden(t, "get_context", renderCall(t, "GET_CONTEXT: NUM_COMP_VECTORS (u32 out) and CORE_SUPPORT (u64 out)", c.Encoded(),
		[]ptr{{"nvecs", unsafe.Pointer(&nvecs)}, {"support", unsafe.Pointer(&support)}}))
}

func TestGoldenQueryPort(t *testing.T) {
	var r ioctl.QueryPortRespEx
	c := ioctl.NewCall(ioctl.UVERBS_OBJECT_DEVICE, ioctl.UVERBS_METHOD_QUERY_PORT, rxe)
	c.InConst(ioctl.UVERBS_ATTR_QUERY_PORT_PORT_NUM, 1)
	c.Out(ioctl.UVERBS_ATTR_QUERY_PORT_RESP, unsafe.Pointer(&r), ioctl.SizeofQueryPortRespEx, ioctl.AttrMandatory)
	d := checkFraming(t, c, rxe)
	wantAttr(t, d, 0, ioctl.UVERBS_ATTR_QUERY_PORT_PORT_NUM, 8, ioctl.AttrMandatory, 1,
		"const/enum inputs such as the port number must have len 8 (len 1 gives EINVAL), value inline")
	wantAttr(t, d, 1, ioctl.UVERBS_ATTR_QUERY_PORT_RESP, ioctl.SizeofQueryPortRespEx, ioctl.AttrMandatory, addr(unsafe.Pointer(&r)),
		"outputs pass a pointer")
	golden(t, "query_port", renderCall(t, "QUERY_PORT port 1: PORT_NUM const (len 8), RESP out (query_port_resp_ex, 48 bytes)", c.Encoded(),
		[]ptr{{"resp", unsafe.Pointer(&r)}}))
}

func TestGoldenCQCreate(t *testing.T) {
	var granted uint32
	drvOut := make([]byte, ioctl.SizeofRxeCreateCQResp)
	c := ioctl.NewCall(ioctl.UVERBS_OBJECT_CQ, ioctl.UVERBS_METHOD_CQ_CREATE, rxe)
	h := c.NewIDR(ioctl.UVERBS_ATTR_CREATE_CQ_HANDLE)
	c.InU32(ioctl.UVERBS_ATTR_CREATE_CQ_CQE, 16)
	c.InU64(ioctl.UVERBS_ATTR_CREATE_CQ_USER_HANDLE, 0x0123456789abcdef)
	c.InU32(ioctl.UVERBS_ATTR_CREATE_CQ_COMP_VECTOR, 0)
	c.Out(ioctl.UVERBS_ATTR_CREATE_CQ_RESP_CQE, unsafe.Pointer(&granted), 4, ioctl.AttrMandatory)
	c.OutBytes(ioctl.AttrUHWOut, drvOut, 0)
	if h != 0 {
		t.Errorf("NewIDR returned index %d, want 0", h)
	}
	d := checkFraming(t, c, rxe)
	if d.object != 3 || d.method != 0 {
		t.Errorf("CQ_CREATE is object 3 method 0, got %d/%d", d.object, d.method)
	}
	wantAttr(t, d, 0, ioctl.UVERBS_ATTR_CREATE_CQ_HANDLE, 0, ioctl.AttrMandatory, 0, "IDR handle attrs have len 0; the new handle comes back in data")
	wantAttr(t, d, 1, ioctl.UVERBS_ATTR_CREATE_CQ_CQE, 4, ioctl.AttrMandatory, 16, "CQE (attr 1) len 4, inline")
	wantAttr(t, d, 2, ioctl.UVERBS_ATTR_CREATE_CQ_USER_HANDLE, 8, ioctl.AttrMandatory, 0x0123456789abcdef, "USER_HANDLE (2) len 8, inline")
	wantAttr(t, d, 3, ioctl.UVERBS_ATTR_CREATE_CQ_COMP_VECTOR, 4, ioctl.AttrMandatory, 0, "COMP_VECTOR (4) len 4, required")
	wantAttr(t, d, 4, ioctl.UVERBS_ATTR_CREATE_CQ_RESP_CQE, 4, ioctl.AttrMandatory, addr(unsafe.Pointer(&granted)), "RESP_CQE (6) len 4, by pointer")
	wantAttr(t, d, 5, 0x1001, ioctl.SizeofRxeCreateCQResp, 0, addr(unsafe.Pointer(&drvOut[0])), "rxe requires UHW_OUT (attr 0x1001, >= 16 bytes)")
	if ioctl.AttrUHWIn != 0x1000 || ioctl.AttrUHWOut != 0x1001 || ioctl.UVERBS_ID_NS_SHIFT != 12 {
		t.Errorf("driver namespace: UHW_IN %#x UHW_OUT %#x shift %d, want 0x1000 0x1001 12", ioctl.AttrUHWIn, ioctl.AttrUHWOut, ioctl.UVERBS_ID_NS_SHIFT)
	}
	golden(t, "cq_create", renderCall(t, "CQ_CREATE 16 entries: new HANDLE, CQE u32, USER_HANDLE u64, COMP_VECTOR u32, RESP_CQE out, UHW_OUT (rxe_create_cq_resp)", c.Encoded(),
		[]ptr{{"resp_cqe", unsafe.Pointer(&granted)}, {"uhw_out", unsafe.Pointer(&drvOut[0])}}))
}

func TestGoldenQPCreate(t *testing.T) {
	qcap := ioctl.QPCap{Send_wr: 16, Recv_wr: 16, Send_sge: 1, Recv_sge: 1, Inline_data: 64}
	var rcap ioctl.QPCap
	var qpn uint32
	drvOut := make([]byte, ioctl.SizeofRxeCreateQPResp)
	c := ioctl.NewCall(ioctl.UVERBS_OBJECT_QP, ioctl.UVERBS_METHOD_QP_CREATE, rxe)
	c.NewIDR(ioctl.UVERBS_ATTR_CREATE_QP_HANDLE)
	c.InIDR(ioctl.UVERBS_ATTR_CREATE_QP_PD_HANDLE, 0) // handle 0 is valid
	c.InIDR(ioctl.UVERBS_ATTR_CREATE_QP_SEND_CQ_HANDLE, 1)
	c.InIDR(ioctl.UVERBS_ATTR_CREATE_QP_RECV_CQ_HANDLE, 2)
	c.InU64(ioctl.UVERBS_ATTR_CREATE_QP_USER_HANDLE, 0)
	c.InPtr(ioctl.UVERBS_ATTR_CREATE_QP_CAP, unsafe.Pointer(&qcap), ioctl.SizeofQPCap, ioctl.AttrMandatory)
	c.InConst(ioctl.UVERBS_ATTR_CREATE_QP_TYPE, ioctl.IB_UVERBS_QPT_RC)
	c.InU32(ioctl.UVERBS_ATTR_CREATE_QP_FLAGS, ioctl.IB_UVERBS_QP_CREATE_SQ_SIG_ALL)
	c.Out(ioctl.UVERBS_ATTR_CREATE_QP_RESP_CAP, unsafe.Pointer(&rcap), ioctl.SizeofQPCap, ioctl.AttrMandatory)
	c.Out(ioctl.UVERBS_ATTR_CREATE_QP_RESP_QP_NUM, unsafe.Pointer(&qpn), 4, ioctl.AttrMandatory)
	c.OutBytes(ioctl.AttrUHWOut, drvOut, 0)
	d := checkFraming(t, c, rxe)
	if d.object != 4 || d.method != 0 {
		t.Errorf("QP_CREATE is object 4 method 0, got %d/%d", d.object, d.method)
	}
	const idr = "IDR handle attrs have len 0, handle in data"
	wantAttr(t, d, 0, ioctl.UVERBS_ATTR_CREATE_QP_HANDLE, 0, ioctl.AttrMandatory, 0, idr)
	wantAttr(t, d, 1, ioctl.UVERBS_ATTR_CREATE_QP_PD_HANDLE, 0, ioctl.AttrMandatory, 0, idr)
	wantAttr(t, d, 2, ioctl.UVERBS_ATTR_CREATE_QP_SEND_CQ_HANDLE, 0, ioctl.AttrMandatory, 1, idr)
	wantAttr(t, d, 3, ioctl.UVERBS_ATTR_CREATE_QP_RECV_CQ_HANDLE, 0, ioctl.AttrMandatory, 2, idr)
	wantAttr(t, d, 4, ioctl.UVERBS_ATTR_CREATE_QP_USER_HANDLE, 8, ioctl.AttrMandatory, 0, "USER_HANDLE len 8 inline")
	wantAttr(t, d, 5, ioctl.UVERBS_ATTR_CREATE_QP_CAP, 20, ioctl.AttrMandatory, addr(unsafe.Pointer(&qcap)),
		"CAP (8) is the full 20-byte ib_uverbs_qp_cap, > 8 bytes so by pointer")
	wantAttr(t, d, 6, ioctl.UVERBS_ATTR_CREATE_QP_TYPE, 8, ioctl.AttrMandatory, ioctl.IB_UVERBS_QPT_RC, "TYPE (attr 9) is a const: len 8")
	wantAttr(t, d, 7, ioctl.UVERBS_ATTR_CREATE_QP_FLAGS, 4, ioctl.AttrMandatory, ioctl.IB_UVERBS_QP_CREATE_SQ_SIG_ALL, "FLAGS (10) len 4 inline")
	wantAttr(t, d, 8, ioctl.UVERBS_ATTR_CREATE_QP_RESP_CAP, 20, ioctl.AttrMandatory, addr(unsafe.Pointer(&rcap)), "outputs pass a pointer")
	wantAttr(t, d, 9, ioctl.UVERBS_ATTR_CREATE_QP_RESP_QP_NUM, 4, ioctl.AttrMandatory, addr(unsafe.Pointer(&qpn)), "outputs pass a pointer")
	wantAttr(t, d, 10, 0x1001, ioctl.SizeofRxeCreateQPResp, 0, addr(unsafe.Pointer(&drvOut[0])), "rxe requires UHW_OUT")
	golden(t, "qp_create", renderCall(t, "QP_CREATE RC: new HANDLE, PD/SEND_CQ/RECV_CQ IDRs 0/1/2, USER_HANDLE, CAP by pointer, TYPE const, FLAGS SQ_SIG_ALL, RESP_CAP, RESP_QP_NUM, UHW_OUT", c.Encoded(),
		[]ptr{{"cap", unsafe.Pointer(&qcap)}, {"resp_cap", unsafe.Pointer(&rcap)}, {"qp_num", unsafe.Pointer(&qpn)}, {"uhw_out", unsafe.Pointer(&drvOut[0])}}))
}

func TestGoldenPDDestroy(t *testing.T) {
	c := ioctl.NewCall(ioctl.UVERBS_OBJECT_PD, ioctl.UVERBS_METHOD_PD_DESTROY, rxe)
	c.InIDR(ioctl.UVERBS_ATTR_DESTROY_PD_HANDLE, 7)
	d := checkFraming(t, c, rxe)
	if d.object != 1 || d.method != 0 {
		t.Errorf("PD_DESTROY is object 1 method 0, got %d/%d", d.object, d.method)
	}
	wantAttr(t, d, 0, ioctl.UVERBS_ATTR_DESTROY_PD_HANDLE, 0, ioctl.AttrMandatory, 7,
		"IDR handle inline in data with len 0 (a pointer there is silently misread: ENOENT)")
	golden(t, "pd_destroy", renderCall(t, "PD_DESTROY handle 7", c.Encoded(), nil))
}

// invokeWriteCall builds INVOKE_WRITE the way File.Write does (file.go,
// invokeWrite); TestInvokeWriteSeccomp checks that File.Write really sends
// these bytes.
func invokeWriteCall(cmd *ioctl.Cmd, driverID uint32) *ioctl.Call {
	c := ioctl.NewCall(ioctl.UVERBS_OBJECT_DEVICE, ioctl.UVERBS_METHOD_INVOKE_WRITE, driverID)
	c.InPtr(ioctl.UVERBS_ATTR_CORE_IN, cmd.In, cmd.InLen, ioctl.AttrMandatory)
	if cmd.Out != nil {
		c.Out(ioctl.UVERBS_ATTR_CORE_OUT, cmd.Out, cmd.OutLen, ioctl.AttrMandatory)
	}
	c.InConst(ioctl.UVERBS_ATTR_WRITE_CMD, uint64(cmd.Command))
	if len(cmd.DriverIn) > 0 {
		c.InBytes(ioctl.AttrUHWIn, cmd.DriverIn, 0)
	}
	if len(cmd.DriverOut) > 0 {
		c.OutBytes(ioctl.AttrUHWOut, cmd.DriverOut, 0)
	}
	return c
}

// modifyQPRTR is an INIT->RTR MODIFY_QP request with recognisable values.
func modifyQPRTR() *ioctl.ModifyQP {
	m := &ioctl.ModifyQP{
		// IB_QP_STATE|AV|PATH_MTU|RQ_PSN|MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC|DEST_QPN
		Qp_handle: 3, Attr_mask: 0x1 | 0x80 | 0x100 | 0x1000 | 0x8000 | 0x20000 | 0x100000,
		Rq_psn: 0x123456, Dest_qp_num: 0x11, Qp_state: 2, Path_mtu: 3, Max_dest_rd_atomic: 1, Min_rnr_timer: 12,
	}
	m.Dest.Dgid = [16]uint8{10: 0xff, 11: 0xff, 12: 10, 13: 99, 14: 0, 15: 2}
	m.Dest.Sgid_index, m.Dest.Hop_limit, m.Dest.Is_global, m.Dest.Port_num = 1, 64, 1, 1
	return m
}

func TestGoldenInvokeWriteModifyQP(t *testing.T) {
	m := modifyQPRTR()
	cmd := &ioctl.Cmd{Command: ioctl.IB_USER_VERBS_CMD_MODIFY_QP, In: unsafe.Pointer(m), InLen: ioctl.SizeofModifyQP}
	c := invokeWriteCall(cmd, rxe)
	d := checkFraming(t, c, rxe)
	if d.object != 0 || d.method != 0 {
		t.Errorf("INVOKE_WRITE is object 0 method 0, got %d/%d", d.object, d.method)
	}
	wantAttr(t, d, 0, ioctl.UVERBS_ATTR_CORE_IN, ioctl.SizeofModifyQP, ioctl.AttrMandatory, addr(unsafe.Pointer(m)),
		"CORE_IN (attr 0) is the core struct without the 8-byte header, > 8 bytes so by pointer")
	wantAttr(t, d, 1, ioctl.UVERBS_ATTR_WRITE_CMD, 8, ioctl.AttrMandatory, ioctl.IB_USER_VERBS_CMD_MODIFY_QP,
		"WRITE_CMD is attr 2 with len 8 (len 4: EINVAL)")
	if len(d.attrs) != 2 {
		t.Errorf("MODIFY_QP has no response: want 2 attrs, got %d", len(d.attrs))
	}
	golden(t, "invoke_write_modify_qp", renderCall(t, "INVOKE_WRITE MODIFY_QP: CORE_IN (112-byte ib_uverbs_modify_qp) by pointer, WRITE_CMD const, no CORE_OUT", c.Encoded(),
		[]ptr{{"modify_qp", unsafe.Pointer(m)}}))
}

func TestGoldenInvokeWriteAllocPD(t *testing.T) {
	req := ioctl.AllocPD{Response: 0x4141414141414141} // ignored by the kernel on this path
	var resp ioctl.AllocPDResp
	cmd := &ioctl.Cmd{Command: ioctl.IB_USER_VERBS_CMD_ALLOC_PD, In: unsafe.Pointer(&req), InLen: ioctl.SizeofAllocPD,
		Out: unsafe.Pointer(&resp), OutLen: ioctl.SizeofAllocPDResp}
	c := invokeWriteCall(cmd, rxe)
	d := checkFraming(t, c, rxe)
	wantAttr(t, d, 0, ioctl.UVERBS_ATTR_CORE_IN, 8, ioctl.AttrMandatory, 0x4141414141414141,
		"an 8-byte CORE_IN travels inline (<= 8 bytes: inline; a pointer would be misread as the value)")
	wantAttr(t, d, 1, ioctl.UVERBS_ATTR_CORE_OUT, 4, ioctl.AttrMandatory, addr(unsafe.Pointer(&resp)), "CORE_OUT is attr 1, by pointer")
	wantAttr(t, d, 2, ioctl.UVERBS_ATTR_WRITE_CMD, 8, ioctl.AttrMandatory, ioctl.IB_USER_VERBS_CMD_ALLOC_PD, "WRITE_CMD is attr 2 with len 8")
	golden(t, "invoke_write_alloc_pd", renderCall(t, "INVOKE_WRITE ALLOC_PD: CORE_IN (8 bytes, inline), CORE_OUT (4 bytes), WRITE_CMD const", c.Encoded(),
		[]ptr{{"resp", unsafe.Pointer(&resp)}}))
}

func TestGoldenInBytes(t *testing.T) {
	eight := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	three := []byte{0xaa, 0xbb, 0xcc}
	nine := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9}
	c := ioctl.NewCall(ioctl.UVERBS_OBJECT_DEVICE, ioctl.UVERBS_METHOD_INVOKE_WRITE, ioctl.RDMA_DRIVER_SIW)
	c.InBytes(0x1000, eight, 0)
	c.InBytes(0x1002, three, ioctl.AttrMandatory)
	c.InBytes(0x1003, nil, 0)
	c.InBytes(0x1004, nine, 0)
	d := checkFraming(t, c, ioctl.RDMA_DRIVER_SIW)
	wantAttr(t, d, 0, 0x1000, 8, 0, binary.NativeEndian.Uint64(eight), "inputs of <= 8 bytes travel inline in data")
	wantAttr(t, d, 1, 0x1002, 3, ioctl.AttrMandatory, 0xccbbaa, "a short input is inline, zero padded, len is its real length")
	wantAttr(t, d, 2, 0x1003, 0, 0, 0, "an empty input has len 0 and data 0")
	wantAttr(t, d, 3, 0x1004, 9, 0, addr(unsafe.Pointer(&nine[0])), "inputs larger than 8 bytes pass a pointer")
	golden(t, "in_bytes", renderCall(t, "InBytes: 8 bytes inline, 3 bytes inline (mandatory), empty, 9 bytes by pointer; driver SIW", c.Encoded(),
		[]ptr{{"nine", unsafe.Pointer(&nine[0])}}))

	// InPtr follows the same rule.
	var small uint32 = 0xdeadbeef
	c = ioctl.NewCall(0, 0, rxe)
	c.InPtr(0, unsafe.Pointer(&small), 4, ioctl.AttrMandatory)
	c.InPtr(1, nil, 0, ioctl.AttrMandatory)
	d = checkFraming(t, c, rxe)
	wantAttr(t, d, 0, 0, 4, ioctl.AttrMandatory, 0xdeadbeef, "InPtr of <= 8 bytes copies the value inline")
	wantAttr(t, d, 1, 1, 0, ioctl.AttrMandatory, 0, "InPtr of 0 bytes")
}

func TestCallResetAndEmpty(t *testing.T) {
	c := ioctl.NewCall(ioctl.UVERBS_OBJECT_QP, ioctl.UVERBS_METHOD_QP_DESTROY, rxe)
	c.InIDR(ioctl.UVERBS_ATTR_DESTROY_QP_HANDLE, 1)
	c.Reset(ioctl.UVERBS_OBJECT_MR, ioctl.UVERBS_METHOD_MR_DESTROY, ioctl.RDMA_DRIVER_MLX5)
	d := checkFraming(t, c, ioctl.RDMA_DRIVER_MLX5)
	if d.numAttrs != 0 || d.length != 24 || d.object != 7 || d.method != 1 {
		t.Errorf("after Reset: %+v, want an empty MR_DESTROY call of length 24", d)
	}
	var zero ioctl.Call
	zero.Reset(0, 0, 0)
	if n := len(zero.Encoded()); n != 24 {
		t.Errorf("empty call encodes %d bytes, want 24", n)
	}
}

func TestCallTooManyAttrs(t *testing.T) {
	c := ioctl.NewCall(ioctl.UVERBS_OBJECT_DEVICE, 0, rxe)
	for i := 0; i < ioctl.MaxAttrs; i++ {
		c.InU32(uint16(i), uint32(i))
	}
	if err := c.Err(); err != nil {
		t.Fatalf("%d attributes: %v", ioctl.MaxAttrs, err)
	}
	c.InU32(0xff, 1)
	err := c.Err()
	if err == nil || !strings.Contains(err.Error(), fmt.Sprint(ioctl.MaxAttrs)) {
		t.Fatalf("attribute %d: Err() = %v, want an error naming the limit %d", ioctl.MaxAttrs+1, err, ioctl.MaxAttrs)
	}
	if d := decode(t, c.Encoded()); d.numAttrs != ioctl.MaxAttrs {
		t.Errorf("num_attrs = %d after overflow, want %d", d.numAttrs, ioctl.MaxAttrs)
	}
	// The first error sticks.
	c.InU32(0xfe, 1)
	if c.Err() != err {
		t.Errorf("Err changed after a later add: %v", c.Err())
	}
}

func TestCallOversizedBlob(t *testing.T) {
	c := ioctl.NewCall(0, 0, rxe)
	c.InBytes(0x1000, make([]byte, 0x10000), 0)
	if c.Err() == nil {
		t.Fatal("a 64 KiB blob must fail: attr len is a u16")
	}
	c = ioctl.NewCall(0, 0, rxe)
	c.InBytes(0x1000, make([]byte, 0xffff), 0)
	if c.Err() != nil {
		t.Fatalf("65535 bytes: %v", c.Err())
	}
}

// --- legacy write() framing ---

func TestEncodeWriteModifyQP(t *testing.T) {
	m := modifyQPRTR()
	cmd := &ioctl.Cmd{Command: ioctl.IB_USER_VERBS_CMD_MODIFY_QP, In: unsafe.Pointer(m), InLen: ioctl.SizeofModifyQP}
	buf, err := ioctl.EncodeWrite(cmd, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := decodeCmdHdr(buf)
	// Rule: MODIFY_QP has no response (120-byte write, out_words 0).
	if len(buf) != 120 || h.In_words != 30 || h.Out_words != 0 || h.Command != ioctl.IB_USER_VERBS_CMD_MODIFY_QP {
		t.Errorf("MODIFY_QP write: %d bytes, hdr %+v; want 120 bytes, in_words 30, out_words 0, command 0x1a", len(buf), h)
	}
	if !bytes.Equal(buf[8:], unsafe.Slice((*byte)(unsafe.Pointer(m)), ioctl.SizeofModifyQP)) {
		t.Error("the request after the header must be the core struct unchanged (no response pointer: MODIFY_QP has none)")
	}
	golden(t, "write_modify_qp", renderWrite(t, "write() MODIFY_QP: 8-byte header + 112-byte ib_uverbs_modify_qp, no response", buf, ioctl.SizeofModifyQP, nil))
}

func TestEncodeWriteRegMR(t *testing.T) {
	req := ioctl.RegMR{Start: 0x7f0000001000, Length: 0x10000, Hca_va: 0x7f0000001000, Pd_handle: 2,
		Access_flags: ioctl.IB_UVERBS_ACCESS_LOCAL_WRITE | ioctl.IB_UVERBS_ACCESS_REMOTE_WRITE | ioctl.IB_UVERBS_ACCESS_REMOTE_READ}
	drvIn := []byte{0xd1, 0xd2, 0xd3, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8}
	drvOut := make([]byte, 8)
	var coreOut ioctl.RegMRResp
	cmd := &ioctl.Cmd{Command: ioctl.IB_USER_VERBS_CMD_REG_MR, In: unsafe.Pointer(&req), InLen: ioctl.SizeofRegMR,
		Out: unsafe.Pointer(&coreOut), OutLen: ioctl.SizeofRegMRResp, DriverIn: drvIn, DriverOut: drvOut}
	resp := make([]byte, ioctl.SizeofRegMRResp+len(drvOut))
	buf, err := ioctl.EncodeWrite(cmd, resp)
	if err != nil {
		t.Fatal(err)
	}
	h := decodeCmdHdr(buf)
	// Rule: in_words = whole write length incl. the 8-byte header / 4.
	if want := (8 + ioctl.SizeofRegMR + len(drvIn)) / 4; int(h.In_words) != want || len(buf) != 4*want {
		t.Errorf("in_words = %d (buf %d bytes), want %d: in_words counts the whole write including the header", h.In_words, len(buf), want)
	}
	// Rule: out_words*4 = core response + driver response.
	if want := (ioctl.SizeofRegMRResp + len(drvOut)) / 4; int(h.Out_words) != want {
		t.Errorf("out_words = %d, want %d: core response + driver response", h.Out_words, want)
	}
	// Rule: the response pointer is the first field of the request.
	if got := binary.NativeEndian.Uint64(buf[8:]); got != addr(unsafe.Pointer(&resp[0])) {
		t.Errorf("response field = %#x, want &resp = %p", got, &resp[0])
	}
	if req.Response != 0 {
		t.Error("EncodeWrite modified the caller's request")
	}
	// Driver data follows the core request.
	if !bytes.Equal(buf[8+ioctl.SizeofRegMR:], drvIn) {
		t.Errorf("driver data = % x, want % x appended after the core request", buf[8+ioctl.SizeofRegMR:], drvIn)
	}
	golden(t, "write_reg_mr", renderWrite(t, "write() REG_MR: header + 40-byte ib_uverbs_reg_mr + 8 bytes driver data; response 12 + 8 bytes", buf, ioctl.SizeofRegMR, unsafe.Pointer(&resp[0])))
}

func TestEncodeWriteErrors(t *testing.T) {
	var req [16]byte
	for _, tc := range []struct {
		name   string
		inLen  int
		drvIn  int
		resp   int
		substr string
	}{
		{"request not word multiple", 6, 0, 0, "request of 14 bytes"},
		{"driver data not word multiple", 8, 3, 0, "request of 19 bytes"},
		{"response not word multiple", 8, 0, 6, "response of 6 bytes"},
		{"request too large", 8, 0x40000, 0, "not a word multiple below 256 KiB"},
		{"response too large", 8, 0, 0x40000, "not a word multiple below 256 KiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := &ioctl.Cmd{Command: 9, In: unsafe.Pointer(&req), InLen: tc.inLen, DriverIn: make([]byte, tc.drvIn)}
			_, err := ioctl.EncodeWrite(cmd, make([]byte, tc.resp))
			if err == nil || !strings.Contains(err.Error(), tc.substr) {
				t.Errorf("err = %v, want one containing %q", err, tc.substr)
			}
		})
	}
	// Word multiples at the limits are fine.
	cmd := &ioctl.Cmd{Command: 9, In: unsafe.Pointer(&req), InLen: 8}
	if _, err := ioctl.EncodeWrite(cmd, make([]byte, 4*0xffff)); err != nil {
		t.Errorf("response of 0xffff words: %v", err)
	}
}

func decodeCmdHdr(b []byte) ioctl.CmdHdr {
	ne := binary.NativeEndian
	return ioctl.CmdHdr{Command: ne.Uint32(b[0:]), In_words: ne.Uint16(b[4:]), Out_words: ne.Uint16(b[6:])}
}
