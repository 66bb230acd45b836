package microvm

import (
	"testing"
	"time"
)

// TestConfigBackoff: the one backoff of failed dials and cut connections
// doubles from MinBackoff per failure in a row and stays at MaxBackoff,
// also where the doubling would overflow.
func TestConfigBackoff(t *testing.T) {
	cfg := Config{MinBackoff: 250 * time.Millisecond, MaxBackoff: 10 * time.Second}.withDefaults()
	for n, want := range map[int]time.Duration{
		1: 250 * time.Millisecond, 2: 500 * time.Millisecond, 3: time.Second, 6: 8 * time.Second,
		7: 10 * time.Second, 21: 10 * time.Second, 1000: 10 * time.Second,
	} {
		if got := cfg.backoff(n); got != want {
			t.Errorf("backoff(%d) = %v, want %v", n, got, want)
		}
	}
	// 3 h << 20 is past the int64 range of a Duration: it wraps negative.
	huge := Config{MinBackoff: 3 * time.Hour, MaxBackoff: 1<<63 - 1}.withDefaults()
	if got := huge.backoff(40); got != huge.MaxBackoff {
		t.Errorf("backoff past overflow = %v, want MaxBackoff", got)
	}
}
