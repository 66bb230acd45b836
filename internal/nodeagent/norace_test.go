//go:build !race

package nodeagent

const raceEnabled = false
