package e2e

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestIntegrationCollectorDeploy runs deploy/otel/collector.yaml as a node
// runs it, in the test collector (the same Collector release and
// components), forwarding to a gateway (a second test collector): only the
// listen addresses (free loopback ports instead of 4317/4318), TLS off and
// a shorter batch timeout are overridden on the command line. A metric and
// a usage event sent to the node arrive at the gateway; then the gateway is
// stopped, a second round is sent, and it arrives once the gateway is back
// on the same port (the exporter's queue and retry).
func TestIntegrationCollectorDeploy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the test collector")
	}
	gateway := testenv.StartCollector(t)
	bin := testenv.BuildCollector(t)
	grpcPort, httpPort := freeLoopbackPort(t), freeLoopbackPort(t)
	logPath := filepath.Join(t.TempDir(), "node-otelcol.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", "../deploy/otel/collector.yaml",
		"--config", fmt.Sprintf("yaml:receivers::otlp::protocols::grpc::endpoint: 127.0.0.1:%d", grpcPort),
		"--config", fmt.Sprintf("yaml:receivers::otlp::protocols::http::endpoint: 127.0.0.1:%d", httpPort),
		"--config", "yaml:exporters::otlp_grpc/gateway::tls::insecure: true",
		"--config", "yaml:processors::batch::timeout: 100ms")
	cmd.Env = append(os.Environ(), "OTEL_GATEWAY_ENDPOINT="+gateway.GRPCEndpoint())
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s:\n%s", logPath, b)
		}
	})
	node := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", grpcPort)); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("the node collector is not listening within 30 s:\n%s", b)
		}
	}

	send := func(round int) {
		t.Helper()
		post(t, node+"/v1/metrics", fmt.Sprintf(`{"resourceMetrics":[{"resource":{"attributes":[{"key":"k8s.pod.uid","value":{"stringValue":"pod-%d"}}]},
			"scopeMetrics":[{"metrics":[{"name":"sandbox.test","unit":"1","gauge":{"dataPoints":[{"timeUnixNano":"%d","asInt":"%d"}]}}]}]}]}`, round, time.Now().UnixNano(), round))
		post(t, node+"/v1/logs", fmt.Sprintf(`{"resourceLogs":[{"resource":{"attributes":[{"key":"k8s.pod.uid","value":{"stringValue":"pod-%d"}}]},
			"scopeLogs":[{"logRecords":[{"eventName":"sandbox.test.usage","body":{"stringValue":"round %d"}}]}]}]}`, round, round))
	}
	arrived := func(round int) {
		t.Helper()
		uid := fmt.Sprintf("pod-%d", round)
		gateway.WaitMetrics(t, 30*time.Second, func(pts []testenv.CollectedPoint) bool {
			for _, p := range pts {
				if p.Metric == "sandbox.test" && p.Resource["k8s.pod.uid"] == uid && p.Value == float64(round) {
					return true
				}
			}
			return false
		})
		gateway.WaitLogs(t, 30*time.Second, func(logs []testenv.CollectedLog) bool {
			for _, l := range logs {
				if l.EventName == "sandbox.test.usage" && l.Resource["k8s.pod.uid"] == uid && l.Body == fmt.Sprintf("round %d", round) {
					return true
				}
			}
			return false
		})
	}

	send(1)
	arrived(1)
	gateway.Stop(t)
	send(2) // accepted by the node, queued while its gateway is down
	time.Sleep(2 * time.Second)
	gateway.Start(t)
	arrived(2)
}

// post sends an OTLP/HTTP JSON request and fails the test unless it is
// accepted.
func post(t *testing.T, url, body string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s", url, resp.Status)
	}
}

// freeLoopbackPort returns a loopback TCP port that was free a moment ago.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
