package provider

import "github.com/goverbs/goverbs/wr"

// The work request and completion types live in package wr, a leaf that
// users may import alone; the provider interfaces name them here, and a
// provider takes their opcodes, flags and statuses from wr.
type (
	SGE       = wr.SGE
	Opcode    = wr.Opcode
	SendFlags = wr.SendFlags
	SendWR    = wr.SendWR
	MWBind    = wr.MWBind
	RecvWR    = wr.RecvWR
	AH        = wr.AH
	WCStatus  = wr.WCStatus
	WCOpcode  = wr.WCOpcode
	WCFlags   = wr.WCFlags
	WC        = wr.WC
	WCError   = wr.WCError
)
