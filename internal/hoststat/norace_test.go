//go:build !race

package hoststat

const raceEnabled = false
