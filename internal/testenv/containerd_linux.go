package testenv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
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

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}     // closed when cmd has exited
	pods map[string]string // every pod RunPod started: id -> cgroup parent
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
		nriSocket:    filepath.Join(dir, "nri.sock"),
		crictlConfig: filepath.Join(dir, "crictl.yaml"),
		wrapperLog:   filepath.Join(dir, "runsc-wrapper.log"),
		pods:         map[string]string{},
		logLevel:     opts.LogLevel,
	}
	if c.logLevel == "" {
		c.logLevel = "info"
	}
	t.Cleanup(func() { c.cleanup(t) })
	for _, d := range []string{c.Root, c.State, filepath.Join(dir, "pods")} {
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
		q(c.Root), q(c.State), q(c.address), q(c.address+".ttrpc"), c.logLevel,
		p("opt"), p("image-verifier"), p("s"),
		q(c.nriSocket), p("nri/plugins"), p("nri/conf.d"), regTimeout, reqTimeout,
		q(c.PauseImage), p("cni/bin"), p("cni/net.d"),
		runtime("runc", c.Bins.Runc, filepath.Dir(c.RuncRoot)),
		runtime("runsc", wrapper, filepath.Dir(c.RunscRoot)))
}

// runscWrapper is the "runsc" handler's BinaryName: Debian's runsc on this
// host's platform and network with the private root (the shim passes the
// same root after it: Root/<namespace>). Debian's runsc 20221219 cannot
// apply the negative process.oomScoreAdj the CRI gives a sandbox: the
// wrapper deletes it from the bundle's config.json before create.
func (c *Containerd) runscWrapper() string {
	jq, _ := exec.LookPath("jq")
	return `#!/bin/sh
# testenv.StartContainerd's runsc for the runc shim.
printf '%s\n' "$*" >>` + shellQuote(c.wrapperLog) + `
bundle=
prev=
for a in "$@"; do
	case "$prev" in --bundle|-b) bundle=$a ;; esac
	case "$a" in --bundle=*) bundle=${a#--bundle=} ;; esac
	prev=$a
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
	` + shellQuote(jq) + ` 'del(.process.oomScoreAdj)' "$bundle/config.json" >"$bundle/config.json.tmp" &&
		mv "$bundle/config.json.tmp" "$bundle/config.json" || exit 1
fi
exec ` + shellQuote(c.runsc) + ` --platform=ptrace --network=none --root ` + shellQuote(c.RunscRoot) + ` "$@"
`
}

// NRISocket is the path of containerd's NRI socket, for a plugin to dial.
func (c *Containerd) NRISocket() string { return c.nriSocket }

// CRIEndpoint is the CRI's endpoint (containerd's gRPC socket) as crictl
// and kubelet name it: unix://<path>.
func (c *Containerd) CRIEndpoint() string { return "unix://" + c.address }

// Address is the path of containerd's gRPC socket (ctr --address).
func (c *Containerd) Address() string { return c.address }

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

// PodSpec is the part of a CRI PodSandboxConfig a test chooses.
type PodSpec struct {
	Name      string // metadata.name; required
	Namespace string // metadata.namespace; "" is "default"
	UID       string // metadata.uid; "" makes a random one (NewActorUID)
	Labels    map[string]string
	// Annotations become the sandbox's annotations (and the OCI spec's).
	Annotations map[string]string
	// Handler is the runtime handler: "" for the default (runc) or "runsc".
	Handler string
	// CgroupParent is linux.cgroup_parent; "" leaves the pod in containerd's
	// default /k8s.io/<pod id>.
	CgroupParent string
}

// RunPod starts a pod sandbox (crictl runp) in the host's network namespace
// and returns its id.
func (c *Containerd) RunPod(t testing.TB, spec PodSpec) string {
	t.Helper()
	if spec.Name == "" {
		t.Fatal("RunPod: PodSpec.Name is empty")
	}
	if spec.Namespace == "" {
		spec.Namespace = "default"
	}
	if spec.UID == "" {
		spec.UID = NewActorUID()
	}
	linux := map[string]any{
		// NODE (2): the host's network namespace, so no CNI is needed.
		"security_context": map[string]any{"namespace_options": map[string]any{"network": 2}},
	}
	if spec.CgroupParent != "" {
		linux["cgroup_parent"] = spec.CgroupParent
	}
	cfg, err := json.Marshal(map[string]any{
		"metadata":    map[string]any{"name": spec.Name, "namespace": spec.Namespace, "uid": spec.UID, "attempt": 0},
		"labels":      spec.Labels,
		"annotations": spec.Annotations,
		"linux":       linux,
	})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(c.Dir, "pods", fmt.Sprintf("%s-%s-%d.json", spec.Namespace, spec.Name, time.Now().UnixNano()))
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"runp"}
	if spec.Handler != "" {
		args = append(args, "--runtime", spec.Handler)
	}
	out, err := c.crictl(60*time.Second, append(args, path)...)
	if err != nil {
		t.Fatalf("run pod %s/%s: %v\n%s", spec.Namespace, spec.Name, err, c.logTail(2048))
	}
	id := strings.TrimSpace(string(out))
	parent := spec.CgroupParent
	if parent == "" {
		parent = "/" + criNamespace
	}
	c.mu.Lock()
	c.pods[id] = parent
	c.mu.Unlock()
	return id
}

// StopPod stops a pod (crictl stopp). A runsc pod does not stop through
// the runc shim: end it with KillRunscPod first.
func (c *Containerd) StopPod(t testing.TB, id string) {
	t.Helper()
	c.Crictl(t, "stopp", id)
}

// RemovePod removes a stopped pod (crictl rmp).
// A pod whose sandbox was killed under the runtime may still read running
// to containerd for a moment after stopp returned ("is running, please
// stop it first": it has not yet seen the task exit); it is stopped again
// and removed, for up to 10 s.
func (c *Containerd) RemovePod(t testing.TB, id string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err := c.crictl(60*time.Second, "rmp", id)
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "please stop it first") || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		c.StopPod(t, id)
	}
}

// PodInfo is a pod as crictl pods lists it.
type PodInfo struct {
	ID, UID, Name, Namespace string
	State                    string // SANDBOX_READY or SANDBOX_NOTREADY
	RuntimeHandler           string // "" for the default handler
	Labels, Annotations      map[string]string
}

// criPod is a pod in crictl's JSON (pods -o json, inspectp's status).
type criPod struct {
	ID       string `json:"id"`
	Metadata struct {
		Name      string `json:"name"`
		UID       string `json:"uid"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	State          string            `json:"state"`
	Labels         map[string]string `json:"labels"`
	Annotations    map[string]string `json:"annotations"`
	RuntimeHandler string            `json:"runtimeHandler"`
}

func (p criPod) info() PodInfo {
	return PodInfo{ID: p.ID, UID: p.Metadata.UID, Name: p.Metadata.Name, Namespace: p.Metadata.Namespace,
		State: p.State, RuntimeHandler: p.RuntimeHandler, Labels: p.Labels, Annotations: p.Annotations}
}

// Pods lists the pods (crictl pods -o json), oldest first.
func (c *Containerd) Pods(t testing.TB) []PodInfo {
	t.Helper()
	pods, err := c.listPods()
	if err != nil {
		t.Fatal(err)
	}
	return pods
}

func (c *Containerd) listPods() ([]PodInfo, error) {
	out, err := c.crictl(30*time.Second, "pods", "-o", "json")
	if err != nil {
		return nil, err
	}
	var list struct {
		Items []criPod `json:"items"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		return nil, fmt.Errorf("crictl pods -o json: %w: %q", err, out)
	}
	pods := make([]PodInfo, len(list.Items))
	for i, p := range list.Items {
		pods[len(pods)-1-i] = p.info() // crictl lists the newest first
	}
	return pods, nil
}

// PodDetail is a pod as crictl inspectp shows it.
type PodDetail struct {
	PodInfo
	// PID is the sandbox's init process: the pause process for runc, the
	// sentry (runsc-sandbox) for runsc; 0 once it is gone.
	PID int
	// CgroupsPath is the sandbox's linux.cgroupsPath, e.g. /k8s.io/<id>.
	CgroupsPath string
}

// InspectPod inspects a pod (crictl inspectp -o json).
func (c *Containerd) InspectPod(t testing.TB, id string) PodDetail {
	t.Helper()
	out := c.Crictl(t, "inspectp", "-o", "json", id)
	var v struct {
		Status criPod `json:"status"`
		Info   struct {
			PID            int    `json:"pid"`
			RuntimeHandler string `json:"runtimeHandler"`
			RuntimeSpec    struct {
				Linux struct {
					CgroupsPath string `json:"cgroupsPath"`
				} `json:"linux"`
			} `json:"runtimeSpec"`
		} `json:"info"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("crictl inspectp %s: %v: %q", id, err, out)
	}
	d := PodDetail{PodInfo: v.Status.info(), PID: v.Info.PID, CgroupsPath: v.Info.RuntimeSpec.Linux.CgroupsPath}
	if d.RuntimeHandler == "" {
		d.RuntimeHandler = v.Info.RuntimeHandler
	}
	return d
}

// Runsc runs Debian's runsc on the runsc handler's pods (--root RunscRoot,
// the wrapper's flags) and returns its output.
func (c *Containerd) Runsc(args ...string) ([]byte, error) {
	return c.run(c.runsc, append([]string{"--platform=ptrace", "--network=none", "--root", c.RunscRoot}, args...)...)
}

// KillRunscPod ends a runsc pod under its runtime, as if the sandbox died:
// runsc kill -all of its container, then runsc delete -force. (A runsc pod
// does not stop through the runc shim, which would need gVisor's own shim.)
// The pod stays listed, NOTREADY once its shim saw the sandbox exit; stop and
// remove it with StopPod and RemovePod.
func (c *Containerd) KillRunscPod(t testing.TB, id string) {
	t.Helper()
	if out, err := c.Runsc("kill", "--all", id, "KILL"); err != nil {
		t.Logf("runsc kill %s: %v %s", id, err, out)
	}
	if out, err := c.Runsc("delete", "-force", id); err != nil {
		t.Fatalf("runsc delete -force %s: %v %s", id, err, out)
	}
}

// cleanup ends everything StartContainerd started. With containerd
// running, each pod is stopped and removed through the CRI first (a runsc
// pod killed under its runtime before); then containerd is stopped, runsc
// and runc delete what is left in their roots, the shims and any other
// process whose command line names Dir are stopped (SIGTERM, then SIGKILL),
// the mounts under Dir are unmounted, the pods' cgroups (killing what is
// still in them) and their empty parents are removed in every hierarchy,
// and Dir is removed. A process or mount left fails the test.
func (c *Containerd) cleanup(t testing.TB) {
	if t.Failed() {
		t.Logf("%s (tail):\n%s", c.Log, c.logTail(8192))
		if b, err := os.ReadFile(c.wrapperLog); err == nil {
			t.Logf("%s:\n%s", c.wrapperLog, b)
		}
	}
	if c.PID() != 0 {
		if pods, err := c.listPods(); err == nil {
			for _, p := range pods {
				if p.RuntimeHandler == "runsc" && p.State == "SANDBOX_READY" {
					c.Runsc("kill", "--all", p.ID, "KILL")
					c.Runsc("delete", "-force", p.ID)
				}
				if _, err := c.crictl(20*time.Second, "stopp", p.ID); err != nil {
					t.Logf("cleanup: %v", err)
				}
				if _, err := c.crictl(20*time.Second, "rmp", "-f", p.ID); err != nil {
					t.Logf("cleanup: %v", err)
				}
			}
		} else {
			t.Logf("cleanup: %v", err)
		}
	}
	c.stop()

	ids, parents := c.knownIDs()
	for _, rt := range []struct{ bin, root string }{{c.runsc, c.RunscRoot}, {c.Bins.Runc, c.RuncRoot}} {
		for _, id := range runtimeList(rt.root) {
			args := []string{"--root", rt.root, "delete", "--force", id}
			if rt.bin == c.runsc {
				args = append([]string{"--platform=ptrace", "--network=none"}, args...)
			}
			if out, err := c.run(rt.bin, args...); err != nil {
				t.Logf("cleanup: %v %s", err, out)
			}
		}
	}
	c.stopProcesses(t)
	c.unmountAll(t)
	c.removeCgroups(t, ids, parents)
	if pids := processesNaming(c.Dir); len(pids) > 0 {
		t.Errorf("cleanup: processes left naming %s: %v", c.Dir, pids)
	}
	for _, h := range cgroupHierarchies() {
		for _, parent := range parents {
			for _, id := range ids {
				if _, err := os.Stat(filepath.Join(h, parent, id)); err == nil {
					t.Errorf("cleanup: cgroup left: %s", filepath.Join(h, parent, id))
				}
			}
		}
	}
	if m := mountsUnder(c.Dir); len(m) > 0 {
		t.Errorf("cleanup: mounts left under %s: %v", c.Dir, m)
		return // RemoveAll would descend into them
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

// knownIDs are the ids of every sandbox and container this containerd may
// have made (RunPod's, the runtime v2 task directories', those in the runc
// and runsc roots, those its logs name) and the cgroup parents they may be
// in (/k8s.io and every PodSpec.CgroupParent).
func (c *Containerd) knownIDs() (ids, parents []string) {
	parents = []string{"/" + criNamespace}
	c.mu.Lock()
	for id, parent := range c.pods {
		ids = append(ids, id)
		parents = append(parents, parent)
	}
	c.mu.Unlock()
	ents, _ := os.ReadDir(filepath.Join(c.State, "io.containerd.runtime.v2.task", criNamespace))
	for _, e := range ents {
		ids = append(ids, e.Name())
	}
	ids = append(ids, runtimeList(c.RunscRoot)...)
	ids = append(ids, runtimeList(c.RuncRoot)...)
	// A pod whose start failed is in no list, but runsc may have made its
	// cgroups: its id is in the wrapper's log and containerd's (with image
	// digests, whose cgroups do not exist).
	for _, log := range []string{c.wrapperLog, c.Log} {
		b, _ := os.ReadFile(log)
		for _, id := range hexID.FindAll(b, -1) {
			ids = append(ids, string(id))
		}
	}
	slices.Sort(ids)
	slices.Sort(parents)
	return slices.Compact(ids), slices.Compact(parents)
}

// hexID matches a container id (and a sha256 digest).
var hexID = regexp.MustCompile(`\b[0-9a-f]{64}\b`)

// runtimeList lists the container ids in a runc or runsc root: both keep
// one directory (runc) or <id>_sandbox:<id>.state file (runsc) per
// container there.
func runtimeList(root string) []string {
	ents, _ := os.ReadDir(root)
	var ids []string
	for _, e := range ents {
		name := e.Name()
		switch {
		case e.IsDir():
			ids = append(ids, name)
		case strings.HasSuffix(name, ".state"):
			if _, id, ok := strings.Cut(strings.TrimSuffix(name, ".state"), ":"); ok {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// stopProcesses stops every process whose command line names Dir (the
// shims, by their -address; runsc's sandbox and gofer, by their --root;
// containerd): SIGTERM, and SIGKILL to those left after 5 s.
func (c *Containerd) stopProcesses(t testing.TB) {
	pids := processesNaming(c.Dir)
	if len(pids) == 0 {
		return
	}
	t.Logf("cleanup: stopping processes naming %s: %v", c.Dir, pids)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		for _, pid := range pids {
			_ = syscall.Kill(pid, sig)
		}
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if pids = processesNaming(c.Dir); len(pids) == 0 {
				return
			}
		}
	}
}

// processesNaming returns the pids of the live processes (not zombies)
// whose command line contains dir.
func processesNaming(dir string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(dir)) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			if i := bytes.LastIndexByte(stat, ')'); i > 0 && len(stat) > i+2 && stat[i+2] == 'Z' {
				continue
			}
		}
		pids = append(pids, pid)
	}
	return pids
}

// mountsUnder returns the mount points under dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescapeMountPath(fields[4])
		if strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	return points
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll unmounts every mount under Dir (the sandboxes' shm, the
// containers' rootfs), lazily when one is still busy.
func (c *Containerd) unmountAll(t testing.TB) {
	for _, p := range mountsUnder(c.Dir) {
		if err := syscall.Unmount(p, 0); err != nil {
			if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil {
				t.Errorf("cleanup: unmount %s: %v", p, err)
			}
		}
	}
}

// cgroupHierarchies are the cgroup mounts: every v1 hierarchy and the
// unified one of a hybrid host, or CgroupRoot itself on a v2 host.
func cgroupHierarchies() []string {
	if CgroupV2() {
		return []string{CgroupRoot}
	}
	var hier []string
	ents, _ := os.ReadDir(CgroupRoot)
	for _, e := range ents {
		p := filepath.Join(CgroupRoot, e.Name())
		if st, err := os.Lstat(p); err == nil && st.IsDir() { // not the cpu,cpuacct style links
			hier = append(hier, p)
		}
	}
	return hier
}

// removeCgroups removes the cgroup <parent>/<id> of each id and parent in
// every hierarchy, killing what is still in it, then each parent once empty
// (a parent another containerd still uses is left).
func (c *Containerd) removeCgroups(t testing.TB, ids, parents []string) {
	hier := cgroupHierarchies()
	for _, h := range hier {
		for _, parent := range parents {
			for _, id := range ids {
				dir := filepath.Join(h, parent, id)
				if _, err := os.Stat(dir); err != nil {
					continue
				}
				killCgroup(dir)
				if err := rmdirTree(dir); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			}
			dir := filepath.Join(h, parent)
			if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.ENOTEMPTY) {
				t.Errorf("cleanup: rmdir %s: %v", dir, err)
			}
		}
	}
}

// killCgroup SIGKILLs the processes in the cgroup dir (and its children)
// until it is empty, for up to 5 s.
func killCgroup(dir string) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		n := 0
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
					n++
				}
			}
			return nil
		})
		if n == 0 {
			return
		}
	}
}

// rmdirTree removes the cgroup dir and the cgroups below it, deepest first.
func rmdirTree(dir string) error {
	var dirs []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var errs []error
	for _, d := range slices.Backward(dirs) {
		if err := RmdirRetry(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
