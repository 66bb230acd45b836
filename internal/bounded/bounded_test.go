package bounded

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
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
	for i, wait := range []func() (int, error){wait1, wait2} {
		if v, err := wait(); v != 7 || err != nil {
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
	_, err := wait()
	if took := time.Since(w0); !errors.Is(err, source.ErrTimeout) || took > 190*time.Millisecond {
		t.Fatalf("hung call: %v after %v in wait, want ErrTimeout at once (the bound runs from Start)", err, took)
	}
}

// goroutineID is the running goroutine's id, from its stack header.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := strings.Cut(strings.TrimPrefix(string(buf), "goroutine "), " ")
	return id
}

// TestDoHere: a caller with no deadline, or one at least the call's limit
// away, runs the call itself; a caller whose deadline is sooner hands it
// to a worker and gets ErrTimeout at its deadline; a caller that finds the
// key in flight joins the call, whoever runs it.
func TestDoHere(t *testing.T) {
	const limit = time.Second
	g := New(0)
	ranOn := func() (string, error) { return goroutineID(), nil }
	long, cancelLong := context.WithTimeout(context.Background(), 2*limit)
	defer cancelLong()
	short, cancelShort := context.WithTimeout(context.Background(), limit/2)
	defer cancelShort()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		here bool
	}{
		{"no deadline", context.Background(), true},
		{"deadline beyond the limit", long, true},
		{"deadline within the limit", short, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			me := goroutineID()
			got, err := DoHere(tc.ctx, g, "k", limit, ranOn)
			if err != nil || (got == me) != tc.here {
				t.Fatalf("ran on goroutine %s (the caller is %s), err %v; want on the caller: %v", got, me, err, tc.here)
			}
		})
	}

	t.Run("a sooner deadline is kept", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := DoHere(ctx, g, "hung", limit, func() (int, error) { <-release; return 0, nil })
		if took := time.Since(start); !errors.Is(err, source.ErrTimeout) || took > limit/2 {
			t.Fatalf("%v after %v, want ErrTimeout at the caller's 50ms", err, took)
		}
	})

	t.Run("joined", func(t *testing.T) {
		release := make(chan struct{})
		calls := 0
		fn := func() (int, error) { calls++; <-release; return 7, nil }
		first := make(chan int)
		go func() { v, _ := DoHere(context.Background(), g, "shared", limit, fn); first <- v }()
		for g.InFlight() == 0 {
			time.Sleep(time.Millisecond)
		}
		second := make(chan int)
		go func() { v, _ := DoHere(context.Background(), g, "shared", limit, fn); second <- v }()
		time.Sleep(20 * time.Millisecond) // the second caller waits on the first's call
		close(release)
		if a, b := <-first, <-second; a != 7 || b != 7 || calls != 1 {
			t.Fatalf("results %d and %d from %d calls, want 7 and 7 from 1", a, b, calls)
		}
	})

	t.Run("panic", func(t *testing.T) {
		_, err := DoHere(context.Background(), g, "boom", limit, func() (int, error) { panic("parser bug") })
		if !errors.Is(err, source.ErrMalformed) || g.InFlight() != 0 {
			t.Fatalf("err = %v with %d in flight, want ErrMalformed and none", err, g.InFlight())
		}
	})

	t.Run("a Group bound shorter than the limit", func(t *testing.T) {
		me := goroutineID()
		got, err := DoHere(context.Background(), New(limit/2), "k", limit, ranOn)
		if err != nil || got == me {
			t.Fatalf("ran on goroutine %s (the caller is %s), err %v; want on a worker", got, me, err)
		}
	})
}
