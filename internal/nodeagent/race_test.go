//go:build race

package nodeagent

// raceEnabled: the race detector shadows memory and slows every sweep
// several times, so a memory-flatness test measures the detector.
const raceEnabled = true
