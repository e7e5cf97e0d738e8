package ioctl_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/goverbs/goverbs/ioctl"
)

// TestSizes checks that every generated struct has the size the C compiler
// gave it: a mismatch means cgo -godefs and the Go layout disagree (or the
// generated file was edited by hand).
func TestSizes(t *testing.T) {
	sizes := []struct {
		name      string
		got, want uintptr
	}{
		{"IoctlHdr", unsafe.Sizeof(ioctl.IoctlHdr{}), ioctl.SizeofIoctlHdr},
		{"Attr", unsafe.Sizeof(ioctl.Attr{}), ioctl.SizeofAttr},
		{"CmdHdr", unsafe.Sizeof(ioctl.CmdHdr{}), ioctl.SizeofCmdHdr},
		{"ExCmdHdr", unsafe.Sizeof(ioctl.ExCmdHdr{}), ioctl.SizeofExCmdHdr},
		{"GetContext", unsafe.Sizeof(ioctl.GetContext{}), ioctl.SizeofGetContext},
		{"GetContextResp", unsafe.Sizeof(ioctl.GetContextResp{}), ioctl.SizeofGetContextResp},
		{"QueryDevice", unsafe.Sizeof(ioctl.QueryDevice{}), ioctl.SizeofQueryDevice},
		{"QueryDeviceResp", unsafe.Sizeof(ioctl.QueryDeviceResp{}), ioctl.SizeofQueryDeviceResp},
		{"QueryPort", unsafe.Sizeof(ioctl.QueryPort{}), ioctl.SizeofQueryPort},
		{"QueryPortResp", unsafe.Sizeof(ioctl.QueryPortResp{}), ioctl.SizeofQueryPortResp},
		{"QueryPortRespEx", unsafe.Sizeof(ioctl.QueryPortRespEx{}), ioctl.SizeofQueryPortRespEx},
		{"AllocPD", unsafe.Sizeof(ioctl.AllocPD{}), ioctl.SizeofAllocPD},
		{"AllocPDResp", unsafe.Sizeof(ioctl.AllocPDResp{}), ioctl.SizeofAllocPDResp},
		{"DeallocPD", unsafe.Sizeof(ioctl.DeallocPD{}), ioctl.SizeofDeallocPD},
		{"RegMR", unsafe.Sizeof(ioctl.RegMR{}), ioctl.SizeofRegMR},
		{"RegMRResp", unsafe.Sizeof(ioctl.RegMRResp{}), ioctl.SizeofRegMRResp},
		{"DeregMR", unsafe.Sizeof(ioctl.DeregMR{}), ioctl.SizeofDeregMR},
		{"AllocMW", unsafe.Sizeof(ioctl.AllocMW{}), ioctl.SizeofAllocMW},
		{"AllocMWResp", unsafe.Sizeof(ioctl.AllocMWResp{}), ioctl.SizeofAllocMWResp},
		{"DeallocMW", unsafe.Sizeof(ioctl.DeallocMW{}), ioctl.SizeofDeallocMW},
		{"CreateCompChannel", unsafe.Sizeof(ioctl.CreateCompChannel{}), ioctl.SizeofCreateCompChannel},
		{"CreateCompChannelResp", unsafe.Sizeof(ioctl.CreateCompChannelResp{}), ioctl.SizeofCreateCompChannelResp},
		{"CreateCQ", unsafe.Sizeof(ioctl.CreateCQ{}), ioctl.SizeofCreateCQ},
		{"CreateCQResp", unsafe.Sizeof(ioctl.CreateCQResp{}), ioctl.SizeofCreateCQResp},
		{"WC", unsafe.Sizeof(ioctl.WC{}), ioctl.SizeofWC},
		{"ReqNotifyCQ", unsafe.Sizeof(ioctl.ReqNotifyCQ{}), ioctl.SizeofReqNotifyCQ},
		{"DestroyCQ", unsafe.Sizeof(ioctl.DestroyCQ{}), ioctl.SizeofDestroyCQ},
		{"DestroyCQResp", unsafe.Sizeof(ioctl.DestroyCQResp{}), ioctl.SizeofDestroyCQResp},
		{"GlobalRoute", unsafe.Sizeof(ioctl.GlobalRoute{}), ioctl.SizeofGlobalRoute},
		{"AHAttr", unsafe.Sizeof(ioctl.AHAttr{}), ioctl.SizeofAHAttr},
		{"QPAttr", unsafe.Sizeof(ioctl.QPAttr{}), ioctl.SizeofQPAttr},
		{"CreateQP", unsafe.Sizeof(ioctl.CreateQP{}), ioctl.SizeofCreateQP},
		{"CreateQPResp", unsafe.Sizeof(ioctl.CreateQPResp{}), ioctl.SizeofCreateQPResp},
		{"QPDest", unsafe.Sizeof(ioctl.QPDest{}), ioctl.SizeofQPDest},
		{"QueryQP", unsafe.Sizeof(ioctl.QueryQP{}), ioctl.SizeofQueryQP},
		{"QueryQPResp", unsafe.Sizeof(ioctl.QueryQPResp{}), ioctl.SizeofQueryQPResp},
		{"ModifyQP", unsafe.Sizeof(ioctl.ModifyQP{}), ioctl.SizeofModifyQP},
		{"DestroyQP", unsafe.Sizeof(ioctl.DestroyQP{}), ioctl.SizeofDestroyQP},
		{"DestroyQPResp", unsafe.Sizeof(ioctl.DestroyQPResp{}), ioctl.SizeofDestroyQPResp},
		{"PostSend", unsafe.Sizeof(ioctl.PostSend{}), ioctl.SizeofPostSend},
		{"PostSendResp", unsafe.Sizeof(ioctl.PostSendResp{}), ioctl.SizeofPostSendResp},
		{"CreateAH", unsafe.Sizeof(ioctl.CreateAH{}), ioctl.SizeofCreateAH},
		{"CreateAHResp", unsafe.Sizeof(ioctl.CreateAHResp{}), ioctl.SizeofCreateAHResp},
		{"DestroyAH", unsafe.Sizeof(ioctl.DestroyAH{}), ioctl.SizeofDestroyAH},
		{"CreateSRQ", unsafe.Sizeof(ioctl.CreateSRQ{}), ioctl.SizeofCreateSRQ},
		{"CreateSRQResp", unsafe.Sizeof(ioctl.CreateSRQResp{}), ioctl.SizeofCreateSRQResp},
		{"ModifySRQ", unsafe.Sizeof(ioctl.ModifySRQ{}), ioctl.SizeofModifySRQ},
		{"QuerySRQ", unsafe.Sizeof(ioctl.QuerySRQ{}), ioctl.SizeofQuerySRQ},
		{"QuerySRQResp", unsafe.Sizeof(ioctl.QuerySRQResp{}), ioctl.SizeofQuerySRQResp},
		{"DestroySRQ", unsafe.Sizeof(ioctl.DestroySRQ{}), ioctl.SizeofDestroySRQ},
		{"DestroySRQResp", unsafe.Sizeof(ioctl.DestroySRQResp{}), ioctl.SizeofDestroySRQResp},
		{"AsyncEventDesc", unsafe.Sizeof(ioctl.AsyncEventDesc{}), ioctl.SizeofAsyncEventDesc},
		{"CompEventDesc", unsafe.Sizeof(ioctl.CompEventDesc{}), ioctl.SizeofCompEventDesc},
		{"GIDEntry", unsafe.Sizeof(ioctl.GIDEntry{}), ioctl.SizeofGIDEntry},
		{"QPCap", unsafe.Sizeof(ioctl.QPCap{}), ioctl.SizeofQPCap},
		{"AttachMcast", unsafe.Sizeof(ioctl.AttachMcast{}), ioctl.SizeofAttachMcast},
		{"DetachMcast", unsafe.Sizeof(ioctl.DetachMcast{}), ioctl.SizeofDetachMcast},
		{"RxeSendWr", unsafe.Sizeof(ioctl.RxeSendWr{}), ioctl.SizeofRxeSendWr},
		{"RxeWrRDMA", unsafe.Sizeof(ioctl.RxeWrRDMA{}), ioctl.SizeofRxeWrRDMA},
		{"RxeWrAtomic", unsafe.Sizeof(ioctl.RxeWrAtomic{}), ioctl.SizeofRxeWrAtomic},
		{"RxeWrUD", unsafe.Sizeof(ioctl.RxeWrUD{}), ioctl.SizeofRxeWrUD},
		{"RxeWrMW", unsafe.Sizeof(ioctl.RxeWrMW{}), ioctl.SizeofRxeWrMW},
		{"RxeAV", unsafe.Sizeof(ioctl.RxeAV{}), ioctl.SizeofRxeAV},
		{"RxeGlobalRoute", unsafe.Sizeof(ioctl.RxeGlobalRoute{}), ioctl.SizeofRxeGlobalRoute},
		{"RxeSGE", unsafe.Sizeof(ioctl.RxeSGE{}), ioctl.SizeofRxeSGE},
		{"RxeMMInfo", unsafe.Sizeof(ioctl.RxeMMInfo{}), ioctl.SizeofRxeMMInfo},
		{"RxeDMAInfo", unsafe.Sizeof(ioctl.RxeDMAInfo{}), ioctl.SizeofRxeDMAInfo},
		{"RxeSendWqe", unsafe.Sizeof(ioctl.RxeSendWqe{}), ioctl.SizeofRxeSendWqe},
		{"RxeRecvWqe", unsafe.Sizeof(ioctl.RxeRecvWqe{}), ioctl.SizeofRxeRecvWqe},
		{"RxeCreateAHResp", unsafe.Sizeof(ioctl.RxeCreateAHResp{}), ioctl.SizeofRxeCreateAHResp},
		{"RxeCreateCQResp", unsafe.Sizeof(ioctl.RxeCreateCQResp{}), ioctl.SizeofRxeCreateCQResp},
		{"RxeCreateQPResp", unsafe.Sizeof(ioctl.RxeCreateQPResp{}), ioctl.SizeofRxeCreateQPResp},
		{"RxeCreateSRQResp", unsafe.Sizeof(ioctl.RxeCreateSRQResp{}), ioctl.SizeofRxeCreateSRQResp},
		{"RxeModifySRQCmd", unsafe.Sizeof(ioctl.RxeModifySRQCmd{}), ioctl.SizeofRxeModifySRQCmd},
		{"RxeQueueBuf", unsafe.Sizeof(ioctl.RxeQueueBuf{}), ioctl.SizeofRxeQueueBuf},
		{"In6Addr", unsafe.Sizeof(ioctl.In6Addr{}), ioctl.SizeofIn6Addr},
		{"SockaddrIn6", unsafe.Sizeof(ioctl.SockaddrIn6{}), ioctl.SizeofSockaddrIn6},
		{"SockaddrStorage", unsafe.Sizeof(ioctl.SockaddrStorage{}), ioctl.SizeofSockaddrStorage},
		{"UserPathRec", unsafe.Sizeof(ioctl.UserPathRec{}), ioctl.SizeofUserPathRec},
		{"UcmCmdHdr", unsafe.Sizeof(ioctl.UcmCmdHdr{}), ioctl.SizeofUcmCmdHdr},
		{"UcmCreateID", unsafe.Sizeof(ioctl.UcmCreateID{}), ioctl.SizeofUcmCreateID},
		{"UcmCreateIDResp", unsafe.Sizeof(ioctl.UcmCreateIDResp{}), ioctl.SizeofUcmCreateIDResp},
		{"UcmDestroyID", unsafe.Sizeof(ioctl.UcmDestroyID{}), ioctl.SizeofUcmDestroyID},
		{"UcmDestroyIDResp", unsafe.Sizeof(ioctl.UcmDestroyIDResp{}), ioctl.SizeofUcmDestroyIDResp},
		{"UcmBind", unsafe.Sizeof(ioctl.UcmBind{}), ioctl.SizeofUcmBind},
		{"UcmResolveAddr", unsafe.Sizeof(ioctl.UcmResolveAddr{}), ioctl.SizeofUcmResolveAddr},
		{"UcmResolveRoute", unsafe.Sizeof(ioctl.UcmResolveRoute{}), ioctl.SizeofUcmResolveRoute},
		{"UcmQuery", unsafe.Sizeof(ioctl.UcmQuery{}), ioctl.SizeofUcmQuery},
		{"UcmQueryRouteResp", unsafe.Sizeof(ioctl.UcmQueryRouteResp{}), ioctl.SizeofUcmQueryRouteResp},
		{"UcmQueryAddrResp", unsafe.Sizeof(ioctl.UcmQueryAddrResp{}), ioctl.SizeofUcmQueryAddrResp},
		{"UcmConnParam", unsafe.Sizeof(ioctl.UcmConnParam{}), ioctl.SizeofUcmConnParam},
		{"UcmUDParam", unsafe.Sizeof(ioctl.UcmUDParam{}), ioctl.SizeofUcmUDParam},
		{"UcmECE", unsafe.Sizeof(ioctl.UcmECE{}), ioctl.SizeofUcmECE},
		{"UcmConnect", unsafe.Sizeof(ioctl.UcmConnect{}), ioctl.SizeofUcmConnect},
		{"UcmListen", unsafe.Sizeof(ioctl.UcmListen{}), ioctl.SizeofUcmListen},
		{"UcmAccept", unsafe.Sizeof(ioctl.UcmAccept{}), ioctl.SizeofUcmAccept},
		{"UcmReject", unsafe.Sizeof(ioctl.UcmReject{}), ioctl.SizeofUcmReject},
		{"UcmDisconnect", unsafe.Sizeof(ioctl.UcmDisconnect{}), ioctl.SizeofUcmDisconnect},
		{"UcmInitQPAttr", unsafe.Sizeof(ioctl.UcmInitQPAttr{}), ioctl.SizeofUcmInitQPAttr},
		{"UcmNotify", unsafe.Sizeof(ioctl.UcmNotify{}), ioctl.SizeofUcmNotify},
		{"UcmJoinMcast", unsafe.Sizeof(ioctl.UcmJoinMcast{}), ioctl.SizeofUcmJoinMcast},
		{"UcmJoinIPMcast", unsafe.Sizeof(ioctl.UcmJoinIPMcast{}), ioctl.SizeofUcmJoinIPMcast},
		{"UcmGetEvent", unsafe.Sizeof(ioctl.UcmGetEvent{}), ioctl.SizeofUcmGetEvent},
		{"UcmEventResp", unsafe.Sizeof(ioctl.UcmEventResp{}), ioctl.SizeofUcmEventResp},
		{"UcmSetOption", unsafe.Sizeof(ioctl.UcmSetOption{}), ioctl.SizeofUcmSetOption},
	}
	for _, tc := range sizes {
		if tc.got != tc.want {
			t.Errorf("unsafe.Sizeof(%s{}) = %d, Sizeof%s = %d", tc.name, tc.got, tc.name, tc.want)
		}
	}
	if n, want := len(sizeofConst.FindAllString(readZtypes(t), -1)), len(sizes); n != want {
		t.Errorf("ztypes_linux.go has %d Sizeof constants, this test lists %d: add the new types to TestSizes", n, want)
	}
}

// TestUcmLayout pins the rdma_cm (ucma) command sizes to the layout of
// include/uapi/rdma/rdma_user_cm.h, counted by hand from the header: the
// kernel's ucma_write rejects a command shorter than its struct, and a
// response is copied out at its full size, so a wrong size is either EINVAL
// or a kernel write past our buffer.
func TestUcmLayout(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want uintptr
	}{
		{"rdma_ucm_cmd_hdr", ioctl.SizeofUcmCmdHdr, 8},
		{"rdma_ucm_create_id", ioctl.SizeofUcmCreateID, 24},
		{"rdma_ucm_destroy_id", ioctl.SizeofUcmDestroyID, 16},
		{"rdma_ucm_bind", ioctl.SizeofUcmBind, 8 + 128},
		{"rdma_ucm_resolve_addr", ioctl.SizeofUcmResolveAddr, 16 + 2*128},
		{"rdma_ucm_resolve_route", ioctl.SizeofUcmResolveRoute, 8},
		{"rdma_ucm_query", ioctl.SizeofUcmQuery, 16},
		{"rdma_ucm_query_route_resp", ioctl.SizeofUcmQueryRouteResp, 8 + 2*64 + 2*28 + 16},
		{"rdma_ucm_query_addr_resp", ioctl.SizeofUcmQueryAddrResp, 16 + 2*128 + 8},
		{"rdma_ucm_conn_param", ioctl.SizeofUcmConnParam, 8 + 256 + 8},
		{"rdma_ucm_ud_param", ioctl.SizeofUcmUDParam, 8 + 32 + 256 + 8},
		{"rdma_ucm_connect", ioctl.SizeofUcmConnect, 272 + 16},
		{"rdma_ucm_listen", ioctl.SizeofUcmListen, 8},
		{"rdma_ucm_accept", ioctl.SizeofUcmAccept, 8 + 272 + 16},
		{"rdma_ucm_reject", ioctl.SizeofUcmReject, 8 + 256},
		{"rdma_ucm_init_qp_attr", ioctl.SizeofUcmInitQPAttr, 16},
		{"rdma_ucm_get_event", ioctl.SizeofUcmGetEvent, 8},
		{"rdma_ucm_event_resp", ioctl.SizeofUcmEventResp, 20 + 304 + 4 + 8},
		{"rdma_ucm_join_mcast", ioctl.SizeofUcmJoinMcast, 24 + 128},
		{"rdma_ucm_join_ip_mcast", ioctl.SizeofUcmJoinIPMcast, 16 + 28 + 4},
		{"ib_uverbs_attach_mcast", ioctl.SizeofAttachMcast, 16 + 4 + 2 + 2},
		{"rdma_ucm_set_option", ioctl.SizeofUcmSetOption, 24},
		{"param offset in rdma_ucm_event_resp", ioctl.UcmEventRespOffParam, 20},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: generated %d bytes, the uapi header's layout is %d", tc.name, tc.got, tc.want)
		}
	}
	if ioctl.RDMA_USER_CM_ABI_VERSION != 4 || ioctl.RDMA_MAX_PRIVATE_DATA != 256 || ioctl.RDMA_PS_TCP != 0x106 || ioctl.RDMA_USER_CM_CMD_JOIN_MCAST != 22 {
		t.Errorf("ucma constants changed: ABI %d, private data %d, PS_TCP %#x, JOIN_MCAST %d", ioctl.RDMA_USER_CM_ABI_VERSION, ioctl.RDMA_MAX_PRIVATE_DATA, ioctl.RDMA_PS_TCP, ioctl.RDMA_USER_CM_CMD_JOIN_MCAST)
	}
}

var sizeofConst = regexp.MustCompile(`(?m)^\s*Sizeof\w+\s*=`)

func readZtypes(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("ztypes_linux.go")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestKnownLayout pins sizes and offsets the data path and the kernel
// depend on (uverbs-abi.md).
func TestKnownLayout(t *testing.T) {
	for _, tc := range []struct {
		what      string
		got, want int
	}{
		{"ib_uverbs_ioctl_hdr size", ioctl.SizeofIoctlHdr, 24},
		{"ib_uverbs_attr size", ioctl.SizeofAttr, 16},
		{"ib_uverbs_cmd_hdr size", ioctl.SizeofCmdHdr, 8},
		{"ib_uverbs_modify_qp size (120-byte write with the header)", ioctl.SizeofModifyQP, 112},
		{"ib_uverbs_qp_cap size (QP_CREATE CAP is the full 20 bytes)", ioctl.SizeofQPCap, 20},
		{"ib_uverbs_wc size (48 B at the start of each 128 B CQ slot)", ioctl.SizeofWC, 48},
		{"ib_uverbs_post_send size (CORE_IN 24 B)", ioctl.SizeofPostSend, 24},
		{"rxe_create_cq_resp size (UHW_OUT >= 16 bytes)", ioctl.SizeofRxeCreateCQResp, 16},
		{"rxe_create_qp_resp size (rq_mi, sq_mi)", ioctl.SizeofRxeCreateQPResp, 32},
		{"rxe_send_wr size (the 144-byte wr part)", ioctl.SizeofRxeSendWr, 144},
		{"rxe_send_wqe wr.wr_id offset", ioctl.RxeSendWqeOffWrID, 0},
		{"rxe_send_wqe iova offset", ioctl.RxeSendWqeOffIova, 152},
		{"rxe_send_wqe dma.sge (data) offset", ioctl.RxeSendWqeOffData, 208},
		{"rxe_recv_wqe dma.sge (data) offset", ioctl.RxeRecvWqeOffData, 40},
		{"rxe_queue_buf producer_index offset", ioctl.RxeQueueBufOffProducer, 128},
		{"rxe_queue_buf consumer_index offset", ioctl.RxeQueueBufOffConsumer, 256},
		{"rxe_queue_buf data offset", ioctl.RxeQueueBufOffData, 384},
		{"Go RxeSendWqe.Iova offset", int(unsafe.Offsetof(ioctl.RxeSendWqe{}.Iova)), ioctl.RxeSendWqeOffIova},
		{"Go RxeSendWqe.Dma offset", int(unsafe.Offsetof(ioctl.RxeSendWqe{}.Dma)), ioctl.RxeSendWqeOffDMA},
		{"Go RxeSendWqe size = data offset", int(unsafe.Sizeof(ioctl.RxeSendWqe{})), ioctl.RxeSendWqeOffData},
		{"Go RxeRecvWqe.Dma offset", int(unsafe.Offsetof(ioctl.RxeRecvWqe{}.Dma)), ioctl.RxeRecvWqeOffDMA},
		{"Go RxeRecvWqe size = data offset", int(unsafe.Sizeof(ioctl.RxeRecvWqe{})), ioctl.RxeRecvWqeOffData},
		{"Go RxeQueueBuf.Producer_index offset", int(unsafe.Offsetof(ioctl.RxeQueueBuf{}.Producer_index)), ioctl.RxeQueueBufOffProducer},
		{"Go RxeQueueBuf.Consumer_index offset", int(unsafe.Offsetof(ioctl.RxeQueueBuf{}.Consumer_index)), ioctl.RxeQueueBufOffConsumer},
		{"Go RxeQueueBuf size = data offset", int(unsafe.Sizeof(ioctl.RxeQueueBuf{})), ioctl.RxeQueueBufOffData},
		{"Go RxeSendWr.Opcode offset", int(unsafe.Offsetof(ioctl.RxeSendWr{}.Opcode)), ioctl.RxeSendWqeOffOpcode},
		{"Go RxeSendWr.Send_flags offset", int(unsafe.Offsetof(ioctl.RxeSendWr{}.Send_flags)), ioctl.RxeSendWqeOffSendFlags},
		{"Go RxeSendWr.Ex offset", int(unsafe.Offsetof(ioctl.RxeSendWr{}.Ex)), ioctl.RxeSendWqeOffImm},
		{"Go RxeSendWr.Wr offset", int(unsafe.Offsetof(ioctl.RxeSendWr{}.Wr)), ioctl.RxeSendWqeOffWr},
		{"Go RxeSendWqe.Status offset", int(unsafe.Offsetof(ioctl.RxeSendWqe{}.Status)), ioctl.RxeSendWqeOffStatus},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %d, want %d", tc.what, tc.got, tc.want)
		}
	}
	for _, tc := range []struct {
		what      string
		got, want uint64
	}{
		{"RDMA_VERBS_IOCTL", ioctl.RDMA_VERBS_IOCTL, 0xc0181b01},
		{"RDMA_DRIVER_RXE", ioctl.RDMA_DRIVER_RXE, 14},
		{"UVERBS_ATTR_F_MANDATORY", ioctl.UVERBS_ATTR_F_MANDATORY, 1},
		{"UVERBS_ATTR_F_VALID_OUTPUT", ioctl.UVERBS_ATTR_F_VALID_OUTPUT, 2},
		{"UVERBS_ATTR_UHW_IN", ioctl.UVERBS_ATTR_UHW_IN, 0x1000},
		{"UVERBS_ATTR_UHW_OUT", ioctl.UVERBS_ATTR_UHW_OUT, 0x1001},
		{"UVERBS_ATTR_WRITE_CMD", ioctl.UVERBS_ATTR_WRITE_CMD, 2},
		{"UVERBS_ATTR_CORE_IN", ioctl.UVERBS_ATTR_CORE_IN, 0},
		{"UVERBS_ATTR_CORE_OUT", ioctl.UVERBS_ATTR_CORE_OUT, 1},
		{"IB_USER_VERBS_ABI_VERSION", ioctl.IB_USER_VERBS_ABI_VERSION, 6},
		{"UVERBS_OBJECT_CQ", ioctl.UVERBS_OBJECT_CQ, 3},
		{"UVERBS_OBJECT_QP", ioctl.UVERBS_OBJECT_QP, 4},
		{"UVERBS_OBJECT_MR", ioctl.UVERBS_OBJECT_MR, 7},
		{"UVERBS_METHOD_MR_DESTROY", ioctl.UVERBS_METHOD_MR_DESTROY, 1},
		{"UVERBS_ATTR_CREATE_QP_TYPE", ioctl.UVERBS_ATTR_CREATE_QP_TYPE, 9},
		{"UVERBS_ATTR_CREATE_QP_CAP", ioctl.UVERBS_ATTR_CREATE_QP_CAP, 8},
		{"UVERBS_ATTR_CREATE_QP_FLAGS", ioctl.UVERBS_ATTR_CREATE_QP_FLAGS, 10},
		{"UVERBS_ATTR_CREATE_CQ_RESP_CQE", ioctl.UVERBS_ATTR_CREATE_CQ_RESP_CQE, 6},
		{"IB_USER_VERBS_CMD_MODIFY_QP", ioctl.IB_USER_VERBS_CMD_MODIFY_QP, 0x1a},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %#x, want %#x", tc.what, tc.got, tc.want)
		}
	}
}

// TestGeneratedUpToDate regenerates ztypes_linux.go from this machine's
// headers and compares. It needs the go tool, a C compiler (cgo -godefs) and
// the kernel's rdma uapi headers.
func TestGeneratedUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the generator run")
	}
	if os.Getenv("GOVERBS_VM_GUEST") == "1" {
		t.Skip("the generator check runs on the host (scripts/test does), not in the emulated guest")
	}
	goTool := findGo(t)
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		if _, err2 := exec.LookPath("cc"); err2 != nil {
			t.Skipf("no C compiler (%s, cc) on PATH: cgo -godefs needs one to regenerate ztypes_linux.go", cc)
		}
	}
	// The pin (internal/mkztypes/uapi.lock, checked against Debian's
	// package by scripts/abi) decides; this offline check runs where the
	// host's headers are the pinned bytes.
	lock, err := os.ReadFile("internal/mkztypes/uapi.lock")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(lock), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "sha256" {
			continue
		}
		n++
		b, err := os.ReadFile(filepath.Join("/usr/include", f[2]))
		if err != nil {
			t.Skipf("kernel rdma uapi header missing (%v): scripts/abi checks the generated file against the pinned package", err)
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != f[1] {
			t.Skipf("/usr/include/%s is not the pinned header (uapi.lock): scripts/abi checks against the pinned package", f[2])
		}
	}
	if n == 0 {
		t.Fatal("uapi.lock lists no header")
	}
	out := filepath.Join(t.TempDir(), "z.go")
	cmd := exec.Command(goTool, "run", "./internal/mkztypes", "-o", out)
	// mkztypes runs `go tool cgo` itself: make sure it finds the same go.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "PATH="+filepath.Dir(goTool)+string(os.PathListSeparator)+os.Getenv("PATH"))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run ./internal/mkztypes: %v\n%s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if want := readZtypes(t); !bytes.Equal(got, []byte(want)) {
		t.Errorf("ztypes_linux.go is stale for /usr/include/rdma: run `go generate ./ioctl` (diff %s ztypes_linux.go)\n%s", out, firstDiff(want, string(got)))
	}
}

func firstDiff(a, b string) string {
	al, bl := bytes.Split([]byte(a), []byte("\n")), bytes.Split([]byte(b), []byte("\n"))
	for i := 0; i < len(al) || i < len(bl); i++ {
		var x, y []byte
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if !bytes.Equal(x, y) {
			return "first difference at line " + strconv.Itoa(i+1) + ":\n- " + string(x) + "\n+ " + string(y)
		}
	}
	return ""
}

// findGo finds the go tool: on PATH, under GOROOT, or /usr/local/go.
func findGo(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	for _, p := range []string{filepath.Join(os.Getenv("GOROOT"), "bin", "go"), "/usr/local/go/bin/go"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("no go tool on PATH, in GOROOT or in /usr/local/go/bin")
	return ""
}
