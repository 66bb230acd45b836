package logtelemetry

import (
	"testing"

	"go.opentelemetry.io/collector/config/configtelemetry"
)

// TestValidate applies otelconftelemetry's rules: a known encoding, and
// readers for any metrics level above none.
func TestValidate(t *testing.T) {
	def := func() *Config { return NewFactory().CreateDefaultConfig().(*Config) }
	if err := def().Validate(); err != nil {
		t.Errorf("default config: %v", err)
	}
	for name, mutate := range map[string]func(*Config){
		"unknown encoding":       func(c *Config) { c.Logs.Encoding = "logfmt" },
		"metrics without reader": func(c *Config) { c.Metrics.Level = configtelemetry.LevelNormal },
	} {
		c := def()
		mutate(c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	c := def()
	c.Metrics.Level = configtelemetry.LevelNormal
	c.Metrics.Readers = []map[string]any{{"pull": map[string]any{}}}
	if err := c.Validate(); err != nil {
		t.Errorf("metrics with a reader: %v", err)
	}
}
