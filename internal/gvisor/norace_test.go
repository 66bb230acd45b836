//go:build !race

package gvisor

const raceEnabled = false
