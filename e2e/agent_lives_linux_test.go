package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/grpc"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// agentLife is one statsagent process of an agentLives: when it started
// and ended, how it ended, and its log.
type agentLife struct {
	start, end time.Time // end zero while it runs
	how        string    // how it was killed ("" while it runs, "stopped" at the cleanup)
	log        string
}

// agentLives runs the statsagent binary again and again with the same
// arguments and the same metrics address (a Prometheus scrape target names
// one address; the port was free when the test began and is taken back at
// every start: a start that cannot bind it fails the test), each life's
// output in its own log. The test's cleanup stops the running life with
// SIGTERM and fails the test if it does not exit cleanly.
type agentLives struct {
	bin, dir, addr string
	args           []string

	mu    sync.Mutex
	cmd   *exec.Cmd
	lives []agentLife
}

// startAgentLives starts the first life of binDir/statsagent with args and
// --metrics-listen on a free loopback port.
func startAgentLives(t *testing.T, binDir, dir string, args ...string) *agentLives {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	a := &agentLives{bin: filepath.Join(binDir, "statsagent"), dir: dir, addr: addr, args: append(args, "--metrics-listen", addr)}
	t.Cleanup(func() {
		a.mu.Lock()
		cmd := a.cmd
		a.mu.Unlock()
		if cmd != nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			if err := a.wait(cmd, 10*time.Second); err != nil {
				t.Errorf("statsagent after SIGTERM: %v", err)
			}
			a.ended("stopped")
		}
		if t.Failed() {
			a.logTails(t)
		}
	})
	if err := a.start(); err != nil {
		t.Fatal(err)
	}
	return a
}

// url is the agent's base URL, the same in every life.
func (a *agentLives) url() string { return "http://" + a.addr }

// start starts a new life and waits (up to 10 s) until it serves /metrics.
// It returns an error rather than failing the test: the chaos goroutine
// calls it.
func (a *agentLives) start() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd != nil {
		return errors.New("statsagent is already running")
	}
	logPath := filepath.Join(a.dir, fmt.Sprintf("statsagent-%02d.log", len(a.lives)))
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(a.bin, a.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return err
	}
	a.cmd = cmd
	a.lives = append(a.lives, agentLife{start: time.Now(), log: logPath})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile(logPath); strings.Contains(string(b), `msg="statsagent serving"`) {
			return nil
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("statsagent life %d did not serve on %s within 10 s:\n%s", len(a.lives)-1, a.addr, b)
		}
	}
}

// kill SIGKILLs the running life and waits for it; how says where it was
// killed.
func (a *agentLives) kill(how string) error {
	a.mu.Lock()
	cmd := a.cmd
	a.mu.Unlock()
	if cmd == nil {
		return errors.New("no statsagent to kill")
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	if err := a.wait(cmd, 10*time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
		return fmt.Errorf("statsagent after SIGKILL: %v", err)
	}
	a.ended(how)
	return nil
}

func (a *agentLives) wait(cmd *exec.Cmd, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("did not exit within %v", timeout)
	}
}

func (a *agentLives) ended(how string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cmd = nil
	l := &a.lives[len(a.lives)-1]
	l.end, l.how = time.Now(), how
}

// lifeAt returns the index of the life running at ts (unix ns), or -1.
func (a *agentLives) lifeAt(ts uint64) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	at := time.Unix(0, int64(ts))
	for i, l := range a.lives {
		if !at.Before(l.start) && (l.end.IsZero() || at.Before(l.end)) {
			return i
		}
	}
	return -1
}

// describeLife says which life i is and how it ended.
func (a *agentLives) describeLife(i int) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if i < 0 || i >= len(a.lives) {
		return "no life (the agent was down)"
	}
	l := a.lives[i]
	if l.end.IsZero() {
		return fmt.Sprintf("life %d (still running)", i)
	}
	return fmt.Sprintf("life %d (killed: %s, at %s)", i, l.how, l.end.Format("15:04:05.000"))
}

// logTails logs the last lines of every life's log.
func (a *agentLives) logTails(t *testing.T) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, l := range a.lives {
		b, _ := os.ReadFile(l.log)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		lines = lines[max(0, len(lines)-15):]
		t.Logf("statsagent life %d (%s to %s, %s), last lines of %s:\n%s", i, l.start.Format("15:04:05.000"),
			l.end.Format("15:04:05.000"), l.how, l.log, strings.Join(lines, "\n"))
	}
}

// agentGauge reads one unlabelled series of the agent's /metrics, without
// failing the test (the chaos goroutine calls it, and the agent may be
// down).
func agentGauge(base, name string) (float64, bool) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

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
