package main

import (
	"os"
	"runtime"
)

// The test binary links internal/oneproc through package main, which left
// it one Go processor. Its tests and benchmarks run the daemon's run() and
// their clients (and fakes) in one process, where one processor would set
// them against each other; they keep the runtime's default, as before
// (the daemon's own processes keep one: e2e).
func init() {
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		runtime.SetDefaultGOMAXPROCS()
	}
}
