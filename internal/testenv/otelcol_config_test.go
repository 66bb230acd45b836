package testenv

import (
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestCollectorArgs checks the command lines of a collector with the
// test's own config and of one with a repository's config file
// (WithCollectorConfigFile): its receiver moved to the collector's ports,
// the overrides after it in order, the environment added.
func TestCollectorArgs(t *testing.T) {
	abs, err := filepath.Abs("../../deploy/otel/collector.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		opts     []CollectorOption
		wantArgs []string
		wantEnv  []string
	}{
		{
			name:     "the test's own config",
			wantArgs: []string{"--config", "/tmp/c/otelcol.yaml"},
		},
		{
			name: "deploy/otel/collector.yaml with overrides",
			opts: []CollectorOption{WithCollectorConfigFile("../../deploy/otel/collector.yaml",
				[]string{"OTEL_GATEWAY_ENDPOINT=127.0.0.1:4317"},
				"exporters::otlp_grpc/gateway::tls::insecure: true", "extensions::file_storage::directory: /tmp/q")},
			wantArgs: []string{"--config", abs,
				"--config", "yaml:receivers::otlp::protocols::grpc::endpoint: 127.0.0.1:1001",
				"--config", "yaml:receivers::otlp::protocols::http::endpoint: 127.0.0.1:1002",
				"--config", "yaml:exporters::otlp_grpc/gateway::tls::insecure: true",
				"--config", "yaml:extensions::file_storage::directory: /tmp/q"},
			wantEnv: []string{"OTEL_GATEWAY_ENDPOINT=127.0.0.1:4317"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Collector{Config: "/tmp/c/otelcol.yaml", grpcAddr: "127.0.0.1:1001", httpAddr: "127.0.0.1:1002"}
			for _, o := range tc.opts {
				o(c)
			}
			if diff := cmp.Diff(tc.wantArgs, c.args()); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantEnv, c.env); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
		})
	}
}
