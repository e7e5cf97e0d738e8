// Package tcgcost holds benchmarks of code shapes (a loop, a call, an
// atomic, a lock, the clock, a channel, the flow package's bookkeeping),
// to be run natively and in the scripts/vm guest, where qemu emulates the
// CPU (TCG): the ratio says how much more each shape costs there, which
// is how a user-space turn of bx or raw verbs in the guest translates to
// hardware (docs/perf.md, "Twenty-sixth session"). It has no code of its
// own.
//
//	go test -run '^$' -bench . ./internal/tcgcost
//	go test -exec "$PWD/scripts/vm --" -run '^$' -bench . ./internal/tcgcost
package tcgcost
