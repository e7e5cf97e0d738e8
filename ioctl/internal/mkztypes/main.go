// Command mkztypes generates ioctl/ztypes_linux.go from the kernel's RDMA uapi
// headers in the folder -include names (default /usr/include, where Debian's
// linux-libc-dev installs them). scripts/abi runs it on the headers of the
// linux-libc-dev pinned in uapi.lock, not on the host's.
//
// It reads every enum member and a short list of #defines out of the headers,
// writes an input file for `go tool cgo -godefs` that names those constants and
// the structs listed below, and runs it. A C compiler is needed here, at
// generation time only; the build of goverbs never needs one.
//
// Run it through `go generate ./ioctl` (scripts/abi --update).
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// headers are read in this order; the includes of the cgo preamble follow it.
var headers = []string{
	"rdma/rdma_user_ioctl_cmds.h",
	"rdma/ib_user_ioctl_cmds.h",
	"rdma/ib_user_ioctl_verbs.h",
	"rdma/ib_user_verbs.h",
	"rdma/rdma_user_rxe.h",
	"rdma/rdma_user_cm.h",
}

// defines are the object-like macros worth exporting; enums are taken whole.
var defines = []string{
	"RDMA_IOCTL_MAGIC",
	"RDMA_VERBS_IOCTL",
	"UVERBS_ID_NS_MASK",
	"UVERBS_ID_NS_SHIFT",
	"UVERBS_UDATA_DRIVER_DATA_FLAG",
	"IB_USER_VERBS_ABI_VERSION",
	"IB_USER_VERBS_CMD_COMMAND_MASK",
	"IB_USER_VERBS_CMD_FLAG_EXTENDED",
	"IB_DEVICE_NAME_MAX",
	"RDMA_USER_CM_ABI_VERSION",
	"RDMA_MAX_PRIVATE_DATA",
}

// types maps the Go name to the C type. Unions come out as byte arrays; the
// named members below give them typed views.
var types = [][2]string{
	// ioctl framing
	{"IoctlHdr", "struct ib_uverbs_ioctl_hdr"},
	{"Attr", "struct ib_uverbs_attr"},

	// legacy write() commands
	{"CmdHdr", "struct ib_uverbs_cmd_hdr"},
	{"ExCmdHdr", "struct ib_uverbs_ex_cmd_hdr"},
	{"GetContext", "struct ib_uverbs_get_context"},
	{"GetContextResp", "struct ib_uverbs_get_context_resp"},
	{"QueryDevice", "struct ib_uverbs_query_device"},
	{"QueryDeviceResp", "struct ib_uverbs_query_device_resp"},
	{"QueryPort", "struct ib_uverbs_query_port"},
	{"QueryPortResp", "struct ib_uverbs_query_port_resp"},
	{"QueryPortRespEx", "struct ib_uverbs_query_port_resp_ex"},
	{"AllocPD", "struct ib_uverbs_alloc_pd"},
	{"AllocPDResp", "struct ib_uverbs_alloc_pd_resp"},
	{"DeallocPD", "struct ib_uverbs_dealloc_pd"},
	{"RegMR", "struct ib_uverbs_reg_mr"},
	{"RegMRResp", "struct ib_uverbs_reg_mr_resp"},
	{"DeregMR", "struct ib_uverbs_dereg_mr"},
	{"AllocMW", "struct ib_uverbs_alloc_mw"},
	{"AllocMWResp", "struct ib_uverbs_alloc_mw_resp"},
	{"DeallocMW", "struct ib_uverbs_dealloc_mw"},
	{"CreateCompChannel", "struct ib_uverbs_create_comp_channel"},
	{"CreateCompChannelResp", "struct ib_uverbs_create_comp_channel_resp"},
	{"CreateCQ", "struct ib_uverbs_create_cq"},
	{"CreateCQResp", "struct ib_uverbs_create_cq_resp"},
	{"WC", "struct ib_uverbs_wc"},
	{"ReqNotifyCQ", "struct ib_uverbs_req_notify_cq"},
	{"DestroyCQ", "struct ib_uverbs_destroy_cq"},
	{"DestroyCQResp", "struct ib_uverbs_destroy_cq_resp"},
	{"GlobalRoute", "struct ib_uverbs_global_route"},
	{"AHAttr", "struct ib_uverbs_ah_attr"},
	{"QPAttr", "struct ib_uverbs_qp_attr"},
	{"CreateQP", "struct ib_uverbs_create_qp"},
	{"CreateQPResp", "struct ib_uverbs_create_qp_resp"},
	{"QPDest", "struct ib_uverbs_qp_dest"},
	{"QueryQP", "struct ib_uverbs_query_qp"},
	{"QueryQPResp", "struct ib_uverbs_query_qp_resp"},
	{"ModifyQP", "struct ib_uverbs_modify_qp"},
	{"DestroyQP", "struct ib_uverbs_destroy_qp"},
	{"DestroyQPResp", "struct ib_uverbs_destroy_qp_resp"},
	{"PostSend", "struct ib_uverbs_post_send"},
	{"PostSendResp", "struct ib_uverbs_post_send_resp"},
	{"CreateAH", "struct ib_uverbs_create_ah"},
	{"CreateAHResp", "struct ib_uverbs_create_ah_resp"},
	{"DestroyAH", "struct ib_uverbs_destroy_ah"},
	{"CreateSRQ", "struct ib_uverbs_create_srq"},
	{"CreateSRQResp", "struct ib_uverbs_create_srq_resp"},
	{"ModifySRQ", "struct ib_uverbs_modify_srq"},
	{"QuerySRQ", "struct ib_uverbs_query_srq"},
	{"QuerySRQResp", "struct ib_uverbs_query_srq_resp"},
	{"DestroySRQ", "struct ib_uverbs_destroy_srq"},
	{"DestroySRQResp", "struct ib_uverbs_destroy_srq_resp"},
	{"AsyncEventDesc", "struct ib_uverbs_async_event_desc"},
	{"CompEventDesc", "struct ib_uverbs_comp_event_desc"},
	{"GIDEntry", "struct ib_uverbs_gid_entry"},
	{"QPCap", "struct ib_uverbs_qp_cap"},
	{"AttachMcast", "struct ib_uverbs_attach_mcast"},
	{"DetachMcast", "struct ib_uverbs_detach_mcast"},

	// rxe (Soft-RoCE) provider ABI
	{"RxeSendWr", "struct rxe_send_wr"},
	{"RxeWrRDMA", "goverbs_rxe_wr_rdma"},
	{"RxeWrAtomic", "goverbs_rxe_wr_atomic"},
	{"RxeWrUD", "goverbs_rxe_wr_ud"},
	{"RxeWrMW", "goverbs_rxe_wr_mw"},
	{"RxeAV", "struct rxe_av"},
	{"RxeGlobalRoute", "struct rxe_global_route"},
	{"RxeSGE", "struct rxe_sge"},
	{"RxeMMInfo", "struct mminfo"},
	{"RxeDMAInfo", "struct rxe_dma_info"},
	{"RxeSendWqe", "struct rxe_send_wqe"},
	{"RxeRecvWqe", "struct rxe_recv_wqe"},
	{"RxeCreateAHResp", "struct rxe_create_ah_resp"},
	{"RxeCreateCQResp", "struct rxe_create_cq_resp"},
	{"RxeCreateQPResp", "struct rxe_create_qp_resp"},
	{"RxeCreateSRQResp", "struct rxe_create_srq_resp"},
	{"RxeModifySRQCmd", "struct rxe_modify_srq_cmd"},
	{"RxeQueueBuf", "struct rxe_queue_buf"},

	// rdma_cm (the ucma ABI of /dev/infiniband/rdma_cm)
	{"In6Addr", "struct in6_addr"},
	{"SockaddrIn6", "struct sockaddr_in6"},
	{"SockaddrStorage", "struct __kernel_sockaddr_storage"},
	{"UserPathRec", "struct ib_user_path_rec"},
	{"UcmCmdHdr", "struct rdma_ucm_cmd_hdr"},
	{"UcmCreateID", "struct rdma_ucm_create_id"},
	{"UcmCreateIDResp", "struct rdma_ucm_create_id_resp"},
	{"UcmDestroyID", "struct rdma_ucm_destroy_id"},
	{"UcmDestroyIDResp", "struct rdma_ucm_destroy_id_resp"},
	{"UcmBind", "struct rdma_ucm_bind"},
	{"UcmResolveAddr", "struct rdma_ucm_resolve_addr"},
	{"UcmResolveRoute", "struct rdma_ucm_resolve_route"},
	{"UcmQuery", "struct rdma_ucm_query"},
	{"UcmQueryRouteResp", "struct rdma_ucm_query_route_resp"},
	{"UcmQueryAddrResp", "struct rdma_ucm_query_addr_resp"},
	{"UcmConnParam", "struct rdma_ucm_conn_param"},
	{"UcmUDParam", "struct rdma_ucm_ud_param"},
	{"UcmECE", "struct rdma_ucm_ece"},
	{"UcmConnect", "struct rdma_ucm_connect"},
	{"UcmListen", "struct rdma_ucm_listen"},
	{"UcmAccept", "struct rdma_ucm_accept"},
	{"UcmReject", "struct rdma_ucm_reject"},
	{"UcmDisconnect", "struct rdma_ucm_disconnect"},
	{"UcmInitQPAttr", "struct rdma_ucm_init_qp_attr"},
	{"UcmNotify", "struct rdma_ucm_notify"},
	{"UcmJoinMcast", "struct rdma_ucm_join_mcast"},
	{"UcmJoinIPMcast", "struct rdma_ucm_join_ip_mcast"},
	{"UcmGetEvent", "struct rdma_ucm_get_event"},
	{"UcmEventResp", "struct rdma_ucm_event_resp"},
	{"UcmSetOption", "struct rdma_ucm_set_option"},
}

// offsets are byte offsets the data path needs inside unions and flexible
// arrays, which cgo -godefs cannot name.
var offsets = [][3]string{
	{"RxeSendWqeOffWrID", "struct rxe_send_wqe", "wr.wr_id"},
	{"RxeSendWqeOffOpcode", "struct rxe_send_wqe", "wr.opcode"},
	{"RxeSendWqeOffSendFlags", "struct rxe_send_wqe", "wr.send_flags"},
	{"RxeSendWqeOffImm", "struct rxe_send_wqe", "wr.ex.imm_data"},
	{"RxeSendWqeOffWr", "struct rxe_send_wqe", "wr.wr"},
	{"RxeSendWqeOffStatus", "struct rxe_send_wqe", "status"},
	{"RxeSendWqeOffIova", "struct rxe_send_wqe", "iova"},
	{"RxeSendWqeOffDMA", "struct rxe_send_wqe", "dma"},
	{"RxeSendWqeOffData", "struct rxe_send_wqe", "dma.sge"},
	{"RxeRecvWqeOffDMA", "struct rxe_recv_wqe", "dma"},
	{"RxeRecvWqeOffData", "struct rxe_recv_wqe", "dma.sge"},
	{"RxeQueueBufOffProducer", "struct rxe_queue_buf", "producer_index"},
	{"RxeQueueBufOffConsumer", "struct rxe_queue_buf", "consumer_index"},
	{"RxeQueueBufOffData", "struct rxe_queue_buf", "data"},
	{"UcmEventRespOffParam", "struct rdma_ucm_event_resp", "param"},
}

var (
	enumBlock  = regexp.MustCompile(`(?s)\benum\b[^{;]*\{(.*?)\}`)
	enumMember = regexp.MustCompile(`^\s*([A-Z][A-Z0-9_]*)\s*(=|,|$)`)
)

func main() {
	include := flag.String("include", "/usr/include", "directory that holds rdma/*.h")
	out := flag.String("o", "ztypes_linux.go", "output file")
	list := flag.Bool("headers", false, "print the headers read, one a line, and exit (scripts/abi checks uapi.lock against them)")
	flag.Parse()
	if *list {
		fmt.Println(strings.Join(headers, "\n"))
		return
	}
	if err := run(*include, *out); err != nil {
		fmt.Fprintln(os.Stderr, "mkztypes:", err)
		os.Exit(1)
	}
}

func run(include, out string) error {
	seen := map[string]bool{}
	var consts []string
	for _, h := range headers {
		src, err := os.ReadFile(filepath.Join(include, h))
		if err != nil {
			return fmt.Errorf("read header (install linux-libc-dev): %w", err)
		}
		src = stripComments(src)
		for _, m := range enumBlock.FindAllSubmatch(src, -1) {
			sc := bufio.NewScanner(bytes.NewReader(m[1]))
			for sc.Scan() {
				if mm := enumMember.FindStringSubmatch(sc.Text()); mm != nil && !seen[mm[1]] {
					seen[mm[1]] = true
					consts = append(consts, mm[1])
				}
			}
		}
	}
	for _, d := range defines {
		if !seen[d] {
			seen[d] = true
			consts = append(consts, d)
		}
	}
	sort.Strings(consts)

	var in bytes.Buffer
	in.WriteString("//go:build ignore\n\npackage ioctl\n\n/*\n#include <stddef.h>\n#include <linux/types.h>\n")
	for _, h := range headers {
		fmt.Fprintf(&in, "#include <%s>\n", h)
	}
	in.WriteString(`typedef typeof(((struct rxe_send_wr *)0)->wr.rdma) goverbs_rxe_wr_rdma;
typedef typeof(((struct rxe_send_wr *)0)->wr.atomic) goverbs_rxe_wr_atomic;
typedef typeof(((struct rxe_send_wr *)0)->wr.ud) goverbs_rxe_wr_ud;
typedef typeof(((struct rxe_send_wr *)0)->wr.mw) goverbs_rxe_wr_mw;
enum {
`)
	for _, o := range offsets {
		fmt.Fprintf(&in, "\tgoverbs_%s = offsetof(%s, %s),\n", o[0], o[1], o[2])
	}
	for _, t := range types {
		fmt.Fprintf(&in, "\tgoverbs_Sizeof%s = sizeof(%s),\n", t[0], t[1])
	}
	in.WriteString("};\n*/\nimport \"C\"\n\nconst (\n")
	for _, c := range consts {
		fmt.Fprintf(&in, "\t%s = C.%s\n", c, c)
	}
	for _, o := range offsets {
		fmt.Fprintf(&in, "\t%s = C.goverbs_%s\n", o[0], o[0])
	}
	for _, t := range types {
		fmt.Fprintf(&in, "\tSizeof%s = C.goverbs_Sizeof%s\n", t[0], t[0])
	}
	in.WriteString(")\n\n")
	for _, t := range types {
		ct := t[1]
		if rest, ok := strings.CutPrefix(ct, "struct "); ok {
			ct = "struct_" + rest
		}
		fmt.Fprintf(&in, "type %s C.%s\n", t[0], ct)
	}

	dir, err := os.MkdirTemp("", "mkztypes")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	inFile := filepath.Join(dir, "types_linux.go")
	if err := os.WriteFile(inFile, in.Bytes(), 0o644); err != nil {
		return err
	}
	// -objdir is a prefix to cgo (its gcc output is objdir+"_cgo_2.o"):
	// without the separator that file lands beside dir, in /tmp, and stays.
	cmd := exec.Command("go", "tool", "cgo", "-godefs", "-objdir", dir+string(filepath.Separator), inFile)
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-I"+include)
	gen, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("go tool cgo -godefs: %w", err)
	}
	// cgo -godefs names the input file and the command line in its header; the
	// header below is stable across machines instead.
	if i := bytes.Index(gen, []byte("package ioctl")); i >= 0 {
		gen = gen[i:]
	}
	// Nested structs refer to each other by their C names; use the Go names.
	for _, t := range types {
		if rest, ok := strings.CutPrefix(t[1], "struct "); ok {
			gen = regexp.MustCompile(`\bstruct_`+rest+`\b`).ReplaceAll(gen, []byte(t[0]))
		}
	}
	var buf bytes.Buffer
	buf.WriteString("// Code generated by ioctl/internal/mkztypes from the kernel's rdma uapi headers; DO NOT EDIT.\n\n//go:build linux\n\n")
	buf.Write(gen)
	src, err := format.Source(buf.Bytes())
	if err != nil {
		return fmt.Errorf("gofmt generated code: %w", err)
	}
	return os.WriteFile(out, src, 0o644)
}

// stripComments removes C comments so that enum members inside them are not
// taken for real ones.
func stripComments(src []byte) []byte {
	src = regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAll(src, nil)
	return regexp.MustCompile(`//[^\n]*`).ReplaceAll(src, nil)
}
