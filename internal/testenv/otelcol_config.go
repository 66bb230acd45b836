package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// WithCollectorConfigFile runs the collector with the config file at path
// (deploy/otel/collector.yaml, say; relative to the test's working
// directory) instead of the test's own: its receiver otlp listens on the
// collector's free loopback ports (GRPCEndpoint, HTTPEndpoint) in place of
// the file's addresses, env (KEY=value each) is added to its environment,
// and each of overrides, a line of the Collector's confmap YAML such as
// "exporters::otlp_grpc/gateway::tls::insecure: true", is laid over the
// file in order. MetricsFile and LogsFile stay empty: what such a
// collector receives goes where its file sends it.
func WithCollectorConfigFile(path string, env []string, overrides ...string) CollectorOption {
	return func(c *Collector) {
		abs, err := filepath.Abs(path)
		if err != nil {
			abs = path // the collector then names the path it could not read
		}
		c.configFile = abs
		c.env = append(c.env, env...)
		c.overrides = append(c.overrides, overrides...)
	}
}

// args is the collector's command line: its config file, and for a file of
// WithCollectorConfigFile the receiver's addresses and the overrides.
func (c *Collector) args() []string {
	if c.configFile == "" {
		return []string{"--config", c.Config}
	}
	a := []string{"--config", c.configFile,
		"--config", "yaml:receivers::otlp::protocols::grpc::endpoint: " + c.grpcAddr,
		"--config", "yaml:receivers::otlp::protocols::http::endpoint: " + c.httpAddr}
	for _, o := range c.overrides {
		a = append(a, "--config", "yaml:"+o)
	}
	return a
}

// Kill kills the collector with SIGKILL, as a crash or an OOM kill would
// (no flush, no shutdown of its queues), and waits for it. Start starts it
// again. Killing a stopped collector does nothing.
func (c *Collector) Kill(t testing.TB) {
	t.Helper()
	if !c.running() {
		return
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("kill the collector: %v", err)
	}
	<-c.done
}
