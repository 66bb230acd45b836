package e2e

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestIntegrationCollectorDeploy runs deploy/otel/collector.yaml as a node
// runs it, in the test collector (the same Collector release and
// components), forwarding to a gateway (a second test collector), with
// deployCollector's overrides. A metric and a usage event sent to the node
// arrive at the gateway; then the gateway is stopped, a second round is
// sent, and it arrives once the gateway is back on the same port (the
// exporter's queue and retry).
func TestIntegrationCollectorDeploy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the test collector")
	}
	gateway := testenv.StartCollector(t)
	node := deployCollector(t, gateway, t.TempDir()).HTTPEndpoint()

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

// deployCollector starts deploy/otel/collector.yaml in the test collector
// (testenv.WithCollectorConfigFile) forwarding to gateway. Only what a test
// on one machine needs is overridden: the listen addresses (free loopback
// ports instead of 4317/4318), TLS off, the queue's storage in storageDir
// (instead of /var/lib/otelcol), its batches flushed after 100 ms instead
// of 5 s and its retries at most 1 s apart instead of 30 s; extra
// overrides follow those.
func deployCollector(t *testing.T, gateway *testenv.Collector, storageDir string, extra ...string) *testenv.Collector {
	t.Helper()
	return testenv.StartCollector(t, testenv.WithCollectorConfigFile("../deploy/otel/collector.yaml",
		[]string{"OTEL_GATEWAY_ENDPOINT=" + gateway.GRPCEndpoint()},
		append([]string{
			"extensions::file_storage::directory: " + strconv.Quote(storageDir),
			"exporters::otlp_grpc/gateway::tls::insecure: true",
			"exporters::otlp_grpc/gateway::sending_queue::batch::flush_timeout: 100ms",
			"exporters::otlp_grpc/gateway::retry_on_failure::max_interval: 1s",
		}, extra...)...))
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
