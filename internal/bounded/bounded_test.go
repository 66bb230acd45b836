package bounded

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "memory.current")
	if err := os.WriteFile(p, []byte("4096\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g := New(time.Second)
	b, err := g.ReadFile(context.Background(), p)
	if err != nil || string(b) != "4096\n" {
		t.Fatalf("ReadFile = %q, %v", b, err)
	}
	if _, err := g.ReadFile(context.Background(), filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: err = %v, want ErrNotExist", err)
	}
}

// TestHungReadIsBoundedAndShared puts a FIFO with no writer where a kernel
// file would be: opening it never returns. Every caller must get ErrTimeout
// within the bound, and 100 concurrent callers must share one hung open.
func TestHungReadIsBoundedAndShared(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "memory.current")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// Unblock the hung open at the end so the test leaks nothing.
	t.Cleanup(func() {
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	const timeout = 200 * time.Millisecond
	g := New(timeout)
	before := runtime.NumGoroutine()

	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for range 100 {
		wg.Go(func() {
			_, err := g.ReadFile(context.Background(), fifo)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	if elapsed := time.Since(start); elapsed > timeout+3*time.Second {
		t.Errorf("100 polls of a hung read took %v, want about %v", elapsed, timeout)
	}
	for err := range errs {
		if !errors.Is(err, source.ErrTimeout) {
			t.Fatalf("err = %v, want ErrTimeout", err)
		}
	}
	if n := g.InFlight(); n != 1 {
		t.Errorf("in-flight reads = %d, want 1 shared hung read", n)
	}
	// The waiting goroutines are gone; only the one hung read remains. They
	// may take a moment to exit after reporting: poll before failing.
	after := runtime.NumGoroutine()
	for deadline := time.Now().Add(2 * time.Second); after > before+2 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		after = runtime.NumGoroutine()
	}
	if after > before+2 {
		t.Errorf("goroutines: %d before, %d after 100 polls of a hung read", before, after)
	}
}

func TestPanicInReadIsAnError(t *testing.T) {
	g := New(time.Second)
	_, err := Do(context.Background(), g, "boom", func() (int, error) { panic("parser bug") })
	if !errors.Is(err, source.ErrMalformed) {
		t.Fatalf("err = %v, want ErrMalformed", err)
	}
	if g.InFlight() != 0 {
		t.Fatal("the panicked call stayed in flight")
	}
}

func TestCallerCancelIsNotATimeout(t *testing.T) {
	g := New(time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	defer close(release)
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	_, err := Do(ctx, g, "slow", func() (int, error) { <-release; return 0, nil })
	if errors.Is(err, source.ErrTimeout) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled and not ErrTimeout", err)
	}
}

func TestNilInterfaceResult(t *testing.T) {
	v, err := Do(context.Background(), New(time.Second), "nil", func() (error, error) { return nil, nil })
	if v != nil || err != nil {
		t.Fatalf("Do = %v, %v", v, err)
	}
}

// TestStart: the call runs while the caller does other work, a second
// Start of the key joins it, and a hung call's wait ends at the bound
// counted from Start, not from wait.
func TestStart(t *testing.T) {
	g := New(200 * time.Millisecond)
	release := make(chan struct{})
	calls := 0
	fn := func() (int, error) {
		calls++
		<-release
		return 7, nil
	}
	wait1 := Start(context.Background(), g, "k", fn)
	wait2 := Start(context.Background(), g, "k", fn)
	if n := g.InFlight(); n != 1 {
		t.Fatalf("in flight %d, want 1 shared call", n)
	}
	close(release)
	for i, wait := range []Pending[int]{wait1, wait2} {
		if v, err := wait.Wait(); v != 7 || err != nil {
			t.Errorf("wait %d = %d, %v, want 7", i+1, v, err)
		}
	}
	if calls != 1 {
		t.Errorf("%d calls, want 1", calls)
	}

	hang := make(chan struct{})
	defer close(hang)
	wait := Start(context.Background(), g, "hung", func() (int, error) { <-hang; return 0, nil })
	time.Sleep(400 * time.Millisecond) // the caller's own work, past the bound
	w0 := time.Now()
	_, err := wait.Wait()
	if took := time.Since(w0); !errors.Is(err, source.ErrTimeout) || took > 190*time.Millisecond {
		t.Fatalf("hung call: %v after %v in wait, want ErrTimeout at once (the bound runs from Start)", err, took)
	}

	// Abandoned: the caller leaves at once; the call goes on, shared, and a
	// later caller of the key joins it.
	slow := make(chan struct{})
	p := Start(context.Background(), g, "abandoned", func() (int, error) { <-slow; return 9, nil })
	a0 := time.Now()
	p.Abandon()
	if took := time.Since(a0); took > 50*time.Millisecond {
		t.Errorf("Abandon took %v", took)
	}
	if n := g.InFlight(); n != 2 { // the hung call's and this one
		t.Errorf("in flight after Abandon %d, want the call still running", n)
	}
	joined := Start(context.Background(), g, "abandoned", func() (int, error) { return 0, errors.New("a second call") })
	close(slow)
	if v, err := joined.Wait(); v != 9 || err != nil {
		t.Errorf("joined the abandoned call: %d, %v, want 9", v, err)
	}
	if (Pending[int]{}).Started() || !p.Started() {
		t.Error("Started: the zero Pending is none, a started one is")
	}
}
