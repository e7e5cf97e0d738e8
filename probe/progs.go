package probe

import (
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// The BPF programs are written in Go with cilium/ebpf's asm package, so
// building goverbs needs no C toolchain and nothing is generated: they are
// small counters (hash maps of counters and log2 histograms), and the
// offsets of rxe's and ib_uverbs' structures are read from the running
// kernel's BTF at load time (btf.go) and built in as constants.
//
// Where to read them:
//
//   - insns.go: the builders every program is made of (map lookup and
//     update, lookup-or-insert, the pid filter, kernel reads, the log2
//     histogram), each documented by the C it stands for, and the
//     conventions for registers and stack slots;
//   - cmds.go: the uverbs-commands probe (the ib_uverbs_ioctl and
//     ib_uverbs_write hooks, or the syscall tracepoints);
//   - rxe.go: the per-QP rxe probes (packets, NAKs, retries, timers,
//     errors, completions);
//   - events.go: the cq-events probe (completion events from raise to
//     read).
//
// Every program's comment gives it in C-like pseudocode, and the code
// follows that pseudocode line by line; the stack slots it uses are named
// constants. probe.go lists which programs each probe attaches, where.

// Map names. They are also the names the kernel shows (bpftool map).
const (
	mapConfig  = "gv_config"  // array[1] u32: 1 = count only the pids in gv_pids
	mapPids    = "gv_pids"    // hash tgid -> u8
	mapFDs     = "gv_fds"     // hash {tgid, fd} -> u32 uverbs minor index (the N in uverbsN)
	mapPending = "gv_pending" // hash pid_tgid -> u32: openat of uverbsN in flight
	mapStart   = "gv_start"   // hash pid_tgid -> startVal: a uverbs syscall in flight
	mapTStart  = "gv_tstart"  // task storage -> startVal (stamp 0: none in flight), for fentry/fexit
	mapCmds    = "gv_cmds"    // hash cmdKey -> cmdVal
	mapQPs     = "gv_qps"     // hash qpKey -> qpVal
	// cq-events: see compHandler, compReadEnter, compReadExit.
	mapEvQueues = "gv_evq"    // LRU hash ev_queue pointer -> {raised, consumed, name[16], stamps[evRing]}
	mapEvRead   = "gv_evread" // hash pid_tgid -> ev_queue: a completion channel read in flight
	mapEvents   = "gv_events" // hash evKey {name[16], tgid, pad} -> evVal
	mapRaised   = "gv_raised" // hash device name[16] -> u64 events raised
	mapEvInfl   = "gv_evinfl" // array[1] s64: ib_uverbs_comp_handler calls in flight
	mapDrops    = "gv_drops"  // array[len(dropMaps)] u64: failed inserts per map (countDrop)
	maxEntries  = 16384
	cmdKeySize  = 16
	startSize   = 24
	qpKeySize   = 24
	qpNameLen   = 16
	numBuckets  = 40 // log2(ns) buckets: bucket i counts [2^i, 2^(i+1)) ns
	cmdValWords = 3 + numBuckets
	qpValWords  = numQPCounters
	evKeySize   = 24
	evValWords  = 3 + numBuckets // matched reads, unmatched reads, total ns, histogram
)

// ioctl commands and write() command headers.
const (
	rdmaVerbsIoctl = 0xc0181b01 // _IOWR(0x1b, 1, struct ib_uverbs_ioctl_hdr)
	kindIoctl      = 1
	kindWrite      = 2
	unknownDev     = 0xffff
	// devMinorFlag marks a device field that holds the uverbs char
	// device's minor (i_rdev, from the fentry programs) rather than the
	// N of uverbsN.
	devMinorFlag = 0x8000
	writeCmdMask = 0x800000ff // IB_USER_VERBS_CMD_FLAG_EXTENDED | IB_USER_VERBS_CMD_COMMAND_MASK
)

// Per-QP counters, in the order of the u64 words of a gv_qps value.
const (
	qpSent = iota
	qpRecv
	qpRetries
	qpTimeouts
	qpRNRTimers
	qpErrors
	qpSendCompletions
	qpRecvCompletions
	qpErrorCompletions
	qpSeqNaks // NAK PSN sequence error received
	qpRNRNaks // RNR NAK received
	numQPCounters
)

// dropMaps are the maps the programs insert keys into, in the order of
// gv_drops' counters: an insert that fails (the map is full) adds 1 to
// gv_drops[i] for dropMaps[i] (countDrop), and Snapshot.Dropped reports
// them, so that counts that are low because a map filled up say so.
// gv_evq is an LRU map: it evicts rather than fails.
var dropMaps = []string{mapCmds, mapQPs, mapEvents, mapRaised, mapStart, mapFDs, mapPending, mapEvRead, mapEvQueues}

// dropIndex is name's index in dropMaps, its gv_drops key.
func dropIndex(name string) int {
	i := slices.Index(dropMaps, name)
	if i < 0 {
		panic("probe: countDrop of " + name + ", not in dropMaps")
	}
	return i
}

func mapSpecs() map[string]*ebpf.MapSpec {
	return map[string]*ebpf.MapSpec{
		mapConfig:   {Name: mapConfig, Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1},
		mapPids:     {Name: mapPids, Type: ebpf.Hash, KeySize: 4, ValueSize: 1, MaxEntries: maxPIDs},
		mapFDs:      {Name: mapFDs, Type: ebpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: maxEntries},
		mapPending:  {Name: mapPending, Type: ebpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: 1024},
		mapStart:    {Name: mapStart, Type: ebpf.Hash, KeySize: 8, ValueSize: startSize, MaxEntries: maxEntries},
		mapCmds:     {Name: mapCmds, Type: ebpf.Hash, KeySize: cmdKeySize, ValueSize: 8 * cmdValWords, MaxEntries: maxEntries},
		mapQPs:      {Name: mapQPs, Type: ebpf.Hash, KeySize: qpKeySize, ValueSize: 8 * qpValWords, MaxEntries: maxEntries},
		mapEvQueues: {Name: mapEvQueues, Type: ebpf.LRUHash, KeySize: 8, ValueSize: evqSize, MaxEntries: 4096},
		mapEvRead:   {Name: mapEvRead, Type: ebpf.Hash, KeySize: 8, ValueSize: 8, MaxEntries: 1024},
		mapEvents:   {Name: mapEvents, Type: ebpf.Hash, KeySize: evKeySize, ValueSize: 8 * evValWords, MaxEntries: maxEntries},
		mapRaised:   {Name: mapRaised, Type: ebpf.Hash, KeySize: qpNameLen, ValueSize: 8, MaxEntries: 1024},
		mapEvInfl:   {Name: mapEvInfl, Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1},
		mapDrops:    {Name: mapDrops, Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: uint32(len(dropMaps))},
		// Local storage maps need BTF: an int key, here a u64[3] value.
		mapTStart: {Name: mapTStart, Type: ebpf.TaskStorage, KeySize: 4, ValueSize: startSize, Flags: unix.BPF_F_NO_PREALLOC,
			Key:   &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed},
			Value: &btf.Array{Index: &btf.Int{Name: "u32", Size: 4}, Type: &btf.Int{Name: "u64", Size: 8}, Nelems: startSize / 8}},
	}
}
