//go:build unix

package main

import (
	"syscall"
	"testing"
	"time"
)

// processCPU is this process's CPU so far (user + system: the benchmark's
// client, and the server and fake agent where they run in it: not the
// gVisor breakdown's rows, whose statsd is a process of its own).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process's CPU per iteration since since (a
// processCPU reading) as cpu-ns/op: on a shared machine the CPU a call
// costs moves less than its wall time.
func reportCPU(b *testing.B, since time.Duration) {
	b.ReportMetric(float64(processCPU()-since)/float64(max(b.N, 1)), "cpu-ns/op")
}
