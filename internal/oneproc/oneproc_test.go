package oneproc

import (
	"os"
	"runtime"
	"testing"
)

// TestOneProcessor: importing the package left this test binary one Go
// processor, unless GOMAXPROCS was set in its environment.
func TestOneProcessor(t *testing.T) {
	want := 1
	if _, set := os.LookupEnv("GOMAXPROCS"); set {
		want = runtime.GOMAXPROCS(0) // the environment's count, untouched
		t.Logf("GOMAXPROCS=%s in the environment: the package leaves it", os.Getenv("GOMAXPROCS"))
	}
	if got := runtime.GOMAXPROCS(0); got != want {
		t.Errorf("GOMAXPROCS %d, want %d", got, want)
	}
}
