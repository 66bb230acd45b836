package rate

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/api"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Row is one line of `statsctl watch`: one sample, with the CPU rate since
// the previous measured sample of the same series when there is one.
type Row struct {
	// ObservedAt is the sample's observed_at (daemon wall clock), UTC.
	ObservedAt    time.Time `json:"observed_at"`
	ActorUID      string    `json:"actor_uid"`
	SandboxClass  string    `json:"sandbox_class"`
	Source        string    `json:"source"`
	EpochUnixNano int64     `json:"epoch_unix_nano"`
	// IntervalSeconds is the wall time the rate covers (delta observed_at);
	// absent when there is no rate.
	IntervalSeconds *float64 `json:"interval_seconds,omitempty"`
	// CPUCores is CPU cores used over the interval (delta cpu_usage_usec /
	// delta observed_at); absent when Event says why there is no rate.
	CPUCores *float64 `json:"cpu_cores,omitempty"`
	// CPUUsageUsec is the raw counter (microseconds, within the epoch).
	CPUUsageUsec *uint64 `json:"cpu_usage_usec,omitempty"`
	// Gauges in bytes as read; absent when not measured (and peak when the
	// source does not offer it).
	MemoryCurrentBytes    *uint64 `json:"memory_current_bytes,omitempty"`
	MemoryWorkingSetBytes *uint64 `json:"memory_working_set_bytes,omitempty"`
	MemoryPeakBytes       *uint64 `json:"memory_peak_bytes,omitempty"`
	// Event is empty when the row continues the previous one; otherwise it
	// says why there is no rate (epoch-reset, counter-reset, no-interval...).
	Event Event `json:"event,omitempty"`
}

// Watcher turns successive samples of one workload (as `statsctl watch`
// reads them) into Rows. The zero value is ready to use; it is not safe for
// concurrent use.
type Watcher struct {
	prev *sandboxstatsv1.WorkloadStatsSample // last measured sample
}

// Observe returns the Row for s and makes s the baseline of the next one if
// it was measured. A sample that was not measured leaves the baseline alone,
// so the next measured sample is rated over the longer interval.
func (w *Watcher) Observe(s *sandboxstatsv1.WorkloadStatsSample) Row {
	r := Row{
		ObservedAt:    time.Unix(0, s.GetObservedAtUnixNano()).UTC(),
		ActorUID:      s.GetActorUid(),
		SandboxClass:  api.ClassName(s.GetSandboxClass()),
		Source:        api.SourceName(s.GetSource()),
		EpochUnixNano: s.GetEpochUnixNano(),
	}
	cores, ev, ok := CPUCores(w.prev, s)
	r.Event = ev
	if ok {
		iv := float64(s.GetObservedAtUnixNano()-w.prev.GetObservedAtUnixNano()) / 1e9
		r.IntervalSeconds = &iv
		r.CPUCores = &cores
	}
	if ev == EventNotMeasured {
		return r
	}
	r.CPUUsageUsec = s.CpuUsageUsec
	r.MemoryCurrentBytes = ptr(s.GetMemoryCurrentBytes())
	r.MemoryWorkingSetBytes = ptr(s.GetMemoryWorkingSetBytes())
	if s.MemoryPeakBytes != nil {
		r.MemoryPeakBytes = ptr(s.GetMemoryPeakBytes())
	}
	if ev != EventCPUAbsent {
		w.prev = s
	}
	return r
}

func ptr[T any](v T) *T { return &v }

// RowWriter writes Rows one at a time, so `statsctl watch` can print each as
// it arrives.
type RowWriter interface {
	WriteRow(Row) error
}

// NewTableWriter returns a RowWriter printing fixed-width columns, with a
// header before the first row. Memory is printed in MiB (2^20 bytes) with
// one decimal, CPU in cores with three; "-" marks an absent value, and NOTE
// says why a row has no rate.
func NewTableWriter(w io.Writer) RowWriter { return &tableWriter{w: w} }

type tableWriter struct {
	w          io.Writer
	headerDone bool
}

const watchRowFormat = "%-24s  %-20s  %-11s  %10s  %10s  %10s  %10s  %s"

func (t *tableWriter) WriteRow(r Row) error {
	if !t.headerDone {
		if err := t.line("TIME(UTC)", "ACTOR", "SOURCE",
			"CPU(cores)", "MEM(MiB)", "WSET(MiB)", "PEAK(MiB)", "NOTE"); err != nil {
			return err
		}
		t.headerDone = true
	}
	return t.line(r.ObservedAt.Format("2006-01-02T15:04:05.000Z"), r.ActorUID, r.Source,
		fmtFloat(r.CPUCores, 3), fmtMiB(r.MemoryCurrentBytes), fmtMiB(r.MemoryWorkingSetBytes),
		fmtMiB(r.MemoryPeakBytes), string(r.Event))
}

func (t *tableWriter) line(cols ...any) error {
	_, err := fmt.Fprintln(t.w, strings.TrimRight(fmt.Sprintf(watchRowFormat, cols...), " "))
	return err
}

func fmtFloat(v *float64, prec int) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.*f", prec, *v)
}

func fmtMiB(v *uint64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(*v)/(1<<20))
}

// NewJSONWriter returns a RowWriter emitting one JSON object per line.
func NewJSONWriter(w io.Writer) RowWriter { return jsonWriter{enc: json.NewEncoder(w)} }

type jsonWriter struct{ enc *json.Encoder }

func (j jsonWriter) WriteRow(r Row) error { return j.enc.Encode(r) }

// WriteWatchTable writes rows as NewTableWriter does.
func WriteWatchTable(w io.Writer, rows []Row) error { return writeAll(NewTableWriter(w), rows) }

// WriteWatchJSON writes rows as JSON lines, as NewJSONWriter does.
func WriteWatchJSON(w io.Writer, rows []Row) error { return writeAll(NewJSONWriter(w), rows) }

func writeAll(rw RowWriter, rows []Row) error {
	for _, r := range rows {
		if err := rw.WriteRow(r); err != nil {
			return fmt.Errorf("rate: write row: %w", err)
		}
	}
	return nil
}
