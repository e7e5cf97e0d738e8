package qp

import (
	"errors"
	"fmt"
	"net"

	"github.com/goverbs/goverbs/uverbs/provider"
)

// GRHSize is the room a UD receive buffer must leave in front of the
// payload: the device writes the 40-byte global route header there.
const GRHSize = 40

// UDOptions bring a UD QP up.
type UDOptions struct {
	Port uint8  // default 1
	QKey uint32 // the QKey senders must present
	PSN  uint32
}

// ToRTS moves a UD QP from RESET (or INIT) to RTS: it can then send to any
// address handle and receive from any QP that knows its QPN and QKey.
func (q *QP) ToRTS(o UDOptions) error {
	if q.bad() {
		return errNilQP
	}
	if q.cfg.Type != UD {
		return fmt.Errorf("qp: ToRTS is for UD QPs; connect a %v QP with Connect", q.cfg.Type)
	}
	if o.Port == 0 {
		o.Port = 1
	}
	// The port is checked before any state change; Modify sets the
	// path MTU (udMTU) on the way to RTS.
	if _, err := q.ctx.QueryPort(int(o.Port)); err != nil {
		return err
	}
	if err := q.toInit(&Attr{Port: o.Port, QKey: o.QKey}, MaskPKeyIndex|MaskPort|MaskQKey); err != nil {
		return err
	}
	if err := q.Modify(&Attr{State: RTR}, MaskState); err != nil {
		return err
	}
	return q.Modify(&Attr{State: RTS, SQPSN: o.PSN & 0xffffff}, MaskState|MaskSQPSN)
}

// MaxUDPayload is the largest UD message: the port's active MTU when the
// QP was brought up.
func (q *QP) MaxUDPayload() int { return int(q.orZero().udMTU.Load()) }

// checkUD refuses UD sends larger than the path MTU, which the device would
// otherwise drop or fail late, sends to a remote QPN over 24 bits, and
// sends without an address handle or through a closed one (ErrClosed).
func (q *QP) checkUD(wrs []SendWR) error {
	mtu := uint64(q.udMTU.Load())
	for i := range wrs {
		var n uint64
		for _, s := range wrs[i].SGEs {
			n += uint64(s.Length)
		}
		if n > mtu {
			return fmt.Errorf("qp: UD send work request %d (id %d): %d bytes exceed the %d-byte path MTU", i, wrs[i].ID, n, mtu)
		}
		// rxe puts the low 24 bits on the wire: another QP's number.
		if wrs[i].RemoteQPN > maxQPN {
			return fmt.Errorf("qp: UD send work request %d (id %d): remote QPN %#x is over 24 bits", i, wrs[i].ID, wrs[i].RemoteQPN)
		}
		if wrs[i].AH == nil {
			return fmt.Errorf("qp: UD send work request %d (id %d): no address handle", i, wrs[i].ID)
		}
		// One atomic load: the device would read a closed AH's number
		// late and fail the send (rxe: the QP to ERR), or send it to the
		// AH the kernel gave the number since.
		if c, ok := wrs[i].AH.(provider.ClosableAH); ok && c.AHClosed() {
			return fmt.Errorf("qp: UD send work request %d (id %d): address handle closed: %w", i, wrs[i].ID, ErrClosed)
		}
	}
	return nil
}

// GRH is what a UD receive's global route header says about the sender.
type GRH struct {
	SGID, DGID   net.IP
	TrafficClass uint8
	FlowLabel    uint32
	HopLimit     uint8
}

// ParseGRH reads the 40 bytes in front of a UD receive. On RoCE v2 over
// IPv4 the device writes the sender's IPv4 header in the last 20 bytes
// instead of an IPv6-format GRH; both come back as 16-byte GIDs
// (::ffff:a.b.c.d for IPv4).
func ParseGRH(b []byte) (GRH, error) {
	if len(b) < GRHSize {
		return GRH{}, fmt.Errorf("qp: GRH: %d bytes, want %d", len(b), GRHSize)
	}
	if b[0]>>4 == 6 {
		return GRH{
			TrafficClass: b[0]<<4 | b[1]>>4,
			FlowLabel:    uint32(b[1]&0xf)<<16 | uint32(b[2])<<8 | uint32(b[3]),
			HopLimit:     b[7],
			SGID:         append(net.IP(nil), b[8:24]...),
			DGID:         append(net.IP(nil), b[24:40]...),
		}, nil
	}
	ip := b[20:40]
	if ip[0]>>4 == 4 && ip[0]&0xf == 5 {
		return GRH{
			TrafficClass: ip[1],
			HopLimit:     ip[8],
			SGID:         net.IPv4(ip[12], ip[13], ip[14], ip[15]).To16(),
			DGID:         net.IPv4(ip[16], ip[17], ip[18], ip[19]).To16(),
		}, nil
	}
	return GRH{}, errors.New("qp: GRH: neither an IPv6 GRH nor an IPv4 header")
}
