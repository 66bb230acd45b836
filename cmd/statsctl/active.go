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
	fs := flagSet(e, "active", "Print every workload statsd measures (the discovery read)")
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
		if _, err := fmt.Fprintf(w, "no sample: %s: %s\n", reason, resp.GetNoSampleDetail()); err != nil {
			return err
		}
		return writePending(w, resp.GetPending())
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
	if err := tw.Flush(); err != nil {
		return err
	}
	return writePending(w, resp.GetPending())
}

// writePending prints the bound workloads that have no sample in the
// answer, with why: their numbers are absent, not zero.
func writePending(w io.Writer, pending []*sandboxstatsv1.PendingWorkload) error {
	if len(pending) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\n%d bound without a sample:\n", len(pending))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTOR\tTEMPLATE\tCLASS\tEPOCH\tREASON\tDETAIL")
	for _, p := range pending {
		id := p.GetIdentity()
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", id.GetActorUid(), qualified(id.GetTemplateNamespace(), id.GetTemplateName()),
			api.ClassName(p.GetSandboxClass()), formatTime(p.GetEpochUnixNano()), api.Reason(p.GetReason()), p.GetDetail())
	}
	return tw.Flush()
}
