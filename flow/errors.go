package flow

import (
	"errors"

	"github.com/goverbs/goverbs/internal/sentinel"
)

// Sentinel errors. Functions wrap them with the values that failed, so test
// with errors.Is.
var (
	// ErrClosed: the Credits or Window was closed; blocked waits return it.
	// It is goverbs.ErrClosed for errors.Is.
	ErrClosed = sentinel.Closed("flow: closed")
	// ErrTooLarge: the request can never be satisfied (more credits than the
	// receiver can ever grant).
	ErrTooLarge = errors.New("flow: request exceeds what can ever be granted")
	// ErrEpochAhead: a grant names an epoch this side has not resynchronised
	// to yet. The transport must finish Resync/Reset before trusting traffic
	// of the new epoch.
	ErrEpochAhead = errors.New("flow: grant from a future epoch")
	// ErrStaleEpoch: Reset/Resync to an epoch that is not newer than the
	// current one.
	ErrStaleEpoch = errors.New("flow: epoch not newer than current")
	// ErrImpossibleGrant: a grant the receiver could not have issued (more
	// credits outstanding than buffers it can post, or granted < consumed).
	ErrImpossibleGrant = errors.New("flow: impossible grant")
	// ErrGrantBackwards: with CreditsConfig.InOrderGrants, a cumulative grant
	// smaller than one already applied in the same epoch.
	ErrGrantBackwards = errors.New("flow: cumulative grant went backwards")
	// ErrOverrun: the peer sent more messages than it had credits for.
	ErrOverrun = errors.New("flow: peer overran its credits")
	// ErrOverRelease: more released than was consumed/acquired.
	ErrOverRelease = errors.New("flow: release exceeds outstanding")
)

// What the blocking acquires return for a nil context (which has no Done
// to wait on), naming the method called.
var (
	errNilCtxCreditsAcquire      = errors.New("flow: Credits.Acquire: nil context")
	errNilCtxCreditsAcquireEpoch = errors.New("flow: Credits.AcquireEpoch: nil context")
	errNilCtxWindowAcquire       = errors.New("flow: Window.Acquire: nil context")
	errNilCtxWindowAcquireN      = errors.New("flow: Window.AcquireN: nil context")
)
