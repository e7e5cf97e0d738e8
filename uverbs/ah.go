package uverbs

import (
	"errors"
	"fmt"
	"net"
	"unsafe"

	"github.com/goverbs/goverbs/internal/uvobj"
	"github.com/goverbs/goverbs/ioctl"
	"github.com/goverbs/goverbs/uverbs/provider"
	"github.com/goverbs/goverbs/wr"
)

// AHAttr says where UD sends through an address handle go.
type AHAttr struct {
	Port         uint8  // default 1
	DGID         net.IP // the destination GID; RoCE needs one
	SGIDIndex    uint8  // our GID (DefaultGID's index when UseSGID is false)
	UseSGID      bool
	HopLimit     uint8 // default 64
	TrafficClass uint8
	FlowLabel    uint32
	DLID         uint16 // InfiniBand only
	SL           uint8
}

// AH is an address handle: the destination of UD sends.
type AH struct {
	pd     *PD
	drv    wr.AH
	handle uint32
	attr   AHAttr
	once   uvobj.Once
}

// CreateAH makes an address handle in the PD.
func (pd *PD) CreateAH(a AHAttr) (*AH, error) {
	if pd.bad() {
		return nil, errNilPD
	}
	c := pd.ctx
	if _, err := pd.Handle(); err != nil {
		return nil, fmt.Errorf("uverbs: create AH: PD: %w", err)
	}
	if a.Port == 0 {
		a.Port = 1
	}
	if err := c.checkPort(int(a.Port)); err != nil {
		return nil, err
	}
	if a.HopLimit == 0 {
		a.HopLimit = 64
	}
	if a.DGID == nil || a.DGID.To16() == nil {
		return nil, errors.New("uverbs: create AH: a destination GID is required (RoCE)")
	}
	if a.UseSGID {
		if _, err := c.GID(int(a.Port), int(a.SGIDIndex)); err != nil {
			return nil, err
		}
	} else {
		g, err := c.DefaultGID(int(a.Port))
		if err != nil {
			return nil, err
		}
		// sgid_index is 8 bits; rxe's GID table has 1024 entries:
		// uint8 would name another GID.
		if g.Index > 255 {
			return nil, fmt.Errorf("uverbs: create AH: default GID index %d does not fit an address handle's 8 bits: set SGIDIndex and UseSGID", g.Index)
		}
		a.SGIDIndex = uint8(g.Index)
	}
	drv, err := c.pctx.NewAH()
	if err != nil {
		return nil, fmt.Errorf("uverbs: create AH: %w", err)
	}
	in, out := drv.Udata()
	// The PD is held open from here to the kernel's answer: a Close of
	// it meanwhile would free its handle for the next PD the context
	// makes, and the AH would be made in that one.
	if !pd.once.Hold() {
		return nil, fmt.Errorf("uverbs: create AH: PD: %w", ErrClosed)
	}
	req := ioctl.CreateAH{Pd_handle: pd.handle, Attr: ioctl.AHAttr{
		Grh: ioctl.GlobalRoute{Flow_label: a.FlowLabel, Sgid_index: a.SGIDIndex, Hop_limit: a.HopLimit,
			Traffic_class: a.TrafficClass},
		Dlid: a.DLID, Sl: a.SL, Is_global: 1, Port_num: a.Port,
	}}
	copy(req.Attr.Grh.Dgid[:], a.DGID.To16())
	var resp ioctl.CreateAHResp
	err = c.file.Write(&ioctl.Cmd{
		Command: ioctl.IB_USER_VERBS_CMD_CREATE_AH, In: unsafe.Pointer(&req), InLen: ioctl.SizeofCreateAH,
		Out: unsafe.Pointer(&resp), OutLen: ioctl.SizeofCreateAHResp, DriverIn: in, DriverOut: out,
	}, "CREATE_AH")
	pd.once.Release()
	if err != nil {
		return nil, fmt.Errorf("uverbs: %s: create AH to %v: %w", c.info.Name, a.DGID, err)
	}
	ah := &AH{pd: pd, drv: drv, handle: resp.Handle, attr: a}
	if err := drv.Attach(resp.Handle); err != nil {
		ah.destroy()
		return nil, err
	}
	if err := c.tab.Track(ah); err != nil {
		ah.destroy()
		return nil, err
	}
	return ah, nil
}

// Provider returns the provider's handle, which UD send work requests carry
// (SendWR.AH).
func (ah *AH) Provider() wr.AH { return ah.orZero().drv }

// Attr returns the address the handle was made for.
func (ah *AH) Attr() AHAttr { return ah.orZero().attr }

// PD returns the protection domain.
func (ah *AH) PD() *PD { return ah.orZero().pd }

// IsClosed reports whether Close was called. It is true of a nil or zero
// AH.
func (ah *AH) IsClosed() bool {
	if ah.bad() {
		return true
	}
	return ah.once.IsClosed()
}

func (ah *AH) destroy() error { return uvobj.DestroyAH(ah.pd.ctx.file, ah.handle) }

// Close destroys the address handle. Idempotent. A UD send through it
// afterwards is refused with ErrClosed before anything is posted (when
// the provider's AH records its Close, provider.ClosableAH: rxe's does).
// Close it only once the sends through it completed: the device reads
// the AH when it sends, after PostSend returned (rxe in a kernel work
// item), and a send whose AH is gone fails there (rxe moves the QP to
// ERR). No check at post time can cover a Close after it, so none covers
// a Close that races a post either.
func (ah *AH) Close() error {
	if ah.bad() {
		return errNilAH
	}
	return ah.once.Close(&ah.pd.ctx.tab, ah, 0, ah.destroy,
		func(err error) error { return fmt.Errorf("uverbs: destroy AH: %w", err) }, ah.markClosed)
}

// markClosed marks the provider's AH closed, for the UD send check.
func (ah *AH) markClosed() error {
	if c, ok := ah.drv.(provider.ClosableAH); ok {
		c.MarkAHClosed()
	}
	return nil
}
