//go:build race

package gvisor

// raceEnabled: the race detector shadows memory, so a child test process
// uses several times what it allocates.
const raceEnabled = true
