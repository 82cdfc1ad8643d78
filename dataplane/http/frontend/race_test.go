//go:build race

package frontend

// raceEnabled says the race detector is on. It drops sync.Pool entries at
// random, so the allocations of pooled paths are counted only without it.
const raceEnabled = true
