package bounded

import (
	"context"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestStartYields, with one Go processor (statsd's): every call Start
// begins has run up to its first wait when Start returns (its request
// written before the caller's own read, not after it; 2000 Starts, so
// that the scheduler's every-61st turn to the global run queue comes up);
// one that blocks in a system call (a hung file) holds the caller only
// until the runtime takes the processor back from it (about 20 ms at most;
// 200 ms allowed on a loaded machine: a guard against a hang, which code
// without the yield passes too), and its result still comes.
func TestStartYields(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	g := New(5 * time.Second)

	t.Run("runs up to its wait", func(t *testing.T) {
		const n = 2000
		missed := 0
		for range n {
			var ran atomic.Bool
			release := make(chan struct{})
			p := Start(context.Background(), g, "parks", func() (int, error) {
				ran.Store(true)
				<-release
				return 1, nil
			})
			if !ran.Load() {
				missed++
			}
			close(release)
			if v, err := p.Wait(); v != 1 || err != nil {
				t.Fatalf("Wait = %d, %v, want 1", v, err)
			}
		}
		if missed > 0 {
			t.Errorf("Start returned before its call ran %d times in %d", missed, n)
		}
	})

	t.Run("blocked in a system call", func(t *testing.T) {
		var fds [2]int
		if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC); err != nil { // blocking: a read holds its thread
			t.Fatal(err)
		}
		defer syscall.Close(fds[0])
		defer syscall.Close(fds[1])
		t0 := time.Now()
		p := Start(context.Background(), g, "syscall", func() (int, error) {
			var b [1]byte
			n, err := syscall.Read(fds[0], b[:])
			return n, err
		})
		if took := time.Since(t0); took > 200*time.Millisecond {
			t.Errorf("Start held its caller %v while the call blocked in read(2)", took)
		}
		if _, err := syscall.Write(fds[1], []byte{1}); err != nil {
			t.Fatal(err)
		}
		if v, err := p.Wait(); v != 1 || err != nil {
			t.Errorf("Wait = %d, %v, want the byte read", v, err)
		}
	})
}
