//go:build !race

package frontend

// raceEnabled says the race detector is on (race_test.go).
const raceEnabled = false
