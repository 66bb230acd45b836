package main

import (
	"github.com/sandboxstats/sandboxstats/internal/cli"

	"errors"
	"io"
	"testing"
	"time"
)

// TestEndedFlags: --ended-retention defaults to 15 minutes and --ended-max
// to 64 records (what docs/statsagent.md and the agent's --ended-horizon
// rely on), both take a value, and neither may be zero or negative.
func TestEndedFlags(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.endedRetention != 15*time.Minute || c.endedMax != 64 {
		t.Errorf("defaults: --ended-retention %v, --ended-max %d; want 15m0s and 64", c.endedRetention, c.endedMax)
	}
	c, err = parseFlags([]string{"--ended-retention", "40m", "--ended-max", "500"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.endedRetention != 40*time.Minute || c.endedMax != 500 {
		t.Errorf("--ended-retention 40m --ended-max 500: got %v and %d", c.endedRetention, c.endedMax)
	}
	for _, args := range [][]string{
		{"--ended-retention", "0"}, {"--ended-retention", "-1m"}, {"--ended-retention", "15"},
		{"--ended-max", "0"}, {"--ended-max", "-3"}, {"--ended-max", "many"},
	} {
		var ue cli.UsageError
		if _, err := parseFlags(args, io.Discard); !errors.As(err, &ue) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}
