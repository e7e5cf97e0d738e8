//go:build !race

package ps_test

const raceEnabled = false
