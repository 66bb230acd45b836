package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// activationsLimits bound what statsctl activations reads: far above
// anything statsd keeps (its ended file is at most 1 MiB, whatever
// --ended-max says), so a person sees every record; the node agent's sweep
// has its own, tighter, caps.
var activationsLimits = sweep.Limits{MaxEnded: 1 << 16, MaxReplyBytes: 64 << 20}

// runActivations reads every page of the ended activations and prints them
// as one list; a page that fails after others were read prints those, then
// the error.
func runActivations(ctx context.Context, e *env, args []string) error {
	fs := flagSet(e, "activations", "Print the activations that ended here recently, each with its final sample, CPU and peak memory")
	return runRead(ctx, e, fs, args, nil,
		func(ctx context.Context, c sandboxstatsv1.WorkloadStatsServiceClient) (*sandboxstatsv1.ListEndedActivationsResponse, error) {
			ended, log, err := sweep.ListEndedLog(ctx, c, activationsLimits)
			if err != nil && len(ended) == 0 {
				return nil, err
			}
			if err != nil {
				err = fmt.Errorf("%d ended activations printed, then: %w", len(ended), err)
			}
			return &sandboxstatsv1.ListEndedActivationsResponse{Ended: ended, EndedLog: log}, err
		}, func(w io.Writer, r *sandboxstatsv1.ListEndedActivationsResponse) error {
			if err := writeActivationsTable(w, r.GetEnded()); err != nil {
				return err
			}
			return writeEndedLog(w, r.GetEndedLog())
		})
}

// writeEndedLog prints the daemon's ended log under the table: its
// instance, the sequences it holds, and what it dropped (nothing from a
// statsd older than the log).
func writeEndedLog(w io.Writer, l *sandboxstatsv1.EndedLog) error {
	if l == nil {
		return nil
	}
	l = sanitized(l) // the instance id is the daemon's text
	held := "none held"
	if l.GetLowestSequence() < l.GetNextSequence() {
		held = fmt.Sprintf("%d to %d held", l.GetLowestSequence(), l.GetNextSequence()-1)
	}
	_, err := fmt.Fprintf(w, "statsd instance %s: sequences %s, next %d; dropped %d past --ended-retention, %d over --ended-max, %d over 1 MiB (%d of them never read)\n",
		l.GetInstanceId(), held, l.GetNextSequence(), l.GetEvictedRetention(), l.GetEvictedMax(), l.GetEvictedSize(), l.GetEvictedNeverServed())
	return err
}

// writeActivationsTable prints one line per ended activation, oldest first:
// its CPU (seconds, the activation's own) and peak (MiB; "≥" marks a lower
// bound), how it ended and how its final sample was obtained.
func writeActivationsTable(w io.Writer, ended []*sandboxstatsv1.EndedActivation) error {
	if len(ended) == 0 {
		_, err := fmt.Fprintln(w, "no ended activations")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tACTOR\tTEMPLATE\tCLASS\tSOURCE\tEPOCH\tDURATION\tOUTCOME\tCPU(s)\tPEAK(MiB)\tFINAL")
	for _, e := range ended {
		e = sanitized(e)
		id := e.GetIdentity()
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			seqCol(e.GetSequence()), id.GetActorUid(), qualified(id.GetTemplateNamespace(), id.GetTemplateName()),
			api.ClassName(e.GetSandboxClass()), api.SourceName(e.GetSource()), formatTime(e.GetEpochUnixNano()),
			durationCol(e.GetEndUnixNano()-e.GetEpochUnixNano()), api.OutcomeName(e.GetOutcome()),
			endedCPU(e), endedPeak(e), finalCol(e))
	}
	return tw.Flush()
}

// seqCol is a record's sequence ("-" from a statsd older than it).
func seqCol(seq uint64) string {
	if seq == 0 {
		return "-"
	}
	return fmt.Sprint(seq)
}

func durationCol(ns int64) string { return time.Duration(ns).Round(time.Millisecond).String() }

func endedCPU(e *sandboxstatsv1.EndedActivation) string {
	if e.CpuUsec == nil {
		return "absent"
	}
	return fmt.Sprintf("%.6f", float64(e.GetCpuUsec())/1e6)
}

func endedPeak(e *sandboxstatsv1.EndedActivation) string {
	if e.MemoryPeakBytes == nil {
		return "absent"
	}
	p := fmt.Sprintf("%.1f", float64(e.GetMemoryPeakBytes())/(1<<20))
	if e.GetMemoryPeakIsLowerBound() {
		return ">=" + p
	}
	return p
}

// finalCol says how the final sample was obtained.
func finalCol(e *sandboxstatsv1.EndedActivation) string {
	switch e.GetFinalProvenance() {
	case sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_READ_AT_END:
		return "read at end"
	case sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_LAST_GOOD_POLL:
		return fmt.Sprintf("last good poll %s before the end (%s)", durationCol(e.GetFinalAgeNanos()), oneLine(e.GetFinalReason()))
	case sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_NONE:
		return "none (" + oneLine(e.GetFinalReason()) + ")"
	}
	return "-"
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

// writeEnded prints one ended activation after a Checkpoint (or a Run that
// replaced one), a figure a line.
func writeEnded(w io.Writer, e *sandboxstatsv1.EndedActivation) error {
	e = sanitized(e)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v, note string) {
		if note == "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, v)
			return
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", k, v, note)
	}
	row("ENDED", formatTime(e.GetEndUnixNano()), "epoch "+formatTime(e.GetEpochUnixNano())+", after "+durationCol(e.GetEndUnixNano()-e.GetEpochUnixNano()))
	row("OUTCOME", api.OutcomeName(e.GetOutcome()), "")
	row("FINAL", finalCol(e), "")
	if e.CpuUsec != nil {
		note := "the activation's own CPU (final minus the epoch baseline)"
		if d := e.GetBaselineDelayNanos(); d > 0 {
			note += fmt.Sprintf("; baseline taken %s after the epoch start", durationCol(d))
		}
		row("CPU", formatUsec(e.GetCpuUsec()), note)
	} else {
		row("CPU", "absent", absentOf(e.GetAbsent(), "cpu_usec"))
	}
	switch {
	case e.MemoryPeakBytes == nil:
		row("MEMORY PEAK", "absent", absentOf(e.GetAbsent(), "memory_peak_bytes"))
	case e.GetMemoryPeakIsLowerBound():
		row("MEMORY PEAK", formatBytes(e.GetMemoryPeakBytes()), "lower bound: the highest current any read saw (the source offers no peak)")
	default:
		row("MEMORY PEAK", formatBytes(e.GetMemoryPeakBytes()), "the source's peak")
	}
	return tw.Flush()
}

func absentOf(as []*sandboxstatsv1.AbsentValue, field string) string {
	for _, a := range as {
		if a.GetField() == field {
			return a.GetReason()
		}
	}
	return ""
}
