package probe

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/goverbs/goverbs/internal/sentinel"
)

// Options select what Attach counts.
type Options struct {
	// PIDs restricts the uverbs command probes and the completion channel
	// reads of cq-events to these processes; empty means every process.
	// The rxe probes and the events raised always see the whole kernel.
	PIDs []int
	// Skip names probes (see Status.Name) not to attach.
	Skip []string
	// PerPacket also attaches the probes that run for every packet and
	// every completion rxe handles (rxe-packets, rxe-retransmits,
	// rxe-completions: per-QP packet, retry and CQE counts). They cost
	// latency on the data path (docs/perf.md), so they are off unless
	// asked for; without them rxe's own per-device hw_counters still give
	// packet and retry counts.
	PerPacket bool
}

// Status says whether one probe is attached and, if not, why.
type Status struct {
	Name     string `json:"name"`
	What     string `json:"what"`
	Attached bool   `json:"attached"`
	// Via is how it is attached: "fentry/fexit" (BPF trampolines, the
	// cheapest), "kprobes" or "raw tracepoints".
	Via string `json:"via,omitempty"`
	// Reason says why it is not attached or, when it is, why a cheaper
	// way failed.
	Reason string `json:"reason,omitempty"`
	// PerPacket marks the probes that run for every packet or CQE and
	// attach only with Options.PerPacket.
	PerPacket bool `json:"per_packet,omitempty"`
}

// Probes owns the maps, programs and links of one Attach.
type Probes struct {
	mu      sync.Mutex
	maps    map[string]*ebpf.Map
	mapErrs map[string]error // optional maps the kernel could not create
	progs   []*ebpf.Program
	links   []link.Link
	status  []Status
	closed  bool
	devs    map[uint32]string // uverbs minor -> device name
	started time.Time
	fdDrops uint64 // uverbs fds found at Attach that gv_fds had no room for
}

// probeDef is one probe: programs that attach together.
type probeDef struct {
	name, what string
	rxe        bool // needs rdma_rxe's BTF
	uverbs     bool // needs ib_uverbs' BTF (or, with raw, not)
	perPacket  bool // runs per packet or CQE: only with Options.PerPacket
	// progs builds the programs for offsets meant for fentry/fexit or for
	// kprobes (see rxeOffsets.tracing); it is called with nil offsets when
	// the BTF is missing or kprobes are not supported, and returns nil if
	// it cannot do without them.
	progs func(o *rxeOffsets, u *uverbsOffsets) []progDef
}

// progDef is one program. An entry program attaches as fentry or kprobe,
// an exit program as fexit or kretprobe, whichever way Attach is trying.
type progDef struct {
	name   string
	raw    bool   // a raw tracepoint program
	exit   bool   // runs when target returns
	target string // tracepoint name or kernel function
	insns  asm.Instructions
}

func rawTP(name, event string, insns asm.Instructions) progDef {
	return progDef{name: name, raw: true, target: event, insns: insns}
}

func entry(name, fn string, insns asm.Instructions) progDef {
	return progDef{name: name, target: fn, insns: insns}
}

func exit(name, fn string, insns asm.Instructions) progDef {
	return progDef{name: name, exit: true, target: fn, insns: insns}
}

var probeDefs = []probeDef{
	{name: "uverbs-commands", what: "uverbs commands per process: RDMA_VERBS_IOCTL by object/method and write() commands (POST_SEND is the rxe doorbell), with latency histograms; on ib_uverbs_write and ib_uverbs_ioctl, or, without kprobes or ib_uverbs BTF, on every system call (raw tracepoints sys_enter/sys_exit, per fd)", uverbs: true, progs: func(_ *rxeOffsets, u *uverbsOffsets) []progDef {
		if u == nil {
			return []progDef{
				rawTP("gv_sys_enter", "sys_enter", sysEnter(map[string]bool{"ioctl": true, "write": true, "openat": true, "close": true})),
				rawTP("gv_sys_exit", "sys_exit", sysExit()),
			}
		}
		return []progDef{
			entry("gv_uv_write", "ib_uverbs_write", uverbsCmdEnter(u, false)),
			exit("gv_uv_write_ret", "ib_uverbs_write", uverbsCmdExit(u, 4)),
			entry("gv_uv_ioctl", "ib_uverbs_ioctl", uverbsCmdEnter(u, true)),
			exit("gv_uv_ioctl_ret", "ib_uverbs_ioctl", uverbsCmdExit(u, 3)),
		}
	}},
	{name: "rxe-packets", what: "packets sent (rxe_xmit_packet) and received (rxe_resp_queue_pkt, rxe_comp_queue_pkt) per QP, and the NAKs received (PSN sequence error, RNR) among the latter", rxe: true, perPacket: true, progs: func(o *rxeOffsets, _ *uverbsOffsets) []progDef {
		return []progDef{
			entry("gv_rxe_xmit", "rxe_xmit_packet", kprobeQP(o, qpSent, 0)),
			entry("gv_rxe_resp_q", "rxe_resp_queue_pkt", kprobeQP(o, qpRecv, 0)),
			entry("gv_rxe_comp_q", "rxe_comp_queue_pkt", compQueue(o)),
		}
	}},
	{name: "rxe-retransmits", what: "requester retry passes (rxe_requester entered with need_retry) per QP", rxe: true, perPacket: true, progs: func(o *rxeOffsets, _ *uverbsOffsets) []progDef {
		return []progDef{entry("gv_rxe_retry", "rxe_requester", requesterEntry(o))}
	}},
	{name: "rxe-timeouts", what: "retransmit timer expiries (retransmit_timer) per QP", rxe: true, progs: func(o *rxeOffsets, _ *uverbsOffsets) []progDef {
		return []progDef{entry("gv_rxe_rto", "retransmit_timer", kprobeQP(o, qpTimeouts, o.retransTimer))}
	}},
	{name: "rxe-rnr", what: "RNR NAK timer expiries (rnr_nak_timer) per QP", rxe: true, progs: func(o *rxeOffsets, _ *uverbsOffsets) []progDef {
		return []progDef{entry("gv_rxe_rnr", "rnr_nak_timer", kprobeQP(o, qpRNRTimers, o.rnrNakTimer))}
	}},
	{name: "rxe-qp-errors", what: "QPs moved to the error state (rxe_qp_error)", rxe: true, progs: func(o *rxeOffsets, _ *uverbsOffsets) []progDef {
		return []progDef{entry("gv_rxe_qperr", "rxe_qp_error", kprobeQP(o, qpErrors, 0))}
	}},
	{name: "rxe-completions", what: "completions written to user CQs (rxe_cq_post) per QP: send, recv, error", rxe: true, perPacket: true, progs: func(o *rxeOffsets, _ *uverbsOffsets) []progDef {
		return []progDef{entry("gv_rxe_cqpost", "rxe_cq_post", cqPost(o))}
	}},
	{name: "cq-events", what: "completion events raised per device (ib_uverbs_comp_handler) and read from completion channels per process (ib_uverbs_comp_event_read), with the latency from raise to read as a log2 histogram", uverbs: true, progs: func(_ *rxeOffsets, u *uverbsOffsets) []progDef {
		if u == nil {
			return nil
		}
		// The handler's exit program first: a handler running while
		// they attach may then only be seen leaving (see compReadExit).
		defs := []progDef{
			exit("gv_comp_event_ret", "ib_uverbs_comp_handler", compHandlerExit()),
			entry("gv_comp_event", "ib_uverbs_comp_handler", compHandler(u)),
		}
		if u.fexit {
			return append(defs, exit("gv_comp_read_ret", "ib_uverbs_comp_event_read", compReadFexit(u)))
		}
		return append(defs,
			entry("gv_comp_read", "ib_uverbs_comp_event_read", compReadEnter(u)),
			exit("gv_comp_read_ret", "ib_uverbs_comp_event_read", compReadExit(u)),
		)
	}},
}

// noTracing makes Attach skip fentry/fexit, so that tests cover the
// kprobe programs too.
var noTracing bool

// mapSizes overrides maps' MaxEntries by name, so that tests can fill a
// map with a few entries.
var mapSizes map[string]uint32

// Names lists the probes Attach knows, in order.
func Names() []string {
	var n []string
	for _, d := range probeDefs {
		n = append(n, d.name)
	}
	return n
}

// maxPID is Linux's PID_MAX_LIMIT: no process id is above it.
const maxPID = 1 << 22

// maxPIDs is how many processes Options.PIDs may name (gv_pids' size).
const maxPIDs = 1024

// ErrNoBPF is returned by Attach when no probe at all could be attached.
var ErrNoBPF = errors.New("probe: no probe could be attached")

// Attach loads and attaches every probe the kernel supports. A probe the
// kernel cannot host (no kprobes, no rdma_rxe BTF, a missing symbol) is
// reported in Status with the reason and the others still attach; Attach
// fails only when nothing attached at all (then the error joins the
// reasons). A pid in Options.PIDs outside 1..2^22 (Linux's
// PID_MAX_LIMIT), more than 1024 distinct pids, and a name in
// Options.Skip that Names does not list are refused before anything is
// loaded.
func Attach(opts Options) (*Probes, error) {
	pids := map[int]bool{}
	for _, pid := range opts.PIDs {
		if pid < 1 || pid > maxPID {
			// As a uint32 key it would filter out every process.
			return nil, fmt.Errorf("probe: Options.PIDs: pid %d outside 1..%d", pid, maxPID)
		}
		pids[pid] = true
	}
	if len(pids) > maxPIDs {
		// gv_pids holds maxPIDs: the next Put would fail with E2BIG.
		return nil, fmt.Errorf("probe: Options.PIDs: %d distinct pids, at most %d", len(pids), maxPIDs)
	}
	for _, name := range opts.Skip {
		if !slices.ContainsFunc(probeDefs, func(d probeDef) bool { return d.name == name }) {
			// A misspelt name would leave its probe attached.
			return nil, fmt.Errorf("probe: Options.Skip: no probe %q (probes: %s)", name, strings.Join(Names(), ", "))
		}
	}
	_ = rlimit.RemoveMemlock() // kernels before 5.11 charge maps to RLIMIT_MEMLOCK
	p := &Probes{maps: map[string]*ebpf.Map{}, mapErrs: map[string]error{}, started: time.Now()}
	for name, spec := range mapSpecs() {
		if n, ok := mapSizes[name]; ok {
			spec.MaxEntries = n
		}
		m, err := ebpf.NewMap(spec)
		if err != nil && name == mapTStart {
			// Task storage (5.11+): the fentry command programs need it
			// and fall back to kprobes without it.
			p.mapErrs[name] = err
			continue
		}
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("probe: create map %s: %w", name, err)
		}
		p.maps[name] = m
	}
	if len(opts.PIDs) > 0 {
		for _, pid := range opts.PIDs {
			if err := p.maps[mapPids].Put(uint32(pid), uint8(1)); err != nil {
				p.Close()
				return nil, fmt.Errorf("probe: pid filter: %w", err)
			}
		}
		if err := p.maps[mapConfig].Put(uint32(0), uint32(1)); err != nil {
			p.Close()
			return nil, fmt.Errorf("probe: pid filter: %w", err)
		}
	}
	p.devs = uverbsDevices()

	var offs *rxeOffsets
	var uoffs *uverbsOffsets
	rxeErr := kprobesSupported()
	uverbsErr := rxeErr
	if rxeErr == nil {
		cache := btf.NewCache()
		offs, rxeErr = loadRxeOffsets(cache)
		uoffs, uverbsErr = loadUverbsOffsets(cache)
	}
	// The ways to attach, cheapest first: BPF trampolines, kprobes, and
	// for probes that can do without BTF, tracepoints.
	type way struct {
		via     string
		tracing bool
		o       *rxeOffsets
		u       *uverbsOffsets
	}
	ways := []way{{via: "fentry/fexit", tracing: true}, {via: "kprobes"}, {via: "raw tracepoints"}}
	if offs != nil {
		ways[0].o, ways[1].o = offs.tracing(), offs
	}
	if uoffs != nil {
		uoffs.pids = len(opts.PIDs) > 0
		ways[0].u, ways[1].u = uoffs.tracing(), uoffs
	}
	if noTracing {
		ways[0].o, ways[0].u = nil, nil
	}
	var reasons []error
	for _, d := range probeDefs {
		st := Status{Name: d.name, What: d.what, PerPacket: d.perPacket}
		var tried []string
		switch {
		case slices.Contains(opts.Skip, d.name):
			tried = append(tried, "skipped (Options.Skip)")
		case d.perPacket && !opts.PerPacket:
			tried = append(tried, "runs for every packet or completion: not asked for (Options.PerPacket, goverbs top --per-packet)")
		case d.rxe && rxeErr != nil:
			tried = append(tried, rxeErr.Error())
		default:
			for i, w := range ways {
				if (d.rxe && w.o == nil) || (d.uverbs && w.u == nil && i < 2) {
					continue
				}
				defs := d.progs(w.o, w.u)
				if defs == nil {
					continue
				}
				if err := p.attach(defs, w.tracing); err != nil {
					tried = append(tried, w.via+": "+err.Error())
					continue
				}
				st.Attached, st.Via = true, w.via
				if d.name == "uverbs-commands" && w.u == nil { // on the raw tracepoints
					// The tracepoint programs know uverbs fds from
					// openat; these processes opened theirs before.
					for k, minor := range scanUverbsFDs() {
						if p.maps[mapFDs].Put(k, minor) != nil {
							p.fdDrops++ // as the programs' own failed inserts
						}
					}
				}
				break
			}
			if !st.Attached && d.uverbs && uverbsErr != nil {
				tried = append(tried, uverbsErr.Error())
			}
		}
		st.Reason = strings.Join(tried, "; ")
		if !st.Attached {
			reasons = append(reasons, fmt.Errorf("%s: %s", st.Name, st.Reason))
		}
		p.status = append(p.status, st)
	}
	for _, st := range p.status {
		if st.Attached {
			return p, nil
		}
	}
	p.Close()
	return nil, fmt.Errorf("%w: %w", ErrNoBPF, errors.Join(reasons...))
}

// attach loads and attaches one probe's programs, all or nothing; entry
// and exit programs as fentry and fexit with tracing, else as kprobes and
// kretprobes.
func (p *Probes) attach(defs []progDef, tracing bool) error {
	var progs []*ebpf.Program
	var links []link.Link
	fail := func(err error) error {
		for _, l := range links {
			l.Close()
		}
		for _, pr := range progs {
			pr.Close()
		}
		return err
	}
	for _, d := range defs {
		insns := slices.Clone(d.insns)
		for i := range insns {
			if ref := insns[i].Reference(); ref != "" && insns[i].IsLoadFromMap() {
				m, ok := p.maps[ref]
				if !ok && p.mapErrs[ref] != nil {
					return fail(fmt.Errorf("%s: map %s: %w", d.name, ref, p.mapErrs[ref]))
				}
				if !ok {
					return fail(fmt.Errorf("%s: unknown map %s", d.name, ref))
				}
				if err := insns[i].AssociateMap(m); err != nil {
					return fail(fmt.Errorf("%s: %w", d.name, err))
				}
			}
		}
		spec := &ebpf.ProgramSpec{
			Name:         d.name,
			Type:         ebpf.Kprobe,
			Instructions: insns,
			License:      "Dual MIT/GPL",
		}
		switch {
		case d.raw:
			spec.Type = ebpf.RawTracepoint
		case tracing:
			spec.Type, spec.AttachType, spec.AttachTo = ebpf.Tracing, ebpf.AttachTraceFEntry, d.target
			if d.exit {
				spec.AttachType = ebpf.AttachTraceFExit
			}
		}
		prog, err := ebpf.NewProgram(spec)
		if err != nil {
			return fail(fmt.Errorf("load %s: %w", d.name, err))
		}
		progs = append(progs, prog)
		var l link.Link
		switch {
		case d.raw:
			l, err = link.AttachRawTracepoint(link.RawTracepointOptions{Name: d.target, Program: prog})
		case tracing:
			l, err = link.AttachTracing(link.TracingOptions{Program: prog})
		case d.exit:
			l, err = link.Kretprobe(d.target, prog, nil)
		default:
			l, err = link.Kprobe(d.target, prog, nil)
		}
		if err != nil {
			return fail(fmt.Errorf("attach %s to %s: %w", d.name, d.target, err))
		}
		links = append(links, l)
	}
	p.progs = append(p.progs, progs...)
	p.links = append(p.links, links...)
	return nil
}

// kprobesSupported says why kprobes cannot attach, or nil.
func kprobesSupported() error {
	for _, f := range []string{
		"/sys/bus/event_source/devices/kprobe/type",
		"/sys/kernel/tracing/kprobe_events",
		"/sys/kernel/debug/tracing/kprobe_events",
	} {
		if _, err := os.Stat(f); err == nil {
			return nil
		}
	}
	return errors.New("kernel has no kprobes (no kprobe PMU in /sys/bus/event_source/devices, no kprobe_events in tracefs: CONFIG_KPROBES/CONFIG_KPROBE_EVENTS off)")
}

// Status reports every probe, attached or not.
func (p *Probes) Status() []Status {
	if p.bad() {
		return nil
	}
	return slices.Clone(p.status)
}

// Attached reports whether the named probe is attached.
func (p *Probes) Attached(name string) bool {
	if p.bad() {
		return false
	}
	for _, s := range p.status {
		if s.Name == name {
			return s.Attached
		}
	}
	return false
}

// Close detaches every probe and frees the maps. It is idempotent.
func (p *Probes) Close() error {
	if p.bad() {
		return errNilProbes
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	for _, l := range p.links {
		errs = append(errs, l.Close())
	}
	for _, pr := range p.progs {
		errs = append(errs, pr.Close())
	}
	for _, m := range p.maps {
		errs = append(errs, m.Close())
	}
	return errors.Join(errs...)
}

// ErrClosed is returned by Snapshot after Close. It is goverbs.ErrClosed
// for errors.Is.
var ErrClosed = sentinel.Closed("probe: closed")

// Command is one uverbs command of one process and fd: cumulative count,
// errors and latency since Attach.
type Command struct {
	PID     int      `json:"pid"`
	FD      int      `json:"fd"`             // -1 when counted on ib_uverbs_write/ioctl, which see the file, not the fd
	Device  string   `json:"device"`         // "" when the fd was not seen opening a uverbs device
	Kind    string   `json:"kind"`           // "ioctl" or "write"
	Object  uint16   `json:"object"`         // ioctl: UVERBS_OBJECT_*
	Method  uint16   `json:"method"`         // ioctl: the object's method id
	Cmd     uint32   `json:"cmd"`            // write: IB_USER_VERBS_CMD_* (with the extended flag)
	Name    string   `json:"name"`           // e.g. "write POST_SEND", "ioctl CQ/1"
	Count   uint64   `json:"count"`          // calls
	Errors  uint64   `json:"errors"`         // calls that returned an error
	TotalNS uint64   `json:"total_ns"`       // sum of latencies
	Hist    []uint64 `json:"hist,omitempty"` // Hist[i]: calls that took [2^i, 2^(i+1)) ns
}

// Doorbell reports whether the command is rxe's doorbell (write POST_SEND).
func (c *Command) Doorbell() bool { return c != nil && c.Kind == "write" && c.Cmd == postSendCmd }

const postSendCmd = 0x1c // IB_USER_VERBS_CMD_POST_SEND

// QP is what the rxe probes saw of one queue pair since Attach.
type QP struct {
	Device           string `json:"device"`
	QPN              uint32 `json:"qpn"`
	SentPkts         uint64 `json:"sent_pkts"`
	RecvPkts         uint64 `json:"recv_pkts"`
	Retransmits      uint64 `json:"retransmits"`       // requester retry passes (go-back-N restarts)
	Timeouts         uint64 `json:"timeouts"`          // retransmit timer expiries
	RNRTimers        uint64 `json:"rnr_timers"`        // RNR NAK timer expiries
	QPErrors         uint64 `json:"qp_errors"`         // transitions to the error state
	SendCompletions  uint64 `json:"send_completions"`  // successful send-side CQEs
	RecvCompletions  uint64 `json:"recv_completions"`  // successful receive CQEs
	ErrorCompletions uint64 `json:"error_completions"` // CQEs with a non-zero status
	SeqNaks          uint64 `json:"seq_naks"`          // NAK PSN sequence errors received (the peer saw a gap)
	RNRNaks          uint64 `json:"rnr_naks"`          // RNR NAKs received (the peer had no receive posted)
}

// CQEvents is what the cq-events probe saw of one process's completion
// channel reads on one device since Attach: the events it read and, for
// each, the time from the kernel raising it (ib_uverbs_comp_handler, run
// when an armed CQ got a completion) to the read() that returned it.
type CQEvents struct {
	PID    int    `json:"pid"`
	Device string `json:"device"` // "" for reads of a queue no event was seen raised on (before Attach)
	// Count is the events read that were paired with the event raised.
	Count uint64 `json:"count"`
	// Unmatched is the events read that could not be paired (raised
	// before Attach, more than 16 events behind the newest, or the
	// queue's record was evicted); they have no latency.
	Unmatched uint64   `json:"unmatched"`
	TotalNS   uint64   `json:"total_ns"`       // sum of latencies
	Hist      []uint64 `json:"hist,omitempty"` // Hist[i]: events read [2^i, 2^(i+1)) ns after they were raised
}

// Snapshot is the probes' cumulative counters at one time.
type Snapshot struct {
	Time     time.Time  `json:"time"`
	Commands []Command  `json:"commands"`
	QPs      []QP       `json:"qps"`
	CQEvents []CQEvents `json:"cq_events"`
	// EventsRaised is the completion events ib_uverbs raised per device
	// (cq-events); events of closed channels are not counted.
	EventsRaised map[string]uint64 `json:"events_raised"`
	// Dropped is, per map (its name as bpftool shows it: gv_cmds,
	// gv_qps, gv_events, gv_raised, gv_start, gv_fds, gv_pending,
	// gv_evread, gv_evq), the inserts since Attach that failed (a full
	// map, almost always; any error of bpf_map_update_elem counts, e.g.
	// EBUSY of a bucket lock taken by a nested program); nil when there
	// were none. Each one is a count
	// missing from the others: a command, QP, event or device not
	// counted (gv_cmds, gv_qps, gv_events, gv_raised), a command not
	// timed (gv_start), an fd whose commands have no device (gv_fds,
	// gv_pending), a completion channel read not counted (gv_evread).
	Dropped map[string]uint64 `json:"dropped,omitempty"`
}

// Snapshot reads the maps.
func (p *Probes) Snapshot() (*Snapshot, error) {
	if p.bad() {
		return nil, errNilProbes
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	s := &Snapshot{Time: time.Now()}
	var err error
	if s.Commands, err = readAll(p, mapCmds, cmdKeySize, 8*cmdValWords, p.decodeCmd); err != nil {
		return nil, err
	}
	if s.QPs, err = readAll(p, mapQPs, qpKeySize, 8*qpValWords, decodeQP); err != nil {
		return nil, err
	}
	if s.CQEvents, err = readAll(p, mapEvents, evKeySize, 8*evValWords, decodeEvents); err != nil {
		return nil, err
	}
	type raised struct {
		dev string
		n   uint64
	}
	rs, err := readAll(p, mapRaised, qpNameLen, 8, func(k, v []byte) raised {
		return raised{cString(k), binary.LittleEndian.Uint64(v)}
	})
	if err != nil {
		return nil, err
	}
	s.EventsRaised = map[string]uint64{}
	for _, r := range rs {
		s.EventsRaised[r.dev] += r.n
	}
	if s.Dropped, err = p.dropped(); err != nil {
		return nil, err
	}
	slices.SortFunc(s.Commands, compareCommands)
	slices.SortFunc(s.CQEvents, func(a, b CQEvents) int {
		if a.PID != b.PID {
			return a.PID - b.PID
		}
		return strings.Compare(a.Device, b.Device)
	})
	slices.SortFunc(s.QPs, func(a, b QP) int {
		if a.Device != b.Device {
			if a.Device < b.Device {
				return -1
			}
			return 1
		}
		return int(a.QPN) - int(b.QPN)
	})
	return s, nil
}

// dropped reads gv_drops: the failed inserts per map, only maps with
// some, nil if none.
func (p *Probes) dropped() (map[string]uint64, error) {
	var d map[string]uint64
	add := func(name string, n uint64) {
		if n == 0 {
			return
		}
		if d == nil {
			d = map[string]uint64{}
		}
		d[name] += n
	}
	for i, name := range dropMaps {
		var n uint64
		if err := p.maps[mapDrops].Lookup(uint32(i), &n); err != nil {
			return nil, fmt.Errorf("probe: read %s: %w", mapDrops, err)
		}
		add(name, n)
	}
	add(mapFDs, p.fdDrops)
	return d, nil
}

// compareCommands orders a Snapshot's Commands by process, fd, device,
// kind and command: every field of the gv_cmds key, so that no two
// entries compare equal and the order is the same in every Snapshot
// (with fentry every fd is -1, and a write and an ioctl, or a command
// and its extended form, may share the other numbers).
func compareCommands(a, b Command) int {
	return cmp.Or(
		cmp.Compare(a.PID, b.PID),
		cmp.Compare(a.FD, b.FD),
		strings.Compare(a.Device, b.Device),
		strings.Compare(a.Kind, b.Kind),
		cmp.Compare(a.Object, b.Object),
		cmp.Compare(a.Method, b.Method),
		cmp.Compare(a.Cmd, b.Cmd),
	)
}

// readAll decodes every entry of the map name (keys and values of the
// given sizes).
func readAll[T any](p *Probes, name string, keySize, valSize int, decode func(k, v []byte) T) ([]T, error) {
	k, v := make([]byte, keySize), make([]byte, valSize)
	var out []T
	it := p.maps[name].Iterate()
	for it.Next(k, v) {
		out = append(out, decode(k, v))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("probe: read %s: %w", name, err)
	}
	return out, nil
}

// decodeHist decodes a log2 histogram of numBuckets u64 words.
func decodeHist(v []byte) []uint64 {
	h := make([]uint64, numBuckets)
	for i := range h {
		h[i] = binary.LittleEndian.Uint64(v[8*i:])
	}
	return h
}

func (p *Probes) decodeCmd(k, v []byte) Command {
	le := binary.LittleEndian
	devKind := le.Uint32(k[8:])
	c := Command{
		PID: int(le.Uint32(k[0:])),
		FD:  int(int32(le.Uint32(k[4:]))),
	}
	cmd := le.Uint32(k[12:])
	if minor := devKind & 0xffff; minor != unknownDev {
		c.Device = p.devs[minor]
		if c.Device == "" {
			p.devs = uverbsDevices() // a device added since Attach
			c.Device = p.devs[minor]
		}
		if c.Device == "" && minor&devMinorFlag != 0 {
			c.Device = fmt.Sprintf("uverbs char device minor %d", minor&(devMinorFlag-1))
		} else if c.Device == "" {
			c.Device = fmt.Sprintf("uverbs%d", minor)
		}
	}
	switch devKind >> 16 {
	case kindIoctl:
		c.Kind = "ioctl"
		c.Object, c.Method = uint16(cmd>>16), uint16(cmd)
	case kindWrite:
		c.Kind = "write"
		c.Cmd = cmd
	}
	c.Name = CommandName(c.Kind, c.Object, c.Method, c.Cmd)
	c.Count = le.Uint64(v[0:])
	c.Errors = le.Uint64(v[8:])
	c.TotalNS = le.Uint64(v[16:])
	c.Hist = decodeHist(v[24:])
	return c
}

// cString is b up to its first NUL.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

func decodeEvents(k, v []byte) CQEvents {
	le := binary.LittleEndian
	return CQEvents{
		Device:    cString(k[:qpNameLen]),
		PID:       int(le.Uint32(k[qpNameLen:])),
		Count:     le.Uint64(v[0:]),
		Unmatched: le.Uint64(v[8:]),
		TotalNS:   le.Uint64(v[16:]),
		Hist:      decodeHist(v[24:]),
	}
}

func decodeQP(k, v []byte) QP {
	le := binary.LittleEndian
	w := func(i int) uint64 { return le.Uint64(v[8*i:]) }
	return QP{
		Device:           cString(k[:qpNameLen]),
		QPN:              le.Uint32(k[qpNameLen:]),
		SentPkts:         w(qpSent),
		RecvPkts:         w(qpRecv),
		Retransmits:      w(qpRetries),
		Timeouts:         w(qpTimeouts),
		RNRTimers:        w(qpRNRTimers),
		QPErrors:         w(qpErrors),
		SendCompletions:  w(qpSendCompletions),
		RecvCompletions:  w(qpRecvCompletions),
		ErrorCompletions: w(qpErrorCompletions),
		SeqNaks:          w(qpSeqNaks),
		RNRNaks:          w(qpRNRNaks),
	}
}
