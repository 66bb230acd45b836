package e2e

// The DaemonSet's own pod (deploy/kubernetes) run through the CRI of a real
// containerd with NRI, as a kubelet would run it (issue 32's first "Must
// show"): the kustomization rendered by kustomize's library, the pod
// template turned into CRI configs by deploy/kubernetes/cripod (its mounts,
// namespaces, users, capabilities, seccomp, no_new_privs, read-only root,
// args, env), the images the project builds (internal/ociimage) imported,
// the pod started with crictl. No flag, mount or capability is added here:
// a mount or a privilege the manifest lacks fails the test. Then each
// container is killed in turn and restarted as the kubelet would (issue
// 32's second "Must show").

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/nribridge"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// k8sTemplate is the template the runsc pod names by its label.
const k8sTemplate = "k8s-e2e"

// daemonSetPod is the DaemonSet's pod running on a harness containerd.
type daemonSetPod struct {
	c      *testenv.Containerd
	pod    *testenv.CRIPod
	state  string            // where /var/lib is on this "node"
	render testenv.CRIRender // what cripod rendered (replace renders it again)
}

// startDaemonSetPod builds the images, renders deploy/kubernetes through an
// overlay that does what an operator does (names the images built here by
// digest, points the Collector at gateway in plaintext), translates the pod
// and runs it on c. attempts configs are rendered per container.
//
// Host paths: /proc, /sys/fs/cgroup and /sys/kernel/debug are the node's
// own; the runtime's directories are the harness's (its NRI socket
// directory, its runsc root); the /var/lib state directories and Kata's
// /run/vc (no Kata here) are under the test's directory. The pod runs in
// the node's network namespace: the harness has no CNI (so its ports,
// 9477 and 9478, and the Collector's loopback 4317 and 4318, are the
// host's).
func startDaemonSetPod(t *testing.T, c *testenv.Containerd, gateway *testenv.Collector, attempts int) *daemonSetPod {
	t.Helper()
	imgs := buildProjectImages(t)
	start := time.Now()
	var images strings.Builder
	for _, img := range imgs {
		c.Ctr(t, "images", "import", "--local", "--snapshotter", "native", img.Path)
		// Before make images the base names the image bare; after, by
		// the project's registry and a digest: either is replaced.
		fmt.Fprintf(&images, "  - {name: %s, newName: %s, digest: %q}\n  - {name: %s, digest: %q}\n", img.Name, img.Repo, img.Digest, img.Repo, img.Digest)
	}
	t.Logf("imported %d images in %v", len(imgs), time.Since(start).Round(time.Millisecond))

	dir := t.TempDir()
	base, err := filepath.Abs("../deploy/kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(dir, "overlay")
	rel, err := filepath.Rel(overlay, base)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(overlay, 0o755); err != nil {
		t.Fatal(err)
	}
	kust := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [%s]
images:
%sconfigMapGenerator:
  - name: otelcol-gateway
    behavior: replace
    literals: [OTEL_GATEWAY_ENDPOINT=%s, OTEL_GATEWAY_INSECURE=true]
`, rel, images.String(), gateway.GRPCEndpoint())
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kust), 0o644); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "var-lib")
	seccomp := c.RuncSeccomp(t)
	if !seccomp {
		t.Log("the harness's runc is built without seccomp: the pod runs without its RuntimeDefault profile (a node applies it)")
	}
	render := testenv.CRIRender{
		Kustomization: overlay,
		PodDir:        filepath.Join(dir, "pod"),
		HostPaths: map[string]string{
			"/var/lib":                     state,
			"/run/vc":                      filepath.Join(dir, "run-vc"),
			"/var/run/nri":                 filepath.Dir(c.NRISocket()),
			"/run/containerd/runsc/k8s.io": c.RunscRoot,
		},
		Attempts:                attempts,
		WithoutSeccomp:          !seccomp,
		RecursiveReadOnlyMounts: c.RecursiveReadOnlyMounts(t, ""),
	}
	if !render.RecursiveReadOnlyMounts {
		t.Log("the runtime handler does not support recursive read-only mounts: the host's submounts stay writable (recursiveReadOnly: IfPossible)")
	}
	plan := testenv.RenderCRIPod(t, "..", render)
	for _, v := range plan.Volumes {
		t.Logf("volume %s: %s", v.Name, v.Path)
	}
	d := &daemonSetPod{c: c, state: state, render: render}
	d.start(t, plan)
	return d
}

// start runs plan's pod and logs its containers' logs if the test fails.
func (d *daemonSetPod) start(t *testing.T, plan *testenv.CRIPlan) {
	t.Helper()
	pod := d.c.StartCRIPod(t, plan)
	d.pod = pod
	t.Cleanup(func() {
		if t.Failed() {
			for _, ctr := range plan.Containers {
				t.Logf("%s's log (pod %s):\n%s", ctr.Name, plan.Name, tail(pod.Logs(ctr.Name), 3000))
			}
		}
	})
}

// replace replaces the pod as the DaemonSet controller does in a rolling
// update (maxSurge 0) or after an eviction: each container stopped with
// SIGTERM and the pod's grace period, the sandbox stopped and removed, then
// a new pod of the same template (a new name and uid, its own emptyDirs,
// the same hostPath directories) run, its init container included.
func (d *daemonSetPod) replace(t *testing.T) {
	t.Helper()
	old := d.pod
	for _, ctr := range old.Plan.Containers {
		d.c.StopContainer(t, old.IDs[ctr.Name], 15*time.Second)
	}
	d.c.StopPod(t, old.ID)
	d.c.RemovePod(t, old.ID)
	r := d.render
	r.PodDir = filepath.Join(filepath.Dir(r.PodDir), "pod-2")
	plan := testenv.RenderCRIPod(t, "..", r)
	if plan.UID == old.Plan.UID {
		t.Fatalf("the new pod has the old one's uid %s", plan.UID)
	}
	d.start(t, plan)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// waitServing waits until every statsd shard serves its stats socket, the
// bridge is connected to NRI and synchronized, and the agent's /healthz
// answers 200.
func (d *daemonSetPod) waitServing(t *testing.T, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	sockets := d.pod.Plan.Volume("stats-sockets")
	for _, what := range []struct {
		name string
		ok   func() bool
	}{
		{"8 statsd stats sockets", func() bool {
			n := 0
			for _, shard := range k8sShards {
				if d.dialable(t, shard) {
					n++
				}
			}
			return n == 8
		}},
		{"the bridge connected to NRI (/healthz on :9478)", func() bool { return httpOK("http://127.0.0.1:9478/healthz") }},
		{"the agent's /healthz on :9477", func() bool { return httpOK("http://127.0.0.1:9477/healthz") }},
	} {
		for !what.ok() {
			if time.Now().After(deadline) {
				for _, ctr := range d.pod.Plan.Containers {
					st := d.c.InspectContainer(t, d.pod.IDs[ctr.Name])
					t.Logf("%s: %s exit %d %s", ctr.Name, st.State, st.ExitCode, st.Reason)
				}
				var found []string
				filepath.Walk(sockets, func(path string, info os.FileInfo, err error) error {
					if err == nil {
						found = append(found, fmt.Sprintf("%s %v", path, info.Mode()))
					}
					return nil
				})
				t.Fatalf("not ready within %v: %s; the stats sockets' volume holds %q", timeout, what.name, found)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func httpOK(url string) bool {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// polled is one line of statsctl poll: the socket (in the container) and
// the actor it holds.
type polled struct{ socket, actor string }

// poll runs statsctl poll in every statsd container (crictl exec, all at
// once), each over the stats sockets it sees, and returns their lines with
// a sample. A shard sees its own socket alone: a line of another's fails.
func (d *daemonSetPod) poll(t *testing.T) []polled {
	t.Helper()
	type result struct {
		shard string
		out   []byte
		err   error
	}
	results := make(chan result, len(k8sShards))
	for _, shard := range k8sShards {
		go func() {
			out, err := d.pod.Exec("statsd-"+shard, "/usr/local/bin/statsctl", "poll", "--sockets", "/run/statsd/*/*.sock", "--timeout", "5s")
			results <- result{shard, out, err}
		}()
	}
	var rows []polled
	for range k8sShards {
		r := <-results
		if r.err != nil {
			t.Fatalf("statsctl poll in statsd-%s: %v", r.shard, r.err)
		}
		sc := bufio.NewScanner(bytes.NewReader(r.out))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 0 || !strings.HasPrefix(f[0], "/") {
				continue // the header
			}
			if f[0] != k8sSocket(r.shard) {
				t.Fatalf("statsd-%s sees the stats socket %s: want its own alone", r.shard, f[0])
			}
			if len(f) > 2 && f[1] == "ok" {
				rows = append(rows, polled{socket: f[0], actor: f[2]})
			}
		}
	}
	return rows
}

// k8sShards are the DaemonSet's statsd shards.
var k8sShards = []string{"nri-0", "nri-1", "nri-2", "nri-3", "nri-4", "nri-5", "nri-6", "nri-7"}

// k8sSocket is the shard's stats socket in the pod's containers.
func k8sSocket(shard string) string { return "/run/statsd/" + shard + "/" + shard + ".sock" }

// k8sShard is the shard of a stats socket in the pod's containers.
func k8sShard(socket string) string { return filepath.Base(filepath.Dir(socket)) }

// boundOn waits up to timeout for the actor uid to be bound on one shard,
// as statsctl poll in a statsd container sees it, and returns its socket.
func (d *daemonSetPod) boundOn(t *testing.T, uid string, timeout time.Duration) string {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; {
		var found []string
		for _, r := range d.poll(t) {
			if r.actor == uid {
				found = append(found, r.socket)
			}
		}
		switch {
		case len(found) > 1:
			t.Fatalf("%s bound on %d shards: %q", uid, len(found), found)
		case len(found) == 1:
			return found[0]
		case time.Now().After(deadline):
			t.Fatalf("%s not bound on any shard within %v; the bridge's log:\n%s", uid, timeout, tail(d.pod.Logs("statsnri"), 3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stats is statsctl stats -o json for uid on socket, run in a statsd
// container: the sample's epoch and its CPU.
func (d *daemonSetPod) stats(t *testing.T, socket, uid string) (epoch time.Time, cpuUsec int64) {
	t.Helper()
	out, err := d.pod.Exec("statsd-"+k8sShard(socket), "/usr/local/bin/statsctl", "stats", "--socket", socket, "--actor-uid", uid, "-o", "json")
	if err != nil {
		t.Fatalf("statsctl stats: %v", err)
	}
	var s struct {
		ActorUID string `json:"actor_uid"`
		Epoch    string `json:"epoch_unix_nano"`
		CPU      string `json:"cpu_usage_usec"`
		Class    string `json:"sandbox_class"`
	}
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("statsctl stats -o json: %v\n%s", err, out)
	}
	if s.ActorUID != uid || s.Class != "SANDBOX_CLASS_GVISOR" {
		t.Fatalf("statsctl stats: %s", out)
	}
	ns, _ := strconv.ParseInt(s.Epoch, 10, 64)
	cpu, _ := strconv.ParseInt(s.CPU, 10, 64)
	return time.Unix(0, ns), cpu
}

// TestIntegrationK8sDaemonSet: the DaemonSet's pod, with its 8 statsd
// shards, the bridge, the agent and the Collector, runs from the manifest
// alone on a real containerd with NRI; a runsc pod started beside it is
// bound within 2 s of crictl runp returning, on one shard; statsctl in a
// statsd container reads it; the agent's /metrics on the pod's port 9477
// carries it at its next sweep (--interval 60s, as shipped), and the
// Collector forwards the agent's OTLP (the workload's metrics and its
// initial usage event) to the test's gateway. Then each container is
// killed and restarted as the kubelet would (restartEach). About 90 s.
func TestIntegrationK8sDaemonSet(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the images and runs a real containerd; not under -short")
	}
	testenv.NeedContainerd(t)
	// The pod runs in the node's network namespace (no CNI here): its ports
	// are the host's.
	for _, addr := range []string{"0.0.0.0:9477", "0.0.0.0:9478", "127.0.0.1:4317", "127.0.0.1:4318"} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("the pod's port %s is taken on this host (the pod runs in the node's network): %v", addr, err)
		}
		l.Close()
	}
	bins := testenv.BuildContainerd(t)
	testenv.BuildCollector(t) // the gateway's, and the otelcol image's build cache
	began := time.Now()
	gateway := testenv.StartCollector(t)
	c := testenv.StartContainerd(t, testenv.ContainerdOptions{Bins: bins})
	d := startDaemonSetPod(t, c, gateway, 2)
	d.waitServing(t, 60*time.Second)
	ready := time.Now()
	t.Logf("the DaemonSet's pod serving %v after the start", ready.Sub(began).Round(time.Millisecond))
	d.checkSockets(t)
	d.checkReadOnly(t)

	uid := testenv.NewActorUID()
	c.RunPod(t, testenv.PodSpec{Name: "sandboxed", Namespace: "team-k8s", UID: uid, Handler: "runsc",
		Labels: map[string]string{nriTemplateLabel: k8sTemplate}})
	ran := time.Now()
	socket := d.boundOn(t, uid, 10*time.Second)
	epoch, _ := d.stats(t, socket, uid)
	if bound := epoch.Sub(ran); bound > 2*time.Second {
		t.Errorf("the runsc pod bound %v after crictl runp returned, want within 2 s", bound)
	} else {
		t.Logf("the runsc pod bound on %s %v after crictl runp returned (seen by statsctl poll after %v)", socket, bound.Round(time.Millisecond), time.Since(ran).Round(time.Millisecond))
	}

	// The agent sweeps every 60 s, the first at its start (before the pod):
	// its next sweep finds it.
	var series string
	for deadline := time.Now().Add(90 * time.Second); series == ""; time.Sleep(time.Second) {
		for k, v := range testenv.Scrape(t, "http://127.0.0.1:9477") {
			if strings.HasPrefix(k, "sandboxstats_sampled_workloads{") && strings.Contains(k, "template_name="+k8sTemplate) && v == 1 {
				series = k
			}
		}
		if series == "" && time.Now().After(deadline) {
			t.Fatalf("the agent's /metrics has no sampled workload of template %s within 90 s; its log:\n%s", k8sTemplate, tail(d.pod.Logs("statsagent"), 3000))
		}
	}
	t.Logf("the agent's /metrics: %s (%v after the bind)", series, time.Since(ran).Round(time.Millisecond))

	gateway.WaitMetrics(t, 30*time.Second, func(pts []testenv.CollectedPoint) bool {
		for _, p := range pts {
			if p.Metric == "container.cpu.time" && p.Attributes["sandboxstats.template.name"] == k8sTemplate && p.Resource["k8s.node.name"] == k8sNodeName(t) {
				return true
			}
		}
		return false
	})
	gateway.WaitLogs(t, 30*time.Second, func(logs []testenv.CollectedLog) bool {
		for _, l := range logs {
			if l.EventName == "sandboxstats.workload.usage_sampled" && l.Attributes["sandboxstats.actor.uid"] == uid {
				return true
			}
		}
		return false
	})
	t.Logf("the Collector forwarded the workload's metrics and its usage event (%v after the start)", time.Since(began).Round(time.Millisecond))

	bound := append([]activation{{uid, socket, epoch}}, d.restartEach(t, gateway, uid, socket, epoch)...)

	// The pod replaced, as in a rolling update: a new pod on the same
	// host directories serves with the same bindings and activations, and
	// the agent continues.
	start := time.Now()
	carried := d.agentCarries(t, gateway, func() {
		d.replace(t)
		d.waitServing(t, 60*time.Second)
	}, bound[0].uid, bound[1].uid, bound[2].uid)
	for _, a := range bound {
		d.same(t, "the pod's replacement", a)
	}
	t.Logf("the DaemonSet's pod replaced (its init container run again): the %d runsc pods bound on their shards in the same activations; %s (%v)",
		len(bound), carried, time.Since(start).Round(time.Millisecond))
	t.Logf("the test took %v", time.Since(began).Round(time.Millisecond))
}

// kill SIGKILLs the container's process, as a crash or an OOM kill ends
// it, and waits for the runtime to see it exited.
func (d *daemonSetPod) kill(t *testing.T, name string) {
	t.Helper()
	st := d.c.InspectContainer(t, d.pod.IDs[name])
	if st.State != "CONTAINER_RUNNING" || st.PID <= 0 {
		t.Fatalf("%s: %+v, want it running", name, st)
	}
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s (pid %d): %v", name, st.PID, err)
	}
	if code := d.c.WaitExited(t, d.pod.IDs[name], 20*time.Second); code != 128+int(syscall.SIGKILL) {
		t.Errorf("%s exited %d, want %d", name, code, 128+int(syscall.SIGKILL))
	}
}

// killAndRestart kills the container and starts its next attempt, as the
// kubelet restarts a container that exited.
func (d *daemonSetPod) killAndRestart(t *testing.T, name string) {
	t.Helper()
	d.kill(t, name)
	d.pod.Restart(t, name, 1)
}

// restartEach kills each kind of container of the pod in turn (the shard
// holding the pod, the bridge, the Collector, the agent) and restarts it
// as the kubelet would (the same config, attempt 1): the runsc pod stays
// bound on one shard in the same activation (nothing bound twice, no
// activation lost), a pod started while its shard is down and one started
// while the bridge is down are bound once each is back (they are returned), the agent continues its counter and sends no second initial
// event, the Collector forwards again, and the runsc pod keeps running.
func (d *daemonSetPod) restartEach(t *testing.T, gateway *testenv.Collector, uid, socket string, epoch time.Time) []activation {
	t.Helper()
	same := func(what string) {
		t.Helper()
		d.same(t, what, activation{uid, socket, epoch})
	}
	shard := k8sShard(socket)
	start := time.Now()
	d.kill(t, "statsd-"+shard)
	// A pod placed on the shard (its first choice by the node's placement
	// key) started while the shard is down.
	uid3 := d.uidOn(t, shard)
	d.c.RunPod(t, testenv.PodSpec{Name: "sandboxed-3", Namespace: "team-k8s", UID: uid3, Handler: "runsc",
		Labels: map[string]string{nriTemplateLabel: k8sTemplate}})
	d.pod.Restart(t, "statsd-"+shard, 1)
	for deadline := time.Now().Add(20 * time.Second); !d.dialable(t, shard); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("statsd-%s did not serve again within 20 s:\n%s", shard, tail(d.pod.Logs("statsd-"+shard), 3000))
		}
	}
	same("statsd-" + shard + " restarted")
	socket3 := d.boundOn(t, uid3, 30*time.Second)
	epoch3, _ := d.stats(t, socket3, uid3)
	t.Logf("statsd-%s killed and restarted: the pod bound there in the same activation, a pod started meanwhile bound once, on %s (%v)",
		shard, k8sShard(socket3), time.Since(start).Round(time.Millisecond))

	start = time.Now()
	d.kill(t, "statsnri")
	uid2 := testenv.NewActorUID() // started while no bridge runs: no NRI event reaches anyone
	d.c.RunPod(t, testenv.PodSpec{Name: "sandboxed-2", Namespace: "team-k8s", UID: uid2, Handler: "runsc",
		Labels: map[string]string{nriTemplateLabel: k8sTemplate}})
	d.pod.Restart(t, "statsnri", 1)
	socket2 := d.boundOn(t, uid2, 30*time.Second)
	epoch2, _ := d.stats(t, socket2, uid2)
	same("statsnri restarted")
	t.Logf("statsnri killed and restarted: a pod started meanwhile bound once, the first still in its activation (%v)", time.Since(start).Round(time.Millisecond))

	start = time.Now()
	carried := d.agentCarries(t, gateway, func() {
		d.killAndRestart(t, "otelcol")
		d.killAndRestart(t, "statsagent")
	}, uid)
	same("otelcol and statsagent restarted")
	t.Logf("otelcol and statsagent killed and restarted: %s (%v)", carried, time.Since(start).Round(time.Millisecond))
	return []activation{{uid3, socket3, epoch3}, {uid2, socket2, epoch2}}
}

// uidOn is a new pod uid whose first choice is shard, by the node's
// placement key (the bridge's, on the node's disk).
func (d *daemonSetPod) uidOn(t *testing.T, shard string) string {
	t.Helper()
	key, err := nribridge.LoadPlacementKey(filepath.Join(d.state, "statsnri", "placement.key"))
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Index(k8sShards, shard)
	for range 1000 {
		if uid := testenv.NewActorUID(); nribridge.ShardOrder(key, uid, len(k8sShards))[0] == want {
			return uid
		}
	}
	t.Fatalf("no uid of 1000 placed first on %s", shard)
	return ""
}

// activation is a runsc pod bound on a shard: its uid, the shard's socket
// (in the statsd containers) and the activation's epoch.
type activation struct {
	uid, socket string
	epoch       time.Time
}

// same fails unless a's pod is bound on its shard alone, in the same
// activation, and its sandbox is still running.
func (d *daemonSetPod) same(t *testing.T, what string, a activation) {
	t.Helper()
	if got := d.boundOn(t, a.uid, 20*time.Second); got != a.socket {
		t.Fatalf("after %s the pod %s is bound on %s, was %s", what, a.uid, got, a.socket)
	}
	if e, _ := d.stats(t, a.socket, a.uid); !e.Equal(a.epoch) {
		t.Fatalf("after %s the pod %s's activation began at %v, was %v: a new activation", what, a.uid, e, a.epoch)
	}
	for _, p := range d.c.Pods(t) {
		if p.UID == a.uid {
			if p.State != "SANDBOX_READY" {
				t.Fatalf("after %s the runsc pod %s is %s", what, a.uid, p.State)
			}
			return
		}
	}
	t.Fatalf("after %s the runsc pod %s is gone", what, a.uid)
}

// cpu is the agent's CPU counter of the template's pods, or -1.
func (d *daemonSetPod) cpu(t *testing.T) float64 {
	t.Helper()
	for k, v := range testenv.Scrape(t, "http://127.0.0.1:9477") {
		if strings.HasPrefix(k, "sandboxstats_workload_cpu_seconds_total{") && strings.Contains(k, "template_name="+k8sTemplate) {
			return v
		}
	}
	return -1
}

// agentState is what the test reads of the agent's agent-state.json.
type agentState struct {
	Origin int64 `json:"origin_unix_nano"`
	Saved  int64 `json:"saved_unix_nano"`
	Totals []struct {
		Labels [7]string `json:"labels"`
	} `json:"totals"`
}

func (d *daemonSetPod) agentState(t *testing.T) agentState {
	t.Helper()
	path := filepath.Join(d.state, "statsagent", "agent-state.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the agent's state: %v", err)
	}
	var st agentState
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return st
}

// agentCarries runs restart (which restarts or replaces the agent) and
// fails unless the agent carried its state over: the restarted agent logs
// the state restored, its state file keeps the first agent's origin and is
// saved again after the restart, its CPU counter of the template's pods
// continues, the Collector forwards its next sweep, and no pod of uids has
// a second initial usage event. It says what it saw.
func (d *daemonSetPod) agentCarries(t *testing.T, gateway *testenv.Collector, restart func(), uids ...string) string {
	t.Helper()
	was := d.agentState(t)
	before := d.cpu(t)
	start := time.Now()
	restart()
	var after float64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if httpOK("http://127.0.0.1:9477/healthz") {
			if after = d.cpu(t); after >= 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restarted agent serves no CPU counter of %s within 30 s:\n%s", k8sTemplate, tail(d.pod.Logs("statsagent"), 3000))
		}
	}
	if before < 0 || after < before {
		t.Errorf("the agent's CPU counter of %s went from %v to %v across its restart: want it continued", k8sTemplate, before, after)
	}
	if log := d.pod.Logs("statsagent"); !strings.Contains(log, "agent state restored") {
		t.Errorf("the restarted agent did not restore its state; its log:\n%s", tail(log, 3000))
	}
	var now agentState
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if now = d.agentState(t); now.Saved > start.UnixNano() || time.Now().After(deadline) {
			break
		}
	}
	if now.Origin != was.Origin || now.Saved <= start.UnixNano() || len(now.Totals) < len(was.Totals) {
		t.Errorf("agent-state.json: origin %d, saved %d, %d label sets before the restart at %d; origin %d, saved %d, %d label sets after: want the origin kept, saved after the restart, no label set lost",
			was.Origin, was.Saved, len(was.Totals), start.UnixNano(), now.Origin, now.Saved, len(now.Totals))
	}
	// The restarted agent's first sweep is exported through the restarted
	// Collector: a point newer than the restart arrives.
	restarted := uint64(start.UnixNano())
	gateway.WaitMetrics(t, 30*time.Second, func(pts []testenv.CollectedPoint) bool {
		for _, p := range pts {
			if p.Metric == "container.cpu.time" && p.Attributes["sandboxstats.template.name"] == k8sTemplate && p.TimeUnixNano > restarted {
				return true
			}
		}
		return false
	})
	initial := map[string]map[string]bool{} // actor -> log.record.uid of its initial events
	for _, l := range gateway.Logs(t) {
		actor, _ := l.Attributes["sandboxstats.actor.uid"].(string)
		kind, _ := l.Attributes["sandboxstats.stats.kind"].(string)
		rec, _ := l.Attributes["log.record.uid"].(string)
		if l.EventName == "sandboxstats.workload.usage_sampled" && kind == "initial" {
			if initial[actor] == nil {
				initial[actor] = map[string]bool{}
			}
			initial[actor][rec] = true
		}
	}
	for _, uid := range uids {
		if len(initial[uid]) > 1 {
			t.Errorf("initial events of the pod %s, by log.record.uid: %v; want one (sent again with the same uid at most)", uid, initial[uid])
		}
	}
	return fmt.Sprintf("the state restored (origin kept, saved again %v after the restart), the CPU counter continued (%.3f s to %.3f s), the Collector forwarded the next sweep",
		time.Duration(now.Saved-start.UnixNano()).Round(time.Millisecond), before, after)
}

// checkSockets: what each container sees of the sockets, through its own
// mount namespace: a shard its own stats and lifecycle sockets alone, the
// bridge all 16, the agent the 8 stats sockets and no lifecycle socket.
func (d *daemonSetPod) checkSockets(t *testing.T) {
	t.Helper()
	type seen struct{ stats, lifecycle []string }
	want := map[string]seen{}
	var all seen
	for _, shard := range k8sShards {
		own := seen{[]string{k8sSocket(shard)}, []string{"/run/statsd-lifecycle/" + shard + "/" + shard + ".sock"}}
		want["statsd-"+shard] = own
		all.stats = append(all.stats, own.stats...)
		all.lifecycle = append(all.lifecycle, own.lifecycle...)
	}
	want["statsnri"] = all
	want["statsagent"] = seen{stats: all.stats}
	for name, w := range want {
		root := fmt.Sprintf("/proc/%d/root", d.c.InspectContainer(t, d.pod.IDs[name]).PID)
		var got seen
		for _, g := range []struct {
			glob string
			into *[]string
		}{{"/run/statsd/*/*.sock", &got.stats}, {"/run/statsd-lifecycle/*/*.sock", &got.lifecycle}, {"/run/statsd/lifecycle/*.sock", &got.lifecycle}} {
			m, err := filepath.Glob(root + g.glob)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range m {
				*g.into = append(*g.into, strings.TrimPrefix(p, root))
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("%s sees the stats sockets %q and the lifecycle sockets %q; want %q and %q", name, got.stats, got.lifecycle, w.stats, w.lifecycle)
		}
	}
}

// checkReadOnly: no mount a statsd shard has at or below the host's /proc,
// cgroups or debugfs is writable (recursiveReadOnly, where the runtime
// handler supports it), as /proc/<pid>/mountinfo says.
func (d *daemonSetPod) checkReadOnly(t *testing.T) {
	t.Helper()
	pid := d.c.InspectContainer(t, d.pod.IDs["statsd-nri-0"]).PID
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line) // id parent dev root point options ...
		if len(f) < 6 {
			t.Fatalf("mountinfo line %q", line)
		}
		for _, top := range []string{"/host/proc", "/sys/fs/cgroup", "/sys/kernel/debug"} {
			if f[4] != top && !strings.HasPrefix(f[4], top+"/") {
				continue
			}
			n++
			if !slices.Contains(strings.Split(f[5], ","), "ro") {
				t.Errorf("statsd-nri-0 has %s mounted writable (%s): a host mount's submount not read-only", f[4], f[5])
			}
		}
	}
	t.Logf("statsd-nri-0: %d mounts at or below the host's /proc, cgroups and debugfs, all read-only", n)
}

// dialable reports whether the shard's stats socket answers a connect, as
// the bridge's container sees it (/proc/<pid>/root: the socket's path on
// the node, below the test's directory and the pod's, is longer than a
// Unix socket address allows).
func (d *daemonSetPod) dialable(t *testing.T, shard string) bool {
	t.Helper()
	return dialable(fmt.Sprintf("/proc/%d/root%s", d.c.InspectContainer(t, d.pod.IDs["statsnri"]).PID, k8sSocket(shard)))
}

func dialable(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// k8sNodeName is the node name cripod gives the pod (the host's name).
func k8sNodeName(t *testing.T) string {
	t.Helper()
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}
