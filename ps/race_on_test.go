//go:build race

package ps_test

// raceEnabled: the race detector is on. Its sync.Pool drops a quarter of
// what is put back, on purpose, so pooled paths allocate under it.
const raceEnabled = true
