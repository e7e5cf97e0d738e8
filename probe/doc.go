// Package probe watches the RDMA path from inside the kernel with eBPF
// (cilium/ebpf, no C toolchain, no cgo): the uverbs commands each process
// issues, with their errors and latency (on rxe, write POST_SEND is the
// doorbell); rxe's retransmit and RNR timers and QP errors per QP; the
// latency of completion events from the kernel raising them to the read
// that returns them; and, with Options.PerPacket, per-QP packet, retry and
// completion counts. The programs attach to ib_uverbs' and rdma_rxe's
// functions (or, as a fallback, to the system call tracepoints), so they
// count every process's commands, whatever library issued them
// (Options.PIDs restricts that). Attaching needs root (CAP_BPF and
// CAP_PERFMON). goverbs top is its user interface.
//
// # What a user holds
//
// A *Probes from Attach: the maps, programs and links of one attachment.
// Snapshot reads its counters, cumulative since Attach: a Command per
// process, descriptor and command, a QP per rxe queue pair, CQEvents per
// process and device, the events raised per device, and Dropped: per
// map, the updates lost because it was full (those counts are low).
// Status says, for
// every probe Names lists, whether it is attached and how (Status.Via:
// fentry/fexit, kprobes or raw tracepoints, the cheapest the kernel
// allows) or why not. Devices and HWCounters list the devices and read
// their own counters from sysfs, no BPF needed; CommandName names a
// command.
//
//	p, err := probe.Attach(probe.Options{}) // every process; PIDs restricts, Skip leaves probes out
//	...
//	defer p.Close()                          // detaches every probe, frees the maps
//	s, err := p.Snapshot()
//
// # Lifecycle and concurrency
//
// Attach loads and attaches every probe the kernel can host; a probe it
// cannot (no kprobes, no rdma_rxe BTF, a missing symbol) is reported in
// Status with the reason while the others attach, and Attach fails, with
// ErrNoBPF, only when none attached. The structure offsets the programs
// use are read from the running kernel's BTF at Attach. Close is
// idempotent. Snapshot and Close take the Probes' lock, and Status does
// not change after Attach, so one Probes may be shared by goroutines.
//
// # Errors
//
// Snapshot after Close returns ErrClosed (this package's own value, not
// uverbs'). Attach refuses, before loading anything and naming the value,
// a pid in Options.PIDs outside 1..2^22, more than 1024 distinct pids and
// a name in Options.Skip that Names does not list. Attach's error joins
// every probe's reason. A nil Probes, or a
// zero one no Attach made, holds nothing: its Close and Snapshot return an
// error that is goverbs.ErrNil, its Status is empty.
//
// docs/observability.md describes each probe, what its counters mean, how
// the tests check them and goverbs top; docs/perf.md measures what the
// probes cost the data path.
package probe
