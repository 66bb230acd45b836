// Package jsonfile is a Collector exporter (component type "jsonfile") that
// appends each batch of metrics or logs it receives to a file as one line of
// OTLP JSON (pmetric.JSONMarshaler, plog.JSONMarshaler), written and closed
// before ConsumeMetrics or ConsumeLogs returns, so that a test reading the
// file sees every batch the exporter has accepted. It stands in for
// contrib's fileexporter, whose v0.165.1 module cannot be tidied here (its
// tests import a module version the module proxy does not serve).
//
//	exporters:
//	  jsonfile/metrics:
//	    path: /tmp/x/metrics.jsonl
//
// Each exporter appends to its own path; the file is created (mode 0644)
// when missing and never truncated, so a restarted collector keeps
// appending to it.
package jsonfile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
)

// Type is the component type of the exporter in a collector's config.
var Type = component.MustNewType("jsonfile")

// Config is the exporter's configuration.
type Config struct {
	// Path is the file each batch is appended to, one OTLP JSON object per
	// line.
	Path string `mapstructure:"path"`
}

// Validate rejects a config without a path.
func (c *Config) Validate() error {
	if c.Path == "" {
		return errors.New("jsonfile: path must be set")
	}
	return nil
}

// NewFactory returns the factory of the jsonfile exporter (metrics and logs).
func NewFactory() exporter.Factory {
	return exporter.NewFactory(Type, func() component.Config { return &Config{} },
		exporter.WithMetrics(func(_ context.Context, _ exporter.Settings, cfg component.Config) (exporter.Metrics, error) {
			return newFileExporter(cfg.(*Config).Path), nil
		}, component.StabilityLevelDevelopment),
		exporter.WithLogs(func(_ context.Context, _ exporter.Settings, cfg component.Config) (exporter.Logs, error) {
			return newFileExporter(cfg.(*Config).Path), nil
		}, component.StabilityLevelDevelopment),
	)
}

// fileExporter appends lines to path, one write per line under mu.
type fileExporter struct {
	path string
	mu   sync.Mutex
}

var (
	_ exporter.Metrics = (*fileExporter)(nil)
	_ exporter.Logs    = (*fileExporter)(nil)
)

func newFileExporter(path string) *fileExporter { return &fileExporter{path: path} }

// Start checks that the file can be opened for appending.
func (e *fileExporter) Start(context.Context, component.Host) error {
	return e.appendLine(nil)
}

// Shutdown does nothing: every batch is written and the file closed before
// Consume returns.
func (e *fileExporter) Shutdown(context.Context) error { return nil }

// Capabilities reports that the exporter does not modify the data.
func (e *fileExporter) Capabilities() consumer.Capabilities {
	return consumer.Capabilities{MutatesData: false}
}

// ConsumeMetrics appends md to the file as one line of OTLP JSON.
func (e *fileExporter) ConsumeMetrics(_ context.Context, md pmetric.Metrics) error {
	b, err := (&pmetric.JSONMarshaler{}).MarshalMetrics(md)
	if err != nil {
		return fmt.Errorf("jsonfile: marshal metrics for %s: %w", e.path, err)
	}
	return e.appendLine(b)
}

// ConsumeLogs appends ld to the file as one line of OTLP JSON.
func (e *fileExporter) ConsumeLogs(_ context.Context, ld plog.Logs) error {
	b, err := (&plog.JSONMarshaler{}).MarshalLogs(ld)
	if err != nil {
		return fmt.Errorf("jsonfile: marshal logs for %s: %w", e.path, err)
	}
	return e.appendLine(b)
}

// appendLine opens the file for appending, writes line and a newline in
// one write (nothing when line is nil) and closes it.
func (e *fileExporter) appendLine(line []byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	f, err := os.OpenFile(e.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("jsonfile: %w", err)
	}
	if line != nil {
		if _, err := f.Write(append(line, '\n')); err != nil {
			f.Close()
			return fmt.Errorf("jsonfile: write %s: %w", e.path, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("jsonfile: close %s: %w", e.path, err)
	}
	return nil
}
