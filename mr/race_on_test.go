//go:build race

package mr

// raceEnabled: the race detector is on (its atomics are slower, so races
// are caught in fewer rounds and rounds cost more).
const raceEnabled = true
