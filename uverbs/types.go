package uverbs

import (
	"github.com/goverbs/goverbs/uverbs/provider"
	"github.com/goverbs/goverbs/wr"
)

// Work request and completion types, shared by every provider.
type (
	SGE       = wr.SGE
	MWBind    = wr.MWBind
	SendWR    = wr.SendWR
	RecvWR    = wr.RecvWR
	WC        = wr.WC
	WCStatus  = wr.WCStatus
	WCOpcode  = wr.WCOpcode
	WCFlags   = wr.WCFlags
	WCError   = wr.WCError
	Opcode    = wr.Opcode
	SendFlags = wr.SendFlags
)

// ErrQueueFull is returned when a work queue cannot take a whole batch;
// nothing of the batch was posted.
var ErrQueueFull = provider.ErrQueueFull
