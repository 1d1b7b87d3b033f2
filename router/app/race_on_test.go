//go:build race

package app

// raceEnabled: the race detector makes sync.Pool drop items at random, so allocation counts
// are not the program's under -race.
const raceEnabled = true
