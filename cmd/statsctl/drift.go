package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/sandboxstats/sandboxstats/internal/api"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func runDrift(ctx context.Context, e *env, args []string) error {
	fs := flagSet(e, "drift", "Print the drift check's open findings and recent events")
	return runRead(ctx, e, fs, args, nil,
		func(ctx context.Context, c sandboxstatsv1.WorkloadStatsServiceClient) (*sandboxstatsv1.ListDriftFindingsResponse, error) {
			return c.ListDriftFindings(ctx, &sandboxstatsv1.ListDriftFindingsRequest{})
		}, writeDriftTable)
}

func writeDriftTable(w io.Writer, resp *sandboxstatsv1.ListDriftFindingsResponse) error {
	resp = sanitized(resp)
	st := resp.GetStatus()
	if st.GetLastCycleUnixNano() == 0 {
		fmt.Fprintf(w, "check: %s; no cycle yet\n", onOff(st.GetEnabled()))
	} else {
		fmt.Fprintf(w, "check: %s; last cycle %s: %s\n", onOff(st.GetEnabled()), formatTime(st.GetLastCycleUnixNano()), st.GetLastOutcome())
	}
	for _, s := range st.GetSkippedComparisons() {
		fmt.Fprintf(w, "skipped: %s (its findings kept)\n", s)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(resp.GetFindings()) == 0 {
		fmt.Fprintln(tw, "\nno open findings")
	} else {
		fmt.Fprintln(tw, "\nOPEN FINDING\tSUBJECT\tACTOR\tFIRST SEEN\tDETAIL")
		for _, f := range resp.GetFindings() {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", api.DriftKindName(f.GetKind()), f.GetSubject(), f.GetActorUid(), formatTime(f.GetFirstSeenUnixNano()), f.GetDetail())
		}
	}
	if len(resp.GetEvents()) > 0 {
		fmt.Fprintln(tw, "\nEVENT\tAT\tMESSAGE")
		for _, e := range resp.GetEvents() {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", api.DriftEventTypeName(e.GetType()), formatTime(e.GetAtUnixNano()), e.GetMessage())
		}
	}
	return tw.Flush()
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}
