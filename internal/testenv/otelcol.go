package testenv

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/ociimage"
)

// collectorModule is the test collector's module directory, relative to the
// repository root: a module of its own (e2e/otelcol/go.mod), out of the main
// module's ./... and go.mod.
const collectorModule = "e2e/otelcol"

// maxCollectorFile caps each read of a file the test collector writes.
const maxCollectorFile = 64 << 20

var collectorBuild struct {
	sync.Mutex
	path string
}

// BuildCollector builds the test collector (the e2e/otelcol module: an
// OpenTelemetry Collector v0.165.0 with the otlp receiver, the batch and
// memory_limiter processors, the otlp_grpc, otlp_http, debug and jsonfile
// exporters, contrib's file_storage extension) and returns its binary's
// path. The binary is kept in os.TempDir()/sandboxstats-otelcol-<key>,
// the key a hash of the module's go.mod, go.sum and Go files, the Go
// version and platform: later test processes and packages reuse it, one
// build at a time (a lock file in that directory); such directories unused
// for a day are removed. A cold build
// costs about 3.5 minutes of CPU (about two minutes on two idle cores,
// longer on a loaded machine); with Go's build cache warm it is a link of a
// few seconds. Without a go command, or when the build fails (for
// example the module proxy unreachable), the test is skipped, or fails
// under CI=true. Where PrebuiltBinEnv names a directory, its otelcol is
// returned.
func BuildCollector(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv(PrebuiltBinEnv); dir != "" {
		p := filepath.Join(dir, "otelcol")
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s=%s: %v", PrebuiltBinEnv, dir, err)
		}
		return p
	}
	collectorBuild.Lock()
	defer collectorBuild.Unlock()
	if p := collectorBuild.path; p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	goCmd, err := exec.LookPath("go")
	Need(t, err == nil, "no go command on PATH: the test collector (e2e/otelcol) is built with it")
	modDir, err := collectorModuleDir(goCmd)
	if err != nil {
		t.Fatal(err)
	}
	key, err := collectorKey(modDir)
	if err != nil {
		t.Fatal(err)
	}
	p, err := buildCollectorAt(modDir, filepath.Join(os.TempDir(), "sandboxstats-otelcol-"+key))
	Need(t, err == nil, fmt.Sprintf("building the test collector failed: %v", err))
	pruneCollectorBuilds(filepath.Dir(p), 24*time.Hour)
	collectorBuild.path = p
	return p
}

// collectorModuleDir finds the e2e/otelcol module: beside this source file
// when its path is known (go test builds from source), else from the main
// module's go.mod (`go env GOMOD` in the test's working directory).
func collectorModuleDir(goCmd string) (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		dir := filepath.Join(filepath.Dir(file), "..", "..", filepath.FromSlash(collectorModule))
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
	}
	out, err := exec.Command(goCmd, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("the test collector: not inside the sandboxstats module (go env GOMOD is empty)")
	}
	dir := filepath.Join(filepath.Dir(gomod), filepath.FromSlash(collectorModule))
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return "", fmt.Errorf("the test collector's module: %w", err)
	}
	return dir, nil
}

// collectorKey hashes what the collector's binary is built from: the
// module's go.mod, go.sum and Go files (names and contents), the Go version
// and the platform (and how it is built: as the otelcol image's binary).
func collectorKey(modDir string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s %s/%s static trimpath\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	err := filepath.WalkDir(modDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() || !(name == "go.mod" || name == "go.sum" || strings.HasSuffix(name, ".go")) {
			return nil
		}
		b, err := bounded.ReadFile(path, bounded.MaxFileBytes)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(modDir, path)
		fmt.Fprintf(h, "%s %d\n", filepath.ToSlash(rel), len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("the test collector's sources in %s: %w", modDir, err)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// buildCollectorAt returns dir/otelcol, building it first unless it exists.
// An exclusive lock on dir/.lock serialises builds across processes; the
// binary is built beside its final name and renamed into place, so it is
// never seen half written.
func buildCollectorAt(modDir, dir string) (string, error) {
	bin := filepath.Join(dir, "otelcol")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// The directory's name is predictable in a shared directory: use it only
	// if it is a directory of this user's, not a symlink.
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || (ok && int(st.Uid) != os.Geteuid()) {
		return "", fmt.Errorf("%s: not a directory of uid %d", dir, os.Geteuid())
	}
	now := time.Now()
	_ = os.Chtimes(dir, now, now) // marks it used for pruneCollectorBuilds
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(bin); err == nil { // another process built it meanwhile
		return bin, nil
	}
	tmp := bin + ".tmp" + strconv.Itoa(os.Getpid())
	// Built as the otelcol image's binary is (static, -trimpath): the
	// compiled packages in Go's build cache serve both.
	if err := ociimage.GoBuild(context.Background(), modDir, tmp, "."); err != nil {
		os.Remove(tmp)
		return "", err
	}
	if err := os.Rename(tmp, bin); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return bin, nil
}

// pruneCollectorBuilds removes the other sandboxstats-otelcol-* directories
// beside keep that were last used more than age ago.
func pruneCollectorBuilds(keep string, age time.Duration) {
	old, _ := filepath.Glob(filepath.Join(filepath.Dir(keep), "sandboxstats-otelcol-*"))
	for _, d := range old {
		if fi, err := os.Stat(d); err == nil && d != keep && fi.IsDir() && time.Since(fi.ModTime()) > age {
			os.RemoveAll(d)
		}
	}
}

// Collector is a real OpenTelemetry Collector (BuildCollector's) receiving
// OTLP on loopback and writing what arrives to files the test reads back
// (Metrics, Logs). Its pipelines (receiver otlp, processors memory_limiter
// and batch with a 100 ms timeout) end in
// the jsonfile exporter, which appends every batch before acknowledging it.
// It serves no internal telemetry on any port. The test's cleanup stops it
// and, when the test failed, logs its output. WithCollectorConfigFile runs
// a config of the repository's instead.
type Collector struct {
	Dir         string // its temporary directory: config, output files, log
	Config      string // its config file
	MetricsFile string // the metrics received, one OTLP JSON object a line
	LogsFile    string // the logs received, likewise
	Log         string // its stdout and stderr, appended across restarts

	bin      string
	grpcAddr string // 127.0.0.1:port
	httpAddr string // 127.0.0.1:port
	socket   string // OTLP/gRPC Unix socket path, or ""

	// A collector run with a config file of the repository's
	// (WithCollectorConfigFile) rather than the test's own.
	configFile string   // absolute path, or "" for configYAML
	overrides  []string // laid over configFile, confmap YAML each
	env        []string // added to its environment, KEY=value each

	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// CollectorOption configures StartCollector.
type CollectorOption func(*Collector)

// WithCollectorSocket makes the collector also receive OTLP/gRPC on a Unix
// socket at path (a second receiver, otlp/unix, in both pipelines); dial it
// as "unix://" + path. The collector creates the socket and removes it when
// stopped gracefully; a socket file left behind stops it from starting.
func WithCollectorSocket(path string) CollectorOption {
	return func(c *Collector) { c.socket = path }
}

// StartCollector builds (BuildCollector) and starts a collector receiving
// OTLP/gRPC and OTLP/HTTP on free 127.0.0.1 ports, and waits up to 30 s for
// its receivers to accept connections.
func StartCollector(t testing.TB, opts ...CollectorOption) *Collector {
	t.Helper()
	bin := BuildCollector(t)
	dir := t.TempDir()
	c := &Collector{
		Dir:         dir,
		Config:      filepath.Join(dir, "otelcol.yaml"),
		MetricsFile: filepath.Join(dir, "metrics.jsonl"),
		LogsFile:    filepath.Join(dir, "logs.jsonl"),
		Log:         filepath.Join(dir, "otelcol.log"),
		bin:         bin,
		grpcAddr:    "127.0.0.1:" + strconv.Itoa(freePort(t)),
		httpAddr:    "127.0.0.1:" + strconv.Itoa(freePort(t)),
	}
	for _, o := range opts {
		o(c)
	}
	if c.configFile != "" {
		c.Config = c.configFile
	} else if err := os.WriteFile(c.Config, []byte(c.configYAML()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Stop(t)
		if t.Failed() {
			b, _ := bounded.ReadFile(c.Log, bounded.MaxFileBytes)
			t.Logf("%s:\n%s", c.Log, b)
		}
	})
	c.Start(t)
	return c
}

// configYAML is the collector's config. Paths and addresses are quoted as
// JSON strings, which YAML reads alike.
func (c *Collector) configYAML() string {
	q := strconv.Quote
	receivers := "[otlp]"
	unix := ""
	if c.socket != "" {
		receivers = "[otlp, otlp/unix]"
		unix = "  otlp/unix:\n    protocols:\n      grpc:\n        endpoint: " + q(c.socket) + "\n        transport: unix\n"
	}
	return "receivers:\n" +
		"  otlp:\n    protocols:\n      grpc:\n        endpoint: " + q(c.grpcAddr) + "\n      http:\n        endpoint: " + q(c.httpAddr) + "\n" +
		unix +
		"processors:\n" +
		"  memory_limiter:\n    check_interval: 1s\n    limit_mib: 512\n    spike_limit_mib: 128\n" +
		"  batch:\n    timeout: 100ms\n" +
		"exporters:\n" +
		"  jsonfile/metrics:\n    path: " + q(c.MetricsFile) + "\n" +
		"  jsonfile/logs:\n    path: " + q(c.LogsFile) + "\n" +
		"service:\n" +
		"  telemetry:\n    logs:\n      level: info\n    metrics:\n      level: none\n" +
		"  pipelines:\n" +
		"    metrics:\n      receivers: " + receivers + "\n      processors: [memory_limiter, batch]\n      exporters: [jsonfile/metrics]\n" +
		"    logs:\n      receivers: " + receivers + "\n      processors: [memory_limiter, batch]\n      exporters: [jsonfile/logs]\n"
}

// GRPCEndpoint is the OTLP/gRPC receiver's address, "127.0.0.1:port".
func (c *Collector) GRPCEndpoint() string { return c.grpcAddr }

// HTTPEndpoint is the OTLP/HTTP receiver's base URL,
// "http://127.0.0.1:port" (signals under /v1/metrics, /v1/logs).
func (c *Collector) HTTPEndpoint() string { return "http://" + c.httpAddr }

// Socket is the OTLP/gRPC Unix socket's path (WithCollectorSocket), or "".
func (c *Collector) Socket() string { return c.socket }

// Start starts the collector with its config, on the same ports and
// appending to the same files as before, and waits up to 30 s for its
// receivers to accept connections. Starting a running collector fails the
// test.
func (c *Collector) Start(t testing.TB) {
	t.Helper()
	if c.running() {
		t.Fatal("the collector is already running")
	}
	logf, err := os.OpenFile(c.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command(c.bin, c.args()...)
	c.cmd.Env = append(os.Environ(), c.env...)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	err = c.cmd.Start()
	logf.Close()
	if err != nil {
		t.Fatalf("start %s: %v", c.bin, err)
	}
	done := make(chan struct{})
	c.done = done
	go func(cmd *exec.Cmd) { _ = cmd.Wait(); close(done) }(c.cmd)
	if err := c.waitReady(30 * time.Second); err != nil {
		b, _ := bounded.ReadFile(c.Log, bounded.MaxFileBytes)
		c.Stop(t)
		t.Fatalf("the collector: %v\n%s:\n%s", err, c.Log, b)
	}
}

// waitReady waits until every receiver accepts a connection, the process
// exits, or timeout passes.
func (c *Collector) waitReady(timeout time.Duration) error {
	addrs := [][2]string{{"tcp", c.grpcAddr}, {"tcp", c.httpAddr}}
	if c.socket != "" {
		addrs = append(addrs, [2]string{"unix", c.socket})
	}
	deadline := time.Now().Add(timeout)
	for _, a := range addrs {
		for {
			conn, err := net.DialTimeout(a[0], a[1], time.Second)
			if err == nil {
				conn.Close()
				break
			}
			select {
			case <-c.done:
				return fmt.Errorf("exited (%v) before it listened on %s", c.cmd.ProcessState, a[1])
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("not listening on %s within %s: %w", a[1], timeout, err)
			}
		}
	}
	return nil
}

// Stop stops the collector (SIGTERM: it flushes its batches and closes its
// listeners; SIGKILL after 10 s) and waits for it. Stopping a stopped
// collector does nothing.
func (c *Collector) Stop(t testing.TB) {
	if !c.running() {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Logf("the collector did not stop within 10 s of SIGTERM: killing it")
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// running reports whether the collector was started and has not exited.
func (c *Collector) running() bool {
	if c.done == nil {
		return false
	}
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// Metrics returns every metric data point the collector has written so
// far, in arrival order; a read or parse error fails the test.
func (c *Collector) Metrics(t testing.TB) []CollectedPoint {
	t.Helper()
	b, err := readCollectorFile(c.MetricsFile)
	if err != nil {
		t.Fatal(err)
	}
	pts, err := parseOTLPMetricsLines(b)
	if err != nil {
		t.Fatalf("%s: %v", c.MetricsFile, err)
	}
	return pts
}

// Logs returns every log record the collector has written so far, in
// arrival order; a read or parse error fails the test.
func (c *Collector) Logs(t testing.TB) []CollectedLog {
	t.Helper()
	b, err := readCollectorFile(c.LogsFile)
	if err != nil {
		t.Fatal(err)
	}
	logs, err := parseOTLPLogsLines(b)
	if err != nil {
		t.Fatalf("%s: %v", c.LogsFile, err)
	}
	return logs
}

// WaitMetrics polls Metrics until done returns true for what arrived, and
// returns that; the test fails after timeout with what had arrived.
func (c *Collector) WaitMetrics(t testing.TB, timeout time.Duration, done func([]CollectedPoint) bool) []CollectedPoint {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		pts := c.Metrics(t)
		if done(pts) {
			return pts
		}
		if time.Now().After(deadline) {
			t.Fatalf("the collector's metrics did not arrive within %s; %d points arrived: %+v", timeout, len(pts), pts)
		}
	}
}

// WaitLogs polls Logs until done returns true for what arrived, and returns
// that; the test fails after timeout with what had arrived.
func (c *Collector) WaitLogs(t testing.TB, timeout time.Duration, done func([]CollectedLog) bool) []CollectedLog {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		logs := c.Logs(t)
		if done(logs) {
			return logs
		}
		if time.Now().After(deadline) {
			t.Fatalf("the collector's logs did not arrive within %s; %d records arrived: %+v", timeout, len(logs), logs)
		}
	}
}

// readCollectorFile reads one of the collector's output files, at most
// maxCollectorFile bytes; a file not written yet reads as empty. A last line
// without its newline (a write in progress) is left out.
func readCollectorFile(path string) ([]byte, error) {
	b, err := bounded.ReadFile(path, maxCollectorFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the collector's output: %w", err)
	}
	return b[:bytes.LastIndexByte(b, '\n')+1], nil
}
