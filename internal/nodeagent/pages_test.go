package nodeagent

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// pagingDaemon serves its ended activations as statsd pages them:
// StatsActiveWorkloads carries the first and a token, ListEndedActivations
// one more a page.
type pagingDaemon struct {
	sandboxstatsv1.UnimplementedWorkloadStatsServiceServer
	ended []*sandboxstatsv1.EndedActivation
}

func (d *pagingDaemon) StatsActiveWorkloads(context.Context, *sandboxstatsv1.StatsActiveWorkloadsRequest) (*sandboxstatsv1.StatsActiveWorkloadsResponse, error) {
	return &sandboxstatsv1.StatsActiveWorkloadsResponse{NoSampleReason: sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD,
		Ended: d.ended[:1], EndedNextPageToken: "1"}, nil
}

func (d *pagingDaemon) ListEndedActivations(_ context.Context, req *sandboxstatsv1.ListEndedActivationsRequest) (*sandboxstatsv1.ListEndedActivationsResponse, error) {
	i, _ := strconv.Atoi(req.GetPageToken())
	resp := &sandboxstatsv1.ListEndedActivationsResponse{Ended: d.ended[i : i+1]}
	if i+1 < len(d.ended) {
		resp.NextPageToken = strconv.Itoa(i + 1)
	}
	return resp, nil
}

// TestAgentReadsEveryPage: a daemon whose ten ended activations come one a
// page (the first in StatsActiveWorkloads): the agent's sweep reads them
// all and charges each once, though two sweeps read them.
func TestAgentReadsEveryPage(t *testing.T) {
	dir := t.TempDir()
	var log bytes.Buffer
	a, err := New(Config{Sockets: filepath.Join(dir, "*.sock"), Interval: time.Minute, Timeout: 10 * time.Second, Concurrency: 1,
		Grace: time.Minute, ActivationLog: &log}, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	d := &pagingDaemon{}
	start := time.Now()
	for i := range 10 {
		s := sample(fmt.Sprintf("w%d", i), 0, 1<<20)
		s.EpochUnixNano = start.Add(time.Duration(i) * time.Second).UnixNano()
		d.ended = append(d.ended, endedOf(s, start.Add(time.Duration(i)*time.Second+500*time.Millisecond), 250_000))
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "statsd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	sandboxstatsv1.RegisterWorkloadStatsServiceServer(srv, d)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	for range 2 {
		results := a.SweepOnce(context.Background())
		if len(results) != 1 || len(results[0].Ended) != 10 || results[0].EndedErr != nil {
			t.Fatalf("sweep: %+v", results)
		}
	}
	var ended float64
	for _, v := range pick(gather(t, a.reg), metricActivationsEnded) {
		ended += v
	}
	if ended != 10 {
		t.Errorf("%s = %v, want 10", metricActivationsEnded, ended)
	}
	if n := len(strings.Split(strings.TrimSpace(log.String()), "\n")); n != 10 {
		t.Errorf("activation log has %d lines, want 10", n)
	}
	cpu := pick(gather(t, a.reg), metricCPUSeconds)
	t.Logf("%s after two sweeps: %v", metricCPUSeconds, cpu)
	for _, v := range cpu {
		if d := v - 2.5; d > 1e-9 || d < -1e-9 {
			t.Errorf("cpu seconds %v, want 2.5 (ten tails of 0.25 s, each once)", v)
		}
	}
}
