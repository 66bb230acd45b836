package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/api"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func runStats(ctx context.Context, e *env, args []string) error {
	fs := flagSet(e, "stats", "Print one sample of the workload statsd measures, if it is the one named")
	actorUID := fs.String("actor-uid", "", "the actor you believe runs there (required)")
	includeHost := fs.Bool("include-host", false, "also read the runner-layer (host) counters")
	required := func() error {
		if *actorUID == "" {
			return usageError{fmt.Errorf("--actor-uid is required")}
		}
		return nil
	}
	return runRead(ctx, e, fs, args, required,
		func(ctx context.Context, c sandboxstatsv1.WorkloadStatsServiceClient) (*sandboxstatsv1.WorkloadStatsSample, error) {
			// statsctl knows KnownAbsent: the answer is smaller, and
			// expanded it shows every absent value with its reason.
			resp, err := c.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: *actorUID, IncludeHost: *includeHost, KnownAbsent: true})
			api.ExpandKnownAbsent(resp.GetSample())
			return resp.GetSample(), err
		}, writeSampleTable)
}

// writeSampleTable prints one sample, one figure a line, each with its unit
// and kind.
func writeSampleTable(w io.Writer, s *sandboxstatsv1.WorkloadStatsSample) error {
	s = sanitized(s)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v, note string) { fmt.Fprintf(tw, "%s\t%s\t%s\n", k, v, note) }
	row("ACTOR", s.GetActorUid(), qualified(s.GetActorNamespace(), s.GetActorName()))
	row("TEMPLATE", qualified(s.GetTemplateNamespace(), s.GetTemplateName()), "")
	if p := s.GetWorkerPool(); p != "" {
		row("WORKER POOL", p, "")
	}
	row("CLASS", api.ClassName(s.GetSandboxClass()), "")
	row("SOURCE", api.SourceName(s.GetSource()), s.GetSourceDetail())
	row("EPOCH", formatTime(s.GetEpochUnixNano()), "when the current Run/Restore began")
	row("OBSERVED", formatTime(s.GetObservedAtUnixNano()), "")
	if s.GetSource() == sandboxstatsv1.StatsSource_STATS_SOURCE_UNSPECIFIED {
		row("MEASURED", "no", "numbers below are not measurements")
	}
	row("MEMORY CURRENT", formatBytes(s.GetMemoryCurrentBytes()), "gauge")
	if s.MemoryPeakBytes != nil {
		row("MEMORY PEAK", formatBytes(s.GetMemoryPeakBytes()), "peak, never differenced")
	} else {
		row("MEMORY PEAK", "absent", absentReason(s, "memory_peak_bytes"))
	}
	row("WORKING SET", formatBytes(s.GetMemoryWorkingSetBytes()), "gauge, current minus inactive file")
	if s.CpuUsageUsec != nil {
		row("CPU USAGE", formatUsec(s.GetCpuUsageUsec()), "counter; compare only within one epoch")
	} else {
		row("CPU USAGE", "absent", absentReason(s, "cpu_usage_usec"))
	}
	if s.SandboxOwnCpuUsec != nil {
		row("SANDBOX OWN CPU", formatUsec(s.GetSandboxOwnCpuUsec()), "counter; the sandbox's CPU less its containers' (sentry, gofers, platform)")
	}
	if s.SandboxProcesses != nil {
		note := ""
		if s.GetSandboxProcesses() == 0 {
			note = "DEAD SANDBOX: its cgroup remains but nothing runs"
		}
		row("PROCESSES", fmt.Sprint(s.GetSandboxProcesses()), note)
	}
	shown := signalRows(row, s)
	for _, c := range s.GetUnreadContainers() {
		row("PARTIAL", c.GetContainerId(), c.GetReason())
	}
	for _, a := range s.GetAbsent() {
		if a.GetField() != "memory_peak_bytes" && a.GetField() != "cpu_usage_usec" && !shown[a.GetField()] {
			row("ABSENT", a.GetField(), a.GetReason())
		}
	}
	if n := s.GetOpenDriftFindings(); n > 0 {
		row("DRIFT", fmt.Sprintf("%d open finding(s)", n), "see statsctl drift")
	}
	if h := s.GetHost(); h != nil {
		note := h.GetUnavailableReason()
		if note == "" {
			note = "see statsctl host"
		}
		row("HOST", formatTime(h.GetObservedAtUnixNano()), note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeContainers(w, s.GetContainers())
}

// writeContainers prints a sample's containers, one a line, under the
// sample (nothing when it has none): CPU in seconds (counters), memory in
// MiB (gauges), "-" for a figure absent, an exited container marked after
// its pids, each absent figure's reason on a line of its own below.
func writeContainers(w io.Writer, cs []*sandboxstatsv1.ContainerStats) error {
	if len(cs) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nCONTAINERS (%d)\n", len(cs))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tCPU(s)\tUSER(s)\tSYSTEM(s)\tMEM(MiB)\tWSET(MiB)\tPIDS")
	secs := func(v *uint64) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprintf("%.6f", float64(*v)/1e6)
	}
	mib := func(v *uint64) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprintf("%.1f", float64(*v)/(1<<20))
	}
	count := func(v *uint64) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprint(*v)
	}
	for _, c := range cs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", c.GetId(), dash(c.GetName()),
			secs(c.CpuUsageUsec), secs(c.CpuUserUsec), secs(c.CpuSystemUsec),
			mib(c.MemoryCurrentBytes), mib(c.MemoryWorkingSetBytes), count(c.PidsCurrent))
		if c.GetExited() {
			// Its counters are its last, its gauges absent.
			fmt.Fprint(tw, "\texited")
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, c := range cs {
		// Figures absent for one reason share a line.
		var reasons []string
		fields := map[string][]string{}
		for _, a := range c.GetAbsent() {
			if _, ok := fields[a.GetReason()]; !ok {
				reasons = append(reasons, a.GetReason())
			}
			fields[a.GetReason()] = append(fields[a.GetReason()], a.GetField())
		}
		for _, r := range reasons {
			fmt.Fprintf(w, "  %s: %s absent: %s\n", c.GetId(), strings.Join(fields[r], ", "), r)
		}
	}
	return nil
}

func absentReason(s *sandboxstatsv1.WorkloadStatsSample, field string) string {
	for _, a := range s.GetAbsent() {
		if a.GetField() == field {
			return a.GetReason()
		}
	}
	return "not offered by the source"
}

func qualified(ns, name string) string {
	switch {
	case ns == "" && name == "":
		return "-"
	case ns == "":
		return name
	default:
		return ns + "/" + name
	}
}

func formatTime(unixNano int64) string {
	if unixNano == 0 {
		return "-"
	}
	return time.Unix(0, unixNano).UTC().Format(time.RFC3339Nano)
}

func formatBytes(b uint64) string {
	return fmt.Sprintf("%.1f MiB (%d bytes)", float64(b)/(1<<20), b)
}

func formatUsec(us uint64) string {
	return fmt.Sprintf("%.6f s (%d us)", float64(us)/1e6, us)
}
