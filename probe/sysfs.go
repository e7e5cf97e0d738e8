package probe

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// uverbsDevices maps uverbs minor indexes (the N of uverbsN), and
// devMinorFlag|char device minor, to device names from
// /sys/class/infiniband_verbs/uverbsN/{ibdev,dev}.
func uverbsDevices() map[uint32]string {
	m := map[uint32]string{}
	ents, _ := os.ReadDir("/sys/class/infiniband_verbs")
	for _, e := range ents {
		n, ok := strings.CutPrefix(e.Name(), "uverbs")
		if !ok {
			continue
		}
		i, err := strconv.ParseUint(n, 10, 16)
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/sys/class/infiniband_verbs", e.Name(), "ibdev"))
		if err != nil {
			continue
		}
		name := strings.TrimSpace(string(b))
		m[uint32(i)] = name
		// The fentry programs name the device by its char device's
		// minor ("231:192").
		if d, err := os.ReadFile(filepath.Join("/sys/class/infiniband_verbs", e.Name(), "dev")); err == nil {
			if _, mn, ok := strings.Cut(strings.TrimSpace(string(d)), ":"); ok {
				if minor, err := strconv.ParseUint(mn, 10, 32); err == nil {
					m[devMinorFlag|uint32(minor)&(devMinorFlag-1)] = name
				}
			}
		}
	}
	return m
}

// scanUverbsFDs finds the uverbs fds already open in every process: keys
// are gv_fds keys ({tgid, fd}, little endian), values the minor index.
func scanUverbsFDs() map[[8]byte]uint32 {
	out := map[[8]byte]uint32{}
	procs, _ := os.ReadDir("/proc")
	for _, pe := range procs {
		pid, err := strconv.ParseUint(pe.Name(), 10, 32)
		if err != nil {
			continue
		}
		dir := filepath.Join("/proc", pe.Name(), "fd")
		fds, _ := os.ReadDir(dir)
		for _, fe := range fds {
			target, err := os.Readlink(filepath.Join(dir, fe.Name()))
			if err != nil {
				continue
			}
			n, ok := strings.CutPrefix(target, "/dev/infiniband/uverbs")
			if !ok {
				continue
			}
			minor, err := strconv.ParseUint(n, 10, 16)
			if err != nil {
				continue
			}
			fd, err := strconv.ParseUint(fe.Name(), 10, 32)
			if err != nil {
				continue
			}
			var k [8]byte
			binary.LittleEndian.PutUint32(k[0:], uint32(pid))
			binary.LittleEndian.PutUint32(k[4:], uint32(fd))
			out[k] = uint32(minor)
		}
	}
	return out
}

// HWCounters reads rxe's (or any driver's) per-port counters from
// /sys/class/infiniband/DEV/ports/PORT/hw_counters: sent_pkts, rcvd_pkts,
// completer_retry_err (retransmission restarts), rcvd_rnr_err,
// rcvd_seq_err, ... It returns nil when the device has none, and for a
// dev that is not a plain device name (empty, ".", "..", or with a "/":
// it would name another directory) or a port below 1.
func HWCounters(dev string, port int) map[string]uint64 {
	if dev == "" || dev == "." || dev == ".." || strings.ContainsAny(dev, "/\x00") || port < 1 {
		return nil
	}
	dir := filepath.Join("/sys/class/infiniband", dev, "ports", strconv.Itoa(port), "hw_counters")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	m := map[string]uint64{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			continue
		}
		m[e.Name()] = v
	}
	return m
}

// Devices lists the RDMA devices in /sys/class/infiniband.
func Devices() []string {
	ents, _ := os.ReadDir("/sys/class/infiniband")
	var n []string
	for _, e := range ents {
		n = append(n, e.Name())
	}
	return n
}
