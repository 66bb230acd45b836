package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/grpc"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// sentEvent is one usage event as it arrived, whoever received it.
type sentEvent struct {
	uid, kind, actor string
	cpu              float64 // sandboxstats.stats.cpu.time, 0 if absent
	observed         uint64  // the record's observed timestamp: when the agent emitted it
}

// eventSink is where the agent's OTLP goes: the real Collector on the host,
// an in-process receiver in the VM lane's guest (which has no Collector).
// Killed, it is gone at once, what it held unwritten lost; while paused it
// answers no export (they hang until it resumes).
type eventSink interface {
	Start(t testing.TB)
	kill(t testing.TB)
	pause() error
	resume() error
	events(t testing.TB) []sentEvent
}

// collectorSink is the real Collector as an eventSink, paused by SIGSTOP.
type collectorSink struct{ *testenv.Collector }

// kill SIGKILLs the Collector and removes the Unix socket it leaves behind
// (which would keep it from starting again).
func (c collectorSink) kill(t testing.TB) {
	t.Helper()
	c.Kill(t)
	if err := os.Remove(c.Socket()); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Error(err)
	}
}

func (c collectorSink) pause() error  { return c.signal(syscall.SIGSTOP) }
func (c collectorSink) resume() error { return c.signal(syscall.SIGCONT) }

// signal signals the Collector's process, found by its config file on its
// command line.
func (c collectorSink) signal(sig syscall.Signal) error {
	dirs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		return err
	}
	for _, f := range dirs {
		b, _ := os.ReadFile(f)
		if strings.Contains(string(b), "\x00--config\x00"+c.Config+"\x00") {
			pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			if err != nil {
				return err
			}
			return syscall.Kill(pid, sig)
		}
	}
	return fmt.Errorf("no collector process with --config %s", c.Config)
}

func (c collectorSink) events(t testing.TB) []sentEvent {
	var out []sentEvent
	for _, l := range c.Logs(t) {
		if l.EventName != "sandboxstats.workload.usage_sampled" {
			continue
		}
		e := sentEvent{observed: l.ObservedUnixNano}
		e.uid, _ = l.Attributes["log.record.uid"].(string)
		e.kind, _ = l.Attributes["sandboxstats.stats.kind"].(string)
		e.actor, _ = l.Attributes["sandboxstats.actor.uid"].(string)
		e.cpu, _ = l.Attributes["sandboxstats.stats.cpu.time"].(float64)
		out = append(out, e)
	}
	return out
}

// otlpSink is an in-process OTLP/gRPC receiver on a Unix socket that keeps
// the usage events it acknowledged (and acknowledges metrics unread); kill
// closes it as a killed collector would, Start listens again on the same
// socket.
type otlpSink struct {
	collogs.UnimplementedLogsServiceServer
	socket string

	mu     sync.Mutex
	srv    *grpc.Server
	got    []sentEvent
	paused chan struct{} // closed by resume; nil when not paused
}

func (s *otlpSink) pause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paused == nil {
		s.paused = make(chan struct{})
	}
	return nil
}

func (s *otlpSink) resume() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paused != nil {
		close(s.paused)
		s.paused = nil
	}
	return nil
}

func startOTLPSink(t *testing.T, socket string) *otlpSink {
	t.Helper()
	s := &otlpSink{socket: socket}
	t.Cleanup(func() { s.kill(t) })
	s.Start(t)
	return s
}

func (s *otlpSink) Start(t testing.TB) {
	t.Helper()
	_ = os.Remove(s.socket)
	l, err := net.Listen("unix", s.socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	collogs.RegisterLogsServiceServer(srv, s)
	colmetrics.RegisterMetricsServiceServer(srv, metricsDiscard{})
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
}

func (s *otlpSink) kill(testing.TB) {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

func (s *otlpSink) Export(ctx context.Context, req *collogs.ExportLogsServiceRequest) (*collogs.ExportLogsServiceResponse, error) {
	s.mu.Lock()
	paused := s.paused
	s.mu.Unlock()
	if paused != nil {
		select {
		case <-paused:
		case <-ctx.Done(): // the agent gave up or died: nothing was taken
			return nil, ctx.Err()
		}
	}
	var got []sentEvent
	for _, rl := range req.GetResourceLogs() {
		for _, sl := range rl.GetScopeLogs() {
			for _, r := range sl.GetLogRecords() {
				e := sentEvent{observed: r.GetObservedTimeUnixNano()}
				for _, kv := range r.GetAttributes() {
					switch kv.GetKey() {
					case "log.record.uid":
						e.uid = kv.GetValue().GetStringValue()
					case "sandboxstats.stats.kind":
						e.kind = kv.GetValue().GetStringValue()
					case "sandboxstats.actor.uid":
						e.actor = kv.GetValue().GetStringValue()
					case "sandboxstats.stats.cpu.time":
						e.cpu = kv.GetValue().GetDoubleValue()
					}
				}
				got = append(got, e)
			}
		}
	}
	s.mu.Lock()
	s.got = append(s.got, got...)
	s.mu.Unlock()
	return &collogs.ExportLogsServiceResponse{}, nil
}

// metricsDiscard acknowledges OTLP metrics unread.
type metricsDiscard struct {
	colmetrics.UnimplementedMetricsServiceServer
}

func (metricsDiscard) Export(context.Context, *colmetrics.ExportMetricsServiceRequest) (*colmetrics.ExportMetricsServiceResponse, error) {
	return &colmetrics.ExportMetricsServiceResponse{}, nil
}

func (s *otlpSink) events(testing.TB) []sentEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sentEvent(nil), s.got...)
}
