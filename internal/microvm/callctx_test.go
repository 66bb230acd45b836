package microvm

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestCallContext: a call's context has its deadline, is done at it with
// DeadlineExceeded, and one ended before its deadline serves a later call
// with a new deadline; one whose deadline fired is never handed out again.
func TestCallContext(t *testing.T) {
	start := time.Now()
	c := startCall(time.Hour)
	if dl, ok := c.Deadline(); !ok || dl.Before(start.Add(time.Hour)) || dl.After(time.Now().Add(time.Hour)) {
		t.Fatalf("deadline %v, %v; want an hour from now", dl, ok)
	}
	if c.Err() != nil || c.Value("k") != nil {
		t.Fatalf("a fresh call context: Err %v, Value %v", c.Err(), c.Value("k"))
	}
	c.end()

	fired := startCall(20 * time.Millisecond)
	select {
	case <-fired.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not done 5 s after a 20 ms deadline")
	}
	if err := fired.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err = %v, want DeadlineExceeded", err)
	}
	fired.end()
	for range 100 {
		c := startCall(time.Hour)
		if c == fired {
			t.Fatal("a context whose deadline fired was handed out again")
		}
		select {
		case <-c.Done():
			t.Fatal("a new call's context is done at once")
		default:
		}
		defer c.end()
	}
}
