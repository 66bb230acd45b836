//go:build race

package hoststat

// raceEnabled: the race detector makes reading and decoding bytes several
// times slower, so time bounds of the hostile-peer tests scale with it.
const raceEnabled = true
