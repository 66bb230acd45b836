package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/sandboxstats/sandboxstats/internal/api"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func runActive(ctx context.Context, e *env, args []string) error {
	fs := flagSet(e, "active", "Print whatever workload statsd measures (the discovery read)")
	includeHost := fs.Bool("include-host", false, "also read the runner-layer (host) counters")
	return runRead(ctx, e, fs, args, nil,
		func(ctx context.Context, c sandboxstatsv1.WorkloadStatsServiceClient) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error) {
			return c.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{IncludeHost: *includeHost})
		}, writeActiveTable)
}

func writeActiveTable(w io.Writer, resp *sandboxstatsv1.StatsActiveWorkloadsResponse) error {
	resp = sanitized(resp)
	if len(resp.GetSamples()) == 0 {
		reason := strings.ToLower(api.NoSampleReasonName(resp.GetNoSampleReason()))
		_, err := fmt.Fprintf(w, "no sample: %s: %s\n", reason, resp.GetNoSampleDetail())
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTOR\tTEMPLATE\tCLASS\tSOURCE\tMEM CURRENT\tWORKING SET\tPEAK\tCPU\tEPOCH")
	for _, s := range resp.GetSamples() {
		peak := "absent"
		if s.MemoryPeakBytes != nil {
			peak = fmt.Sprintf("%.1fMiB", float64(s.GetMemoryPeakBytes())/(1<<20))
		}
		cpu := "absent"
		if s.CpuUsageUsec != nil {
			cpu = fmt.Sprintf("%.3fs", float64(s.GetCpuUsageUsec())/1e6)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1fMiB\t%.1fMiB\t%s\t%s\t%s\n",
			s.GetActorUid(), qualified(s.GetTemplateNamespace(), s.GetTemplateName()),
			api.ClassName(s.GetSandboxClass()), api.SourceName(s.GetSource()),
			float64(s.GetMemoryCurrentBytes())/(1<<20), float64(s.GetMemoryWorkingSetBytes())/(1<<20),
			peak, cpu, formatTime(s.GetEpochUnixNano()))
	}
	return tw.Flush()
}
