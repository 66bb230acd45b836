package sweep

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
)

const (
	benchDaemons  = 200
	envFakesDir   = "SWEEP_BENCH_FAKES_DIR"
	envFakesCount = "SWEEP_BENCH_FAKES_COUNT"
)

// TestFakeDaemonsHelper is not a test: BenchmarkSweep re-runs the test
// binary with it to serve the fake daemons from another process, so that
// the benchmark's CPU figure is the agent's alone.
func TestFakeDaemonsHelper(t *testing.T) {
	dir := os.Getenv(envFakesDir)
	if dir == "" {
		t.Skip("helper process for BenchmarkSweep")
	}
	n, err := strconv.Atoi(os.Getenv(envFakesCount))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		d := statsdfake.Start(t, filepath.Join(dir, fmt.Sprintf("d%03d.sock", i)))
		d.Set(sample(fmt.Sprintf("actor-%03d", i), uint64(i)*1000, 64<<20))
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin) // serve until the benchmark closes stdin
}

// startFakes serves n fake daemons in a child process and returns the glob
// of their sockets.
func startFakes(b *testing.B, n int) (glob string, sockets []string) {
	b.Helper()
	dir := b.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFakeDaemonsHelper$", "-test.bench=^$", "-test.count=1")
	cmd.Env = append(os.Environ(), envFakesDir+"="+dir, envFakesCount+"="+strconv.Itoa(n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		b.Fatalf("fake daemons did not start: %q %v", line, err)
	}
	glob = filepath.Join(dir, "*.sock")
	sockets, err = Discover(glob)
	if err != nil || len(sockets) != n {
		b.Fatalf("found %d sockets, want %d (%v)", len(sockets), n, err)
	}
	return glob, sockets
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSweep: one sweep over 200 daemons at concurrency 8 (the agent's
// default) against 200 sequential single polls (baseline). Both reuse
// nothing between polls: every poll dials its daemon afresh, as the agent
// does. cpu-ms/op is the benchmark process's user+system CPU per op: the
// agent's alone, since the daemons run in a child process.
func BenchmarkSweep(b *testing.B) {
	glob, sockets := startFakes(b, benchDaemons)
	ctx := context.Background()
	run := func(b *testing.B, op func() int) {
		c0 := cpuTime(b)
		for b.Loop() {
			if ok := op(); ok != benchDaemons {
				b.Fatalf("%d of %d daemons answered", ok, benchDaemons)
			}
		}
		b.ReportMetric(float64(cpuTime(b)-c0)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
	}
	b.Run("baseline", func(b *testing.B) {
		p := poller{limits: DefaultLimits, allow: uidSet(nil), timeout: 5 * time.Second}
		run(b, func() int {
			ok := 0
			for _, s := range sockets {
				if p.pollDaemon(ctx, s).Status == StatusOK {
					ok++
				}
			}
			return ok
		})
	})
	b.Run("concurrency-8", func(b *testing.B) {
		run(b, func() int {
			results, err := Sweep(ctx, glob, 8, 5*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			ok := 0
			for _, r := range results {
				if r.Status == StatusOK {
					ok++
				}
			}
			return ok
		})
	})
}
