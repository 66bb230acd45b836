package jsonfile

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"testing"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
)

// TestAppendsOneLinePerBatch writes two metric batches and one log batch
// through the factory's exporters (one file each, the second metrics
// exporter standing for a restarted collector) and reads them back.
func TestAppendsOneLinePerBatch(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	f := NewFactory()
	set := exporter.Settings{ID: component.NewID(Type)}

	mcfg := &Config{Path: filepath.Join(dir, "metrics.jsonl")}
	for i := range 2 {
		me, err := f.CreateMetrics(ctx, set, mcfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := me.Start(ctx, nil); err != nil {
			t.Fatal(err)
		}
		md := pmetric.NewMetrics()
		m := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
		m.SetName("test.gauge")
		m.SetEmptyGauge().DataPoints().AppendEmpty().SetIntValue(int64(i))
		if err := me.ConsumeMetrics(ctx, md); err != nil {
			t.Fatal(err)
		}
		if err := me.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lcfg := &Config{Path: filepath.Join(dir, "logs.jsonl")}
	le, err := f.CreateLogs(ctx, set, lcfg)
	if err != nil {
		t.Fatal(err)
	}
	ld := plog.NewLogs()
	rec := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords().AppendEmpty()
	rec.SetEventName("test.event")
	rec.Body().SetStr("hello")
	if err := le.ConsumeLogs(ctx, ld); err != nil {
		t.Fatal(err)
	}

	lines := readLines(t, mcfg.Path)
	if len(lines) != 2 {
		t.Fatalf("%s: %d lines, want 2", mcfg.Path, len(lines))
	}
	for i, line := range lines {
		md, err := (&pmetric.JSONUnmarshaler{}).UnmarshalMetrics(line)
		if err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		dp := md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().At(0).Gauge().DataPoints().At(0)
		if dp.IntValue() != int64(i) {
			t.Errorf("line %d: value %d, want %d", i, dp.IntValue(), i)
		}
	}
	lines = readLines(t, lcfg.Path)
	if len(lines) != 1 {
		t.Fatalf("%s: %d lines, want 1", lcfg.Path, len(lines))
	}
	got, err := (&plog.JSONUnmarshaler{}).UnmarshalLogs(lines[0])
	if err != nil {
		t.Fatal(err)
	}
	if r := got.ResourceLogs().At(0).ScopeLogs().At(0).LogRecords().At(0); r.EventName() != "test.event" || r.Body().Str() != "hello" {
		t.Errorf("log record: event %q body %q", r.EventName(), r.Body().Str())
	}
}

// TestValidate rejects an empty path.
func TestValidate(t *testing.T) {
	if err := (&Config{}).Validate(); err == nil {
		t.Error("empty path: no error")
	}
	if err := (&Config{Path: "x"}).Validate(); err != nil {
		t.Error(err)
	}
}

// TestStartFailsOnBadPath reports an unwritable path at start.
func TestStartFailsOnBadPath(t *testing.T) {
	e := newFileExporter(filepath.Join(t.TempDir(), "missing", "metrics.jsonl"))
	if err := e.Start(context.Background(), nil); err == nil {
		t.Error("no error")
	}
}

func readLines(t *testing.T, path string) [][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, append([]byte(nil), sc.Bytes()...))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}
