package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
)

const perfLine = "---------------------------------------------------------------------------------------\n"

// perfLatResult is one line of a latency report, in usec (perftest's
// print_report_lat).
type perfLatResult struct {
	Bytes      int     `json:"bytes"`
	Iterations int     `json:"iterations"`
	TMin       float64 `json:"t_min"`
	TMax       float64 `json:"t_max"`
	TTypical   float64 `json:"t_typical"`
	TAvg       float64 `json:"t_avg"`
	TStdev     float64 `json:"t_stdev"`
	P99        float64 `json:"p99"`
	P999       float64 `json:"p99_9"`
}

// perfBWResult is one line of a bandwidth report (print_report_bw): MB/sec
// is MiB/s, as perftest prints it; MsgRate is in Mpps.
type perfBWResult struct {
	Bytes      int     `json:"bytes"`
	Iterations int     `json:"iterations"`
	BWPeak     float64 `json:"bw_peak"`
	BWAvg      float64 `json:"bw_avg"`
	MsgRate    float64 `json:"msg_rate"`
}

// perfReport is what --json prints: the setup and one result per size.
// A passive server (write_bw, read_*, atomic_* servers) reports the
// client's results, which it received over TCP ("measured_by": "client").
type perfReport struct {
	Test       string            `json:"test"`
	Role       string            `json:"role"`
	MeasuredBy string            `json:"measured_by"`
	Device     string            `json:"device"`
	Port       int               `json:"ib_port"`
	GIDIndex   int               `json:"gid_index"`
	Conn       string            `json:"connection"`
	MTU        int               `json:"mtu"`
	QPs        int               `json:"qps"`
	PostList   int               `json:"post_list"`
	TxDepth    int               `json:"tx_depth"`
	RxDepth    int               `json:"rx_depth,omitempty"`
	CQMod      int               `json:"cq_mod"`
	Inline     int               `json:"inline_size"`
	OutReads   int               `json:"outstanding_reads,omitempty"`
	Atomic     string            `json:"atomic_type,omitempty"`
	Events     bool              `json:"events"`
	Units      map[string]string `json:"units"`
	Latency    []perfLatResult   `json:"latency,omitempty"`
	Bandwidth  []perfBWResult    `json:"bandwidth,omitempty"`

	bw       bool
	printed  int
	headerOK bool
}

func (r *perfRun) newReport() perfReport {
	o := r.o
	rep := perfReport{Test: o.kind.name, Role: "server", MeasuredBy: "server", Device: o.dev, Port: o.ibPort,
		GIDIndex: r.gid.Index, Conn: o.conn, MTU: r.mtu.Bytes(), QPs: o.qps, PostList: o.postList,
		TxDepth: o.txDepth, CQMod: o.cqMod, Inline: r.inline, Events: o.events, bw: o.kind.bw}
	if r.client {
		rep.Role, rep.MeasuredBy = "client", "client"
	}
	if o.kind.verb == verbSend {
		rep.RxDepth = o.rxDepth
	}
	if o.kind.verb == verbRead || o.kind.verb == verbAtomic {
		rep.OutReads = r.outReads
	}
	if o.kind.verb == verbAtomic {
		rep.Atomic = o.atomic
	}
	if o.kind.bw {
		rep.Units = map[string]string{"bw_peak": "MiB/s", "bw_avg": "MiB/s", "msg_rate": "Mpps"}
	} else {
		rep.Units = map[string]string{"t": "usec"}
	}
	return rep
}

// result computes this size's line from the stamps and returns it as JSON
// for the peer.
func (r *perfRun) result(size int, rep *perfReport) []byte {
	o := r.o
	var b []byte
	if o.kind.bw {
		var res perfBWResult
		if r.client {
			res = bwStats(r.tposted, r.tcompleted, size, o.iters*len(r.qps), o.postList, o.cqMod, o.noPeak)
		} else {
			// The send_bw server: first to last receive, no peak (as -N).
			res = bwStats(r.tposted, r.tcompleted, size, o.iters*len(r.qps), 1, 1, true)
		}
		rep.Bandwidth = append(rep.Bandwidth, res)
		b, _ = json.Marshal(res)
	} else {
		factor := 2.0 // send and write: half the round trip
		if o.kind.verb == verbRead || o.kind.verb == verbAtomic {
			factor = 1
		}
		res := latStats(r.tposted[:o.iters], size, factor)
		rep.Latency = append(rep.Latency, res)
		b, _ = json.Marshal(res)
	}
	return b
}

// latStats is print_report_lat: the differences of consecutive stamps,
// sorted, without the LAT_MEASURE_TAIL (2) largest; usec divided by factor.
func latStats(t []int64, size int, factor float64) perfLatResult {
	n := len(t) - 1
	d := make([]int64, n)
	for i := range d {
		d[i] = t[i+1] - t[i]
	}
	slices.Sort(d)
	m := n - 2
	if m < 1 {
		m = n
	}
	us := func(v float64) float64 { return v / 1e3 / factor }
	var median float64
	if (m-1)%2 != 0 {
		median = float64(d[m/2]+d[m/2-1]) / 2
	} else {
		median = float64(d[m/2])
	}
	var sum float64
	for _, v := range d[:m] {
		sum += us(float64(v))
	}
	avg := sum / float64(m)
	var ss float64
	for _, v := range d[:m] {
		x := us(float64(v)) - avg
		ss += x * x
	}
	i99 := min(int(math.Ceil(float64(m)*0.99)), n-1)
	i999 := min(int(math.Ceil(float64(m)*0.999)), n-1)
	return perfLatResult{Bytes: size, Iterations: len(t), TMin: us(float64(d[0])), TMax: us(float64(d[min(m, n-1)])),
		TTypical: us(median), TAvg: avg, TStdev: math.Sqrt(ss / float64(m)), P99: us(float64(d[i99])), P999: us(float64(d[i999]))}
}

// bwStats is print_report_bw. posted[i] is the time list i (at multiples of
// postList) went out, completed[j] the time the completion covering send j
// (at multiples of cqMod, minus one, and the last) came back. With noPeak
// only posted[0] and completed[0] are set.
func bwStats(posted, completed []int64, size, tot, postList, cqMod int, noPeak bool) perfBWResult {
	res := perfBWResult{Bytes: size, Iterations: tot}
	last := tot - 1
	if noPeak {
		last = 0
	}
	ns := float64(completed[last] - posted[0])
	if ns <= 0 {
		ns = 1
	}
	const mib = 1 << 20
	res.BWAvg = float64(size) * float64(tot) * 1e9 / ns / mib
	res.MsgRate = float64(tot) * 1e9 / ns / 1e6
	if noPeak {
		return res
	}
	best := int64(math.MaxInt64)
	for i := 0; i < tot; i += postList {
		for j := (i+cqMod)/cqMod*cqMod - 1; j < tot; j += cqMod {
			if t := (completed[j] - posted[i]) / int64(j-i+1); t < best {
				best = t
			}
		}
		if tot%cqMod != 0 {
			j := tot - 1
			if t := (completed[j] - posted[i]) / int64(j-i+1); t < best {
				best = t
			}
		}
	}
	if best > 0 && best < math.MaxInt64 {
		res.BWPeak = float64(size) * 1e9 / float64(best) / mib
	}
	return res
}

func (rep *perfReport) printLast(w io.Writer) {
	if !rep.headerOK {
		rep.headerOK = true
		fmt.Fprint(w, perfLine)
		if rep.bw {
			fmt.Fprintln(w, " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]")
		} else {
			fmt.Fprintln(w, " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ")
		}
	}
	if rep.bw {
		for ; rep.printed < len(rep.Bandwidth); rep.printed++ {
			x := rep.Bandwidth[rep.printed]
			fmt.Fprintf(w, " %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n", x.Bytes, x.Iterations, x.BWPeak, x.BWAvg, x.MsgRate)
		}
		return
	}
	for ; rep.printed < len(rep.Latency); rep.printed++ {
		x := rep.Latency[rep.printed]
		fmt.Fprintf(w, " %-7d %-10d   %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n",
			x.Bytes, x.Iterations, x.TMin, x.TMax, x.TTypical, x.TAvg, x.TStdev, x.P99, x.P999)
	}
}

func (rep *perfReport) writeJSON(w io.Writer) error {
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// printHeader is perftest's banner: the setup and both sides' addresses.
func (r *perfRun) printHeader(my, rem []perfQPInfo) {
	o, w := r.o, r.info
	onOff := func(b bool) string {
		if b {
			return "ON"
		}
		return "OFF"
	}
	link := "IB"
	if r.port.LinkLayer == 2 {
		link = "Ethernet"
	}
	fmt.Fprint(w, perfLine)
	fmt.Fprintf(w, "                    %s (goverbs)\n", o.kind.title)
	fmt.Fprintf(w, " Dual-port       : OFF\t\tDevice         : %s\n", o.dev)
	fmt.Fprintf(w, " Number of qps   : %d\t\tTransport type : IB\n", o.qps)
	fmt.Fprintf(w, " Connection type : %s\t\tUsing SRQ      : OFF\n", o.conn)
	if r.client || o.kind.verb == verbSend || !o.kind.bw {
		fmt.Fprintf(w, " TX depth        : %d\n", o.txDepth)
	}
	if o.kind.verb == verbSend {
		fmt.Fprintf(w, " RX depth        : %d\n", o.rxDepth)
	}
	if o.kind.bw {
		fmt.Fprintf(w, " CQ Moderation   : %d\n", o.cqMod)
		if o.postList > 1 {
			fmt.Fprintf(w, " Post List       : %d\n", o.postList)
		}
	}
	fmt.Fprintf(w, " Mtu             : %d[B]\n", r.mtu.Bytes())
	fmt.Fprintf(w, " Link type       : %s\n", link)
	fmt.Fprintf(w, " GID index       : %d\n", r.gid.Index)
	fmt.Fprintf(w, " Max inline data : %d[B]\n", r.inline)
	if o.kind.verb == verbRead || o.kind.verb == verbAtomic {
		fmt.Fprintf(w, " Outstand reads  : %d\n", r.outReads)
	}
	if o.kind.verb == verbAtomic {
		fmt.Fprintf(w, " Atomic type     : %s\n", o.atomic)
	}
	fmt.Fprintf(w, " Use events      : %s\n", onOff(o.events))
	if o.rdmaCM {
		fmt.Fprintf(w, " rdma_cm QPs     : ON\n")
		fmt.Fprintf(w, " Data ex. method : rdma_cm\n")
	} else {
		fmt.Fprintf(w, " Data ex. method : Ethernet\n")
	}
	fmt.Fprint(w, perfLine)
	for i := range my {
		printAddr(w, "local", my[i], o.kind.verb != verbSend)
		printAddr(w, "remote", rem[i], o.kind.verb != verbSend)
	}
}

func printAddr(w io.Writer, who string, a perfQPInfo, rdma bool) {
	fmt.Fprintf(w, " %s address: LID %#04x QPN %#06x PSN %#06x", who, a.LID, a.QPN, a.PSN)
	if rdma {
		fmt.Fprintf(w, " RKey %#08x VAddr %#016x", a.RKey, a.Addr)
	}
	fmt.Fprintf(w, "\n GID: %s\n", gidString(a.GID))
}
