package probe

import "fmt"

var objectNames = map[uint16]string{
	0x0: "DEVICE", 0x1: "PD", 0x2: "COMP_CHANNEL", 0x3: "CQ", 0x4: "QP", 0x5: "SRQ",
	0x6: "AH", 0x7: "MR", 0x8: "MW", 0x9: "FLOW", 0xa: "XRCD", 0xb: "RWQ_IND_TBL",
	0xc: "WQ", 0xd: "FLOW_ACTION", 0xe: "DM", 0xf: "COUNTERS", 0x10: "ASYNC_EVENT",
}

var writeNames = map[uint32]string{
	0x0: "GET_CONTEXT", 0x1: "QUERY_DEVICE", 0x2: "QUERY_PORT", 0x3: "ALLOC_PD", 0x4: "DEALLOC_PD",
	0x5: "CREATE_AH", 0x6: "MODIFY_AH", 0x7: "QUERY_AH", 0x8: "DESTROY_AH", 0x9: "REG_MR",
	0xa: "REG_SMR", 0xb: "REREG_MR", 0xc: "QUERY_MR", 0xd: "DEREG_MR", 0xe: "ALLOC_MW",
	0xf: "BIND_MW", 0x10: "DEALLOC_MW", 0x11: "CREATE_COMP_CHANNEL", 0x12: "CREATE_CQ",
	0x13: "RESIZE_CQ", 0x14: "DESTROY_CQ", 0x15: "POLL_CQ", 0x16: "PEEK_CQ", 0x17: "REQ_NOTIFY_CQ",
	0x18: "CREATE_QP", 0x19: "QUERY_QP", 0x1a: "MODIFY_QP", 0x1b: "DESTROY_QP", 0x1c: "POST_SEND",
	0x1d: "POST_RECV", 0x1e: "ATTACH_MCAST", 0x1f: "DETACH_MCAST", 0x20: "CREATE_SRQ",
	0x21: "MODIFY_SRQ", 0x22: "QUERY_SRQ", 0x23: "DESTROY_SRQ", 0x24: "POST_SRQ_RECV",
	0x25: "OPEN_XRCD", 0x26: "CLOSE_XRCD", 0x27: "CREATE_XSRQ", 0x28: "OPEN_QP",
}

// CommandName names a uverbs command: "write POST_SEND", "ioctl CQ/0x1".
// Method ids are per object and mostly driver-visible numbers, so they are
// shown as numbers, except INVOKE_WRITE (DEVICE/0x0).
func CommandName(kind string, object, method uint16, cmd uint32) string {
	switch kind {
	case "write":
		ext := ""
		if cmd&0x80000000 != 0 {
			ext = "EX_"
		}
		if n, ok := writeNames[cmd&0xff]; ok && ext == "" {
			return "write " + n
		}
		return fmt.Sprintf("write %s0x%x", ext, cmd&0xff)
	case "ioctl":
		o, ok := objectNames[object]
		if !ok {
			o = fmt.Sprintf("0x%x", object)
		}
		if object == 0 && method == 0 {
			return "ioctl DEVICE/INVOKE_WRITE"
		}
		return fmt.Sprintf("ioctl %s/0x%x", o, method)
	}
	return "?"
}
