//go:build !race

package pool

// raceEnabled is true in race-detector builds.
const raceEnabled = false
