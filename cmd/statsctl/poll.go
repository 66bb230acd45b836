package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/status"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/rate"
	"github.com/sandboxstats/sandboxstats/internal/sockaddr"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func runPoll(ctx context.Context, e *env, args []string) error {
	fs := flagSet(e, "poll", "Poll every statsd whose socket matches a glob once, as the node agent does, and print what it would see")
	var (
		glob        string
		concurrency int
		timeout     time.Duration
	)
	glob = "/run/statsd/*.sock"
	fs.Var(sockaddr.Flag{Path: &glob}, "sockets", "statsd stats sockets: a `glob`, unix:GLOB or unix:///GLOB")
	fs.IntVar(&concurrency, "concurrency", 8, "daemons polled at once")
	fs.DurationVar(&timeout, "timeout", 10*time.Second, "deadline of each daemon's call")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	if concurrency < 1 || timeout <= 0 {
		return usageError{fmt.Errorf("--concurrency must be at least 1 and --timeout positive")}
	}
	results, err := sweep.Sweep(ctx, glob, concurrency, timeout)
	if err != nil {
		return usageError{err}
	}
	return writePollTable(e.stdout, results)
}

// writePollTable prints one sweep as `statsctl poll` shows it: one line per
// sample (a daemon with no sample gets one line saying why). CPU is the raw
// counter in seconds within the epoch (a counter, not a rate); memory is in
// MiB (2^20 bytes); "-" marks an absent value. Samples whose source is
// unspecified were not measured and show no numbers.
func writePollTable(w io.Writer, results []sweep.DaemonResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SOCKET\tSTATUS\tACTOR\tCLASS\tSOURCE\tTEMPLATE\tEPOCH(UTC)\tCPU(s)\tMEM(MiB)\tWSET(MiB)\tPEAK(MiB)\tDETAIL")
	for _, r := range results {
		switch r.Status {
		case sweep.StatusOK:
			for _, s := range r.Samples {
				fmt.Fprintln(tw, strings.Join(sampleCols(r, sanitized(s)), "\t"))
			}
		default:
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\t%s\n", safe(r.Socket), statusCol(r), detailCol(r))
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write poll table: %w", err)
	}
	return nil
}

func sampleCols(r sweep.DaemonResult, s *sandboxstatsv1.WorkloadStatsSample) []string {
	cols := []string{
		safe(r.Socket), statusCol(r), s.GetActorUid(), api.ClassName(s.GetSandboxClass()), api.SourceName(s.GetSource()),
		dash(s.GetTemplateNamespace() + "/" + s.GetTemplateName()), epochCol(s.GetEpochUnixNano()),
	}
	if !rate.Measured(s) {
		return append(cols, "-", "-", "-", "-", "not measured")
	}
	peak := "-"
	if s.MemoryPeakBytes != nil {
		peak = mib(s.GetMemoryPeakBytes())
	}
	cpu := "-"
	if s.CpuUsageUsec != nil {
		cpu = fmt.Sprintf("%.3f", float64(s.GetCpuUsageUsec())/1e6)
	}
	return append(cols,
		cpu,
		mib(s.GetMemoryCurrentBytes()), mib(s.GetMemoryWorkingSetBytes()), peak, dash(s.GetSourceDetail()))
}

func statusCol(r sweep.DaemonResult) string {
	if r.Status == sweep.StatusError {
		return "error:" + r.Code.String()
	}
	return string(r.Status)
}

func detailCol(r sweep.DaemonResult) string {
	switch r.Status {
	case sweep.StatusNoSample:
		reason := strings.ToLower(strings.ReplaceAll(api.NoSampleReasonName(r.NoSampleReason), "_", "-"))
		if r.NoSampleDetail != "" {
			return reason + ": " + safe(r.NoSampleDetail)
		}
		return reason
	case sweep.StatusError, sweep.StatusVanished:
		if r.Err == nil {
			return "-"
		}
		return dash(safe(status.Convert(unwrapAll(r.Err)).Message()))
	}
	return "-"
}

// unwrapAll returns the innermost error, the gRPC status error.
func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok || u.Unwrap() == nil {
			return err
		}
		err = u.Unwrap()
	}
}

func epochCol(ns int64) string {
	if ns == 0 {
		return "-"
	}
	return time.Unix(0, ns).UTC().Format(time.RFC3339)
}

func mib(b uint64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }

func dash(s string) string {
	if s == "" || s == "/" {
		return "-"
	}
	return s
}
