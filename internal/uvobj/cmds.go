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
