package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// criNamespace is the containerd namespace of the CRI plugin's pods and
// images; the pods' default cgroup parent is /<criNamespace>.
const criNamespace = "k8s.io"

// pauseImageRef is the pinned sandbox image StartContainerd imports.
const pauseImageRef = "localhost/sandboxstats/pause:test"

// ContainerdOptions configure StartContainerd; the zero value is fine.
type ContainerdOptions struct {
	// Bins are the binaries to run; nil builds them (BuildContainerd).
	Bins *ContainerdBins
	// LogLevel is containerd's --log-level; "" is "info".
	LogLevel string
	// NRIRegistrationTimeout and NRIRequestTimeout are NRI's
	// plugin_registration_timeout and plugin_request_timeout; zero keeps
	// containerd's defaults (5 s and 2 s).
	NRIRegistrationTimeout, NRIRequestTimeout time.Duration
	// Metrics serves containerd's Prometheus metrics (its [metrics]
	// address) on a free loopback port: MetricsURL.
	Metrics bool
}

// Containerd is a real containerd (BuildContainerd's) with NRI and the CRI
// plugin, private to the test: its root, state, sockets, the runtimes'
// roots and its config are under Dir, a short directory under os.TempDir
// (Unix socket paths must stay under 108 bytes). Pods run under two runtime
// handlers: "runc" (the default: the runc built beside containerd) and
// "runsc" (the same runc shim driving Debian's runsc through a wrapper
// script: --platform=ptrace --network=none, RunscRoot as its root). Pods use
// the host network (no CNI is configured) and the cgroup /k8s.io/<pod id>
// unless their PodSpec names another parent. The test's cleanup removes
// everything it started, whether containerd is running or stopped then:
// pods, shims, runc and runsc containers, mounts under Dir, the pods'
// cgroups, Dir; and fails the test if a process or a mount is left.
type Containerd struct {
	Dir         string // holds everything below
	Root, State string // containerd's root and state directories
	Config      string // its config.toml (version 3)
	Log         string // its output, appended across restarts
	RuncRoot    string // runc's --root for the "runc" handler's pods
	RunscRoot   string // runsc's --root for the "runsc" handler's pods
	PauseImage  string // the pinned sandbox image's reference
	Bins        *ContainerdBins
	// StartedIn is how long the last Start took, from exec to the CRI
	// answering with its runtime ready.
	StartedIn time.Duration

	runsc        string // Debian's runsc
	address      string // the gRPC socket
	nriSocket    string
	crictlConfig string
	wrapperLog   string // the runsc wrapper's log of its invocations
	logLevel     string
	metrics      string // the [metrics] address, host:port; "" none

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}     // closed when cmd has exited
	pods map[string]string // every pod RunPod started: id -> cgroup parent
	// podConfigs: every pod RunPod started: id -> its config file (for
	// crictl create).
	podConfigs map[string]string
}

// NeedContainerd checks the prerequisites of StartContainerd (root, a Go
// toolchain to build containerd, Debian's runsc, a static busybox for the
// pause image, jq for the runsc wrapper) and returns the runsc and busybox
// paths.
func NeedContainerd(t testing.TB) (runsc, busybox string) {
	t.Helper()
	runsc, busybox = NeedRunsc(t)
	_, err := exec.LookPath("jq")
	Need(t, err == nil, "needs jq in PATH (apt-get install jq)")
	_, err = exec.LookPath("go")
	Need(t, err == nil, "needs the go command to build containerd")
	return runsc, busybox
}

// StartContainerd starts a private containerd (see Containerd) with its
// pause image imported and the CRI ready, and registers its cleanup.
func StartContainerd(t testing.TB, opts ContainerdOptions) *Containerd {
	t.Helper()
	runsc, busybox := NeedContainerd(t)
	bins := opts.Bins
	if bins == nil {
		bins = BuildContainerd(t)
	}
	dir, err := os.MkdirTemp("", "ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Containerd{
		Dir:          dir,
		Root:         filepath.Join(dir, "root"),
		State:        filepath.Join(dir, "state"),
		Config:       filepath.Join(dir, "config.toml"),
		Log:          filepath.Join(dir, "containerd.log"),
		RuncRoot:     filepath.Join(dir, "runc", criNamespace),
		RunscRoot:    filepath.Join(dir, "runsc", criNamespace),
		PauseImage:   pauseImageRef,
		Bins:         bins,
		runsc:        runsc,
		address:      filepath.Join(dir, "containerd.sock"),
		nriSocket:    filepath.Join(dir, "nri", "nri.sock"), // a directory of its own: a pod mounts it
		crictlConfig: filepath.Join(dir, "crictl.yaml"),
		wrapperLog:   filepath.Join(dir, "runsc-wrapper.log"),
		pods:         map[string]string{},
		podConfigs:   map[string]string{},
		logLevel:     opts.LogLevel,
	}
	if c.logLevel == "" {
		c.logLevel = "info"
	}
	if opts.Metrics {
		c.metrics = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	}
	t.Cleanup(func() { c.cleanup(t) })
	for _, d := range []string{c.Root, c.State, filepath.Join(dir, "pods"), filepath.Dir(c.nriSocket)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	wrapper := filepath.Join(dir, "runsc-wrapper")
	if err := os.WriteFile(wrapper, []byte(c.runscWrapper()), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.Config, []byte(c.config(opts, wrapper)), 0o644); err != nil {
		t.Fatal(err)
	}
	crictl := fmt.Sprintf("runtime-endpoint: %s\nimage-endpoint: %s\ntimeout: 30\ndebug: false\npull-image-on-create: false\n",
		c.CRIEndpoint(), c.CRIEndpoint())
	if err := os.WriteFile(c.crictlConfig, []byte(crictl), 0o644); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(dir, "pause.tar")
	if err := WritePauseImage(image, busybox, c.PauseImage); err != nil {
		t.Fatal(err)
	}
	c.Start(t)
	if out, err := c.run(c.Bins.Ctr, "--address", c.address, "-n", criNamespace, "images", "import",
		"--local", "--snapshotter", "native", image); err != nil {
		t.Fatalf("import the pause image: %v\n%s", err, out)
	}
	return c
}

// config is containerd's config.toml: every path under Dir, NRI on its
// socket, the native snapshotter, the pinned pause image, the runc and
// runsc handlers, no CNI.
func (c *Containerd) config(opts ContainerdOptions, wrapper string) string {
	q := strconv.Quote
	regTimeout, reqTimeout := "5s", "2s"
	if opts.NRIRegistrationTimeout > 0 {
		regTimeout = opts.NRIRegistrationTimeout.String()
	}
	if opts.NRIRequestTimeout > 0 {
		reqTimeout = opts.NRIRequestTimeout.String()
	}
	p := func(name string) string { return q(filepath.Join(c.Dir, name)) }
	metrics := ""
	if c.metrics != "" {
		metrics = fmt.Sprintf("\n[metrics]\n  address = %s\n", q(c.metrics))
	}
	runtime := func(name, binary, root string) string {
		return fmt.Sprintf(`
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.%s]
  runtime_type = "io.containerd.runc.v2"
  runtime_path = %s
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.%s.options]
    BinaryName = %s
    Root = %s
    SystemdCgroup = false
`, name, q(c.Bins.Shim), name, q(binary), q(root))
	}
	return fmt.Sprintf(`# testenv.StartContainerd: a private containerd for one test.
version = 3
root = %s
state = %s

[grpc]
  address = %s

[ttrpc]
  address = %s

[debug]
  level = %q
%s
[plugins."io.containerd.internal.v1.opt"]
  path = %s

[plugins."io.containerd.image-verifier.v1.bindir"]
  bin_dir = %s

[plugins."io.containerd.shim.v1.manager"]
  socket_dir = %s

[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = %s
  plugin_path = %s
  plugin_config_path = %s
  plugin_registration_timeout = %q
  plugin_request_timeout = %q
  disable_connections = false

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "native"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %s

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.runtime"]
  # A root process here may not lower its oom_score_adj: without this every
  # pod fails (the sandbox asks for -998).
  restrict_oom_score_adj = true
  cdi_spec_dirs = []
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%s]
    conf_dir = %s
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
%s%s`,
		q(c.Root), q(c.State), q(c.address), q(c.address+".ttrpc"), c.logLevel, metrics,
		p("opt"), p("image-verifier"), p("s"),
		q(c.nriSocket), p("nri/plugins"), p("nri/conf.d"), regTimeout, reqTimeout,
		q(c.PauseImage), p("cni/bin"), p("cni/net.d"),
		runtime("runc", c.Bins.Runc, filepath.Dir(c.RuncRoot)),
		runtime("runsc", wrapper, filepath.Dir(c.RunscRoot)))
}

// NRISocket is the path of containerd's NRI socket, for a plugin to dial.
func (c *Containerd) NRISocket() string { return c.nriSocket }

// CRIEndpoint is the CRI's endpoint (containerd's gRPC socket) as crictl
// and kubelet name it: unix://<path>.
func (c *Containerd) CRIEndpoint() string { return "unix://" + c.address }

// Address is the path of containerd's gRPC socket (ctr --address).
func (c *Containerd) Address() string { return c.address }

// MetricsURL is the URL of containerd's Prometheus metrics
// (ContainerdOptions.Metrics), "" when not served.
func (c *Containerd) MetricsURL() string {
	if c.metrics == "" {
		return ""
	}
	return "http://" + c.metrics + "/v1/metrics"
}

// PID is containerd's pid, or 0 when it is stopped.
func (c *Containerd) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.runningLocked() {
		return 0
	}
	return c.cmd.Process.Pid
}

func (c *Containerd) runningLocked() bool {
	if c.cmd == nil {
		return false
	}
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// Start starts containerd with its config (the first time from
// StartContainerd; again after Stop, with the same root and state: a
// containerd restart) and waits up to 30 s for the CRI to report its
// runtime ready and for the NRI socket.
func (c *Containerd) Start(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runningLocked() {
		t.Fatalf("containerd (pid %d) is already running", c.cmd.Process.Pid)
	}
	logf, err := os.OpenFile(c.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(c.Bins.Containerd, "--config", c.Config, "--log-level", c.logLevel)
	cmd.Env = append(os.Environ(), "PATH="+c.Bins.Dir+":"+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = logf, logf
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", c.Bins.Containerd, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	c.cmd, c.done = cmd, done
	var last string
	for deadline := start.Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		select {
		case <-done:
			t.Fatalf("containerd exited at start: %v\n%s", cmd.ProcessState, c.logTail(4096))
		default:
		}
		if _, err := os.Stat(c.nriSocket); err != nil {
			last = err.Error()
		} else if err := c.criReady(); err != nil {
			last = err.Error()
		} else {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd not ready within 30 s (%s):\n%s", last, c.logTail(4096))
		}
	}
	c.StartedIn = time.Since(start)
	t.Logf("containerd (pid %d) ready in %v", cmd.Process.Pid, c.StartedIn.Round(time.Millisecond))
}

// criReady asks the CRI for its status (crictl info) and reports an error
// unless its RuntimeReady condition holds.
func (c *Containerd) criReady() error {
	out, err := c.crictl(5*time.Second, "info")
	if err != nil {
		return err
	}
	var info struct {
		Status struct {
			Conditions []struct {
				Type   string `json:"type"`
				Status bool   `json:"status"`
			} `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return fmt.Errorf("crictl info: %w", err)
	}
	for _, cond := range info.Status.Conditions {
		if cond.Type == "RuntimeReady" && cond.Status {
			return nil
		}
	}
	return errors.New("crictl info: RuntimeReady is not true")
}

// Stop stops containerd alone (SIGTERM, SIGKILL after 10 s) and waits for
// it: the shims and their pods keep running, as in a containerd restart.
// Stopping a stopped containerd does nothing.
func (c *Containerd) Stop(t testing.TB) {
	t.Helper()
	start := time.Now()
	if c.stop() {
		t.Logf("containerd stopped in %v", time.Since(start).Round(time.Millisecond))
	}
}

// stop is Stop; it reports whether containerd was running.
func (c *Containerd) stop() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.runningLocked() {
		return false
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	return true
}

// logTail is the last n bytes of containerd's log.
func (c *Containerd) logTail(n int) string {
	b, _ := os.ReadFile(c.Log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// run runs a command with a 60 s limit and returns its stdout; an error
// carries its stderr.
func (c *Containerd) run(bin string, args ...string) ([]byte, error) {
	return c.runTimeout(60*time.Second, bin, args...)
}

func (c *Containerd) runTimeout(limit time.Duration, bin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}

func (c *Containerd) crictl(limit time.Duration, args ...string) ([]byte, error) {
	return c.runTimeout(limit, c.Bins.Crictl, append([]string{"--config", c.crictlConfig}, args...)...)
}

// Crictl runs crictl against this containerd and returns its output; an
// error fails the test.
func (c *Containerd) Crictl(t testing.TB, args ...string) []byte {
	t.Helper()
	out, err := c.crictl(60*time.Second, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Ctr runs ctr against this containerd in the CRI's namespace (k8s.io) and
// returns its output; an error fails the test.
func (c *Containerd) Ctr(t testing.TB, args ...string) []byte {
	t.Helper()
	out, err := c.run(c.Bins.Ctr, append([]string{"--address", c.address, "-n", criNamespace}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
