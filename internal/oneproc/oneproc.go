// Package oneproc gives a node daemon one Go processor (GOMAXPROCS 1)
// unless the GOMAXPROCS environment variable names another count. statsd
// and statsagent import it for that effect alone: their work comes in short
// bursts, and a second processor made each burst's goroutine hand-offs wake
// and park threads (docs/design.md, "The node's cost beside the kubelet's
// cAdvisor"). It does so while packages initialise, before grpc's and
// protobuf's: set later, in main, the first processor's cached spans and a
// collection the start then made kept up to 0.6 MiB more resident in an
// idle statsd (e2e TestIntegrationStatsdMemory). It imports only runtime and
// syscall so that it initialises early.
package oneproc

import (
	"runtime"
	"syscall"
)

func init() {
	if _, set := syscall.Getenv("GOMAXPROCS"); !set {
		runtime.GOMAXPROCS(1)
	}
}
