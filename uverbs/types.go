package uverbs

import "github.com/goverbs/goverbs/uverbs/provider"

// Work request and completion types, shared by every provider.
type (
	SGE       = provider.SGE
	MWBind    = provider.MWBind
	SendWR    = provider.SendWR
	RecvWR    = provider.RecvWR
	WC        = provider.WC
	WCStatus  = provider.WCStatus
	WCOpcode  = provider.WCOpcode
	WCFlags   = provider.WCFlags
	WCError   = provider.WCError
	Opcode    = provider.Opcode
	SendFlags = provider.SendFlags
)

// ErrQueueFull is returned when a work queue cannot take a whole batch;
// nothing of the batch was posted.
var ErrQueueFull = provider.ErrQueueFull
