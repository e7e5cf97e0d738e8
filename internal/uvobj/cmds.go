package uvobj

import (
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
)

// The commands that create kernel objects, one typed function each, in
// the manner of cilium/ebpf's internal/sys: the ioctl method and the
// legacy command of one verb side by side, chosen by ioctl.File.Either.

// CQCreate is CQ_CREATE's input: cqe entries, the user handle events name
// the CQ by, the completion vector, the completion channel's descriptor
// (-1: none) and the provider's private data.
type CQCreate struct {
	CQE     uint32
	User    uint64
	Vector  uint32
	Channel int
	In, Out []byte // provider udata (UHW_IN, UHW_OUT)
}

// CreateCQ creates a CQ and returns its handle and the entries granted.
func CreateCQ(f *ioctl.File, a *CQCreate) (handle, granted uint32, err error) {
	err = f.Either(func() error {
		var c ioctl.Call
		c.Reset(ioctl.UVERBS_OBJECT_CQ, ioctl.UVERBS_METHOD_CQ_CREATE, f.DriverID())
		h := c.NewIDR(ioctl.UVERBS_ATTR_CREATE_CQ_HANDLE)
		c.InU32(ioctl.UVERBS_ATTR_CREATE_CQ_CQE, a.CQE)
		c.InU64(ioctl.UVERBS_ATTR_CREATE_CQ_USER_HANDLE, a.User)
		c.InU32(ioctl.UVERBS_ATTR_CREATE_CQ_COMP_VECTOR, a.Vector)
		if a.Channel >= 0 {
			c.InFD(ioctl.UVERBS_ATTR_CREATE_CQ_COMP_CHANNEL, a.Channel)
		}
		c.Out(ioctl.UVERBS_ATTR_CREATE_CQ_RESP_CQE, unsafe.Pointer(&granted), 4, ioctl.AttrMandatory)
		udata(&c, a.In, a.Out)
		if err := f.Do(&c, "CQ_CREATE"); err != nil {
			return err
		}
		handle = uint32(c.Data(h))
		return nil
	}, func() error {
		req := ioctl.CreateCQ{Cqe: a.CQE, Comp_channel: int32(a.Channel), User_handle: a.User, Comp_vector: a.Vector}
		var resp ioctl.CreateCQResp
		err := f.Write(&ioctl.Cmd{
			Command: ioctl.IB_USER_VERBS_CMD_CREATE_CQ,
			In:      unsafe.Pointer(&req), InLen: ioctl.SizeofCreateCQ,
			Out: unsafe.Pointer(&resp), OutLen: ioctl.SizeofCreateCQResp,
			DriverIn: a.In, DriverOut: a.Out,
		}, "CREATE_CQ")
		handle, granted = resp.Handle, resp.Cqe
		return err
	})
	return handle, granted, err
}

// QPCreate is QP_CREATE's input: the PD, CQ and SRQ (HasSRQ) handles, the
// user handle, the capabilities asked for, the QP type (IB_UVERBS_QPT_*),
// whether every send is signaled, and the provider's private data.
type QPCreate struct {
	PD, SendCQ, RecvCQ, SRQ uint32
	HasSRQ                  bool
	User                    uint64
	Cap                     ioctl.QPCap
	Type                    uint8
	SignalAll               bool
	In, Out                 []byte
}

// CreateQP creates a QP and returns its handle, number and the
// capabilities the kernel granted.
func CreateQP(f *ioctl.File, a *QPCreate) (handle, qpn uint32, caps ioctl.QPCap, err error) {
	err = f.Either(func() error {
		var c ioctl.Call
		c.Reset(ioctl.UVERBS_OBJECT_QP, ioctl.UVERBS_METHOD_QP_CREATE, f.DriverID())
		h := c.NewIDR(ioctl.UVERBS_ATTR_CREATE_QP_HANDLE)
		c.InIDR(ioctl.UVERBS_ATTR_CREATE_QP_PD_HANDLE, a.PD)
		c.InIDR(ioctl.UVERBS_ATTR_CREATE_QP_SEND_CQ_HANDLE, a.SendCQ)
		c.InIDR(ioctl.UVERBS_ATTR_CREATE_QP_RECV_CQ_HANDLE, a.RecvCQ)
		if a.HasSRQ {
			c.InIDR(ioctl.UVERBS_ATTR_CREATE_QP_SRQ_HANDLE, a.SRQ)
		}
		c.InU64(ioctl.UVERBS_ATTR_CREATE_QP_USER_HANDLE, a.User)
		c.InPtr(ioctl.UVERBS_ATTR_CREATE_QP_CAP, unsafe.Pointer(&a.Cap), ioctl.SizeofQPCap, ioctl.AttrMandatory)
		c.InConst(ioctl.UVERBS_ATTR_CREATE_QP_TYPE, uint64(a.Type))
		var flags uint32
		if a.SignalAll {
			flags |= ioctl.IB_UVERBS_QP_CREATE_SQ_SIG_ALL
		}
		c.InU32(ioctl.UVERBS_ATTR_CREATE_QP_FLAGS, flags)
		c.Out(ioctl.UVERBS_ATTR_CREATE_QP_RESP_CAP, unsafe.Pointer(&caps), ioctl.SizeofQPCap, ioctl.AttrMandatory)
		c.Out(ioctl.UVERBS_ATTR_CREATE_QP_RESP_QP_NUM, unsafe.Pointer(&qpn), 4, ioctl.AttrMandatory)
		udata(&c, a.In, a.Out)
		if err := f.Do(&c, "QP_CREATE"); err != nil {
			return err
		}
		handle = uint32(c.Data(h))
		return nil
	}, func() error {
		req := ioctl.CreateQP{User_handle: a.User, Pd_handle: a.PD, Send_cq_handle: a.SendCQ, Recv_cq_handle: a.RecvCQ,
			Max_send_wr: a.Cap.Send_wr, Max_recv_wr: a.Cap.Recv_wr, Max_send_sge: a.Cap.Send_sge,
			Max_recv_sge: a.Cap.Recv_sge, Max_inline_data: a.Cap.Inline_data, Qp_type: a.Type}
		if a.SignalAll {
			req.Sq_sig_all = 1
		}
		if a.HasSRQ {
			req.Srq_handle, req.Is_srq = a.SRQ, 1
		}
		var resp ioctl.CreateQPResp
		err := f.Write(&ioctl.Cmd{
			Command: ioctl.IB_USER_VERBS_CMD_CREATE_QP,
			In:      unsafe.Pointer(&req), InLen: ioctl.SizeofCreateQP,
			Out: unsafe.Pointer(&resp), OutLen: ioctl.SizeofCreateQPResp,
			DriverIn: a.In, DriverOut: a.Out,
		}, "CREATE_QP")
		handle, qpn = resp.Qp_handle, resp.Qpn
		caps = ioctl.QPCap{Send_wr: resp.Max_send_wr, Recv_wr: resp.Max_recv_wr, Send_sge: resp.Max_send_sge,
			Recv_sge: resp.Max_recv_sge, Inline_data: resp.Max_inline_data}
		return err
	})
	return handle, qpn, caps, err
}

// udata adds a provider's private request and response to an ioctl call.
func udata(c *ioctl.Call, in, out []byte) {
	if len(in) > 0 {
		c.InBytes(ioctl.AttrUHWIn, in, 0)
	}
	if len(out) > 0 {
		c.OutBytes(ioctl.AttrUHWOut, out, 0)
	}
}

// The commands that destroy kernel objects, one typed function each. A
// destroyed object's handle is gone from the kernel; the caller's
// close-once state (Once) keeps a second destroy from running.

// DestroyCQ destroys a CQ.
func DestroyCQ(f *ioctl.File, handle uint32) error { return destroy(f, &destroyCQ, handle) }

// DestroyQP destroys a QP.
func DestroyQP(f *ioctl.File, handle uint32) error { return destroy(f, &destroyQP, handle) }

// DestroySRQ destroys an SRQ.
func DestroySRQ(f *ioctl.File, handle uint32) error { return destroy(f, &destroySRQ, handle) }

// DeregMR deregisters a memory region.
func DeregMR(f *ioctl.File, handle uint32) error { return destroy(f, &deregMR, handle) }

// DeallocMW deallocates a memory window.
func DeallocMW(f *ioctl.File, handle uint32) error { return destroy(f, &deallocMW, handle) }

// DeallocPD deallocates a protection domain.
func DeallocPD(f *ioctl.File, handle uint32) error { return destroy(f, &deallocPD, handle) }

// DestroyAH destroys an address handle.
func DestroyAH(f *ioctl.File, handle uint32) error { return destroy(f, &destroyAH, handle) }

// destroyVerb is one object type's destroy: its ioctl method and the
// legacy command for kernels without the method, side by side.
type destroyVerb struct {
	op                         string // for errors
	object, method, handleAttr uint16
	// respAttr, respLen: the response the CQ, QP and SRQ methods must
	// have (respLen 0: none). Their legacy requests then start with the
	// response pointer.
	respAttr uint16
	respLen  int
	legacy   uint32
}

var (
	destroyCQ = destroyVerb{op: "CQ_DESTROY", object: ioctl.UVERBS_OBJECT_CQ, method: ioctl.UVERBS_METHOD_CQ_DESTROY,
		handleAttr: ioctl.UVERBS_ATTR_DESTROY_CQ_HANDLE, respAttr: ioctl.UVERBS_ATTR_DESTROY_CQ_RESP,
		respLen: ioctl.SizeofDestroyCQResp, legacy: ioctl.IB_USER_VERBS_CMD_DESTROY_CQ}
	destroyQP = destroyVerb{op: "QP_DESTROY", object: ioctl.UVERBS_OBJECT_QP, method: ioctl.UVERBS_METHOD_QP_DESTROY,
		handleAttr: ioctl.UVERBS_ATTR_DESTROY_QP_HANDLE, respAttr: ioctl.UVERBS_ATTR_DESTROY_QP_RESP,
		respLen: ioctl.SizeofDestroyQPResp, legacy: ioctl.IB_USER_VERBS_CMD_DESTROY_QP}
	destroySRQ = destroyVerb{op: "SRQ_DESTROY", object: ioctl.UVERBS_OBJECT_SRQ, method: ioctl.UVERBS_METHOD_SRQ_DESTROY,
		handleAttr: ioctl.UVERBS_ATTR_DESTROY_SRQ_HANDLE, respAttr: ioctl.UVERBS_ATTR_DESTROY_SRQ_RESP,
		respLen: ioctl.SizeofDestroySRQResp, legacy: ioctl.IB_USER_VERBS_CMD_DESTROY_SRQ}
	deregMR = destroyVerb{op: "MR_DESTROY", object: ioctl.UVERBS_OBJECT_MR, method: ioctl.UVERBS_METHOD_MR_DESTROY,
		handleAttr: ioctl.UVERBS_ATTR_DESTROY_MR_HANDLE, legacy: ioctl.IB_USER_VERBS_CMD_DEREG_MR}
	deallocMW = destroyVerb{op: "MW_DESTROY", object: ioctl.UVERBS_OBJECT_MW, method: ioctl.UVERBS_METHOD_MW_DESTROY,
		handleAttr: ioctl.UVERBS_ATTR_DESTROY_MW_HANDLE, legacy: ioctl.IB_USER_VERBS_CMD_DEALLOC_MW}
	deallocPD = destroyVerb{op: "PD_DESTROY", object: ioctl.UVERBS_OBJECT_PD, method: ioctl.UVERBS_METHOD_PD_DESTROY,
		handleAttr: ioctl.UVERBS_ATTR_DESTROY_PD_HANDLE, legacy: ioctl.IB_USER_VERBS_CMD_DEALLOC_PD}
	destroyAH = destroyVerb{op: "AH_DESTROY", object: ioctl.UVERBS_OBJECT_AH, method: ioctl.UVERBS_METHOD_AH_DESTROY,
		handleAttr: ioctl.UVERBS_ATTR_DESTROY_AH_HANDLE, legacy: ioctl.IB_USER_VERBS_CMD_DESTROY_AH}
)

// destroyResp holds the largest destroy response (the CQ's).
type destroyResp [ioctl.SizeofDestroyCQResp]byte

// destroy runs v on the object handle: the ioctl method first, the legacy
// command where the kernel lacks the method. The legacy requests of one
// shape share one layout: DESTROY_CQ's {response, handle, reserved} for
// the CQ, QP and SRQ, DEALLOC_PD's {handle} for the rest
// (TestDestroyLayouts holds the generated types to that).
func destroy(f *ioctl.File, v *destroyVerb, handle uint32) error {
	var resp destroyResp
	return f.Either(func() error {
		var c ioctl.Call
		c.Reset(v.object, v.method, f.DriverID())
		c.InIDR(v.handleAttr, handle)
		if v.respLen > 0 {
			c.Out(v.respAttr, unsafe.Pointer(&resp), v.respLen, ioctl.AttrMandatory)
		}
		return f.Do(&c, v.op)
	}, func() error {
		if v.respLen > 0 {
			req := ioctl.DestroyCQ{Response: uint64(uintptr(unsafe.Pointer(&resp))), Handle: handle}
			return f.Write(&ioctl.Cmd{Command: v.legacy, In: unsafe.Pointer(&req), InLen: ioctl.SizeofDestroyCQ,
				Out: unsafe.Pointer(&resp), OutLen: v.respLen}, v.op)
		}
		req := ioctl.DeallocPD{Handle: handle}
		return f.Write(&ioctl.Cmd{Command: v.legacy, In: unsafe.Pointer(&req), InLen: ioctl.SizeofDeallocPD}, v.op)
	})
}
