package e2e

// The NRI bridge end to end (issue 23's "Must show"): a real containerd
// with NRI and the CRI (testenv.StartContainerd), pods made with crictl,
// two statsd started by the test as the bridge's shards, the statsnri
// binary, and statsagent polling the shards.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/nribridge"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// nriTemplateLabel is the pod label the bridge reads a template from (its
// default --template-from).
const nriTemplateLabel = "sandboxstats.dev/template"

// nriNamespace is the pods' namespace (and so their templates').
const nriNamespace = "team-nri"

// orderlyStopOutcome is the outcome statsd records for a runc pod stopped
// through the CRI (crictl stopp) and bound by its pod-level cgroup: NRI
// tells the bridge of the stop after the sandbox's processes are gone, and
// the bridge says so (CheckpointWorkloadRequest.runtime_stopped), so an
// orderly stop reads CHECKPOINTED unless statsd saw the sandbox dead first
// (docs/nri.md, "The lifecycle"). The pod-level cgroup's own cgroup.procs
// is empty while the pod runs (its processes are in the cgroups below it),
// so statsd's drift check would see it dead once its grace (15 min by
// default, not reached here) has passed (docs/nri.md, "Limits").
func orderlyStopOutcome() sandboxstatsv1.ActivationOutcome {
	return sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_CHECKPOINTED
}

// nriRig is a containerd with NRI, two statsd (the bridge's shards, their
// stats sockets in dir/stats where statsagent's glob finds them), and the
// bridge (not started: start it with bridge.start).
type nriRig struct {
	c      *testenv.Containerd
	bin    string
	dir    string
	cgRoot string // the runc pods' cgroup parents are under it
	shards []*testenv.Statsd
	key    []byte // the bridge's placement key
	stats  []sandboxstatsv1.WorkloadStatsServiceClient
	bridge *bridgeProc
}

// startNRIRig starts containerd and the two statsd, and prepares the
// bridge with --handlers runsc,runc --default-runtime runc, the shards as
// --statsd, and bridgeArgs.
func startNRIRig(t *testing.T, bridgeArgs ...string) *nriRig {
	t.Helper()
	return startNRIRigWith(t, nil, bridgeArgs...)
}

// startNRIRigWith is startNRIRig with statsdArgs given to both statsd.
func startNRIRigWith(t *testing.T, statsdArgs []string, bridgeArgs ...string) *nriRig {
	t.Helper()
	return startNRIRigFor(t, func(*testenv.Containerd) []string { return statsdArgs }, bridgeArgs...)
}

// startNRIRigFor is startNRIRigWith with the statsd arguments made from
// the containerd started (its RunscRoot).
func startNRIRigFor(t *testing.T, statsdArgsOf func(*testenv.Containerd) []string, bridgeArgs ...string) *nriRig {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a real containerd, runc and gVisor pods; not under -short")
	}
	needCgroups(t)
	testenv.NeedContainerd(t)
	bins := testenv.BuildContainerd(t)
	r := &nriRig{bin: testenv.BuildBinaries(t, "statsagent", "statsnri"), dir: fleetDir(t)}
	// Before containerd: its cleanup runs after the harness's.
	r.cgRoot = nriCgroupRoot(t)
	// Its metrics: containerd's own timing of each NRI call to the bridge.
	r.c = testenv.StartContainerd(t, testenv.ContainerdOptions{Bins: bins, Metrics: true})
	// The bridge's placement key, which the test reads to place pods.
	keyFile := filepath.Join(r.dir, "placement.key")
	key, err := nribridge.LoadPlacementKey(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	r.key = key
	args := []string{"--nri-socket", r.c.NRISocket(), "--handlers", "runsc,runc", "--default-runtime", "runc", "--placement-key-file", keyFile,
		// The tests' pods share one namespace, and the latency test keeps
		// more than --namespace-cap's 16 running on one statsd.
		"--namespace-cap", "0"}
	for i := range 2 {
		d := startStatsdIn(t, r.bin, r.dir, fmt.Sprintf("nri-%d", i), statsdArgsOf(r.c)...)
		st, _ := clients(t, d)
		r.shards, r.stats = append(r.shards, d), append(r.stats, st)
		args = append(args, "--statsd", d.Lifecycle+","+d.Stats)
	}
	r.bridge = newBridgeProc(t, r.bin, r.dir, append(args, bridgeArgs...)...)
	return r
}

// nriCgroupRoot makes the cgroup /sbs-nri-<pid>-<n> (the runc pods' cgroup
// parents go under it, as the kubelet's pod cgroups under kubepods) and,
// at the end of the test, removes it and everything under it in every
// hierarchy (runc makes the pods' parents in the hierarchies the test did
// not).
func nriCgroupRoot(t *testing.T) string {
	t.Helper()
	root := fmt.Sprintf("/sbs-nri-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)
	for _, d := range cgroupDirs(root) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, h := range cgroupHierarchyDirs() {
			top := filepath.Join(h, root)
			var dirs []string
			filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for _, d := range slices.Backward(dirs) {
				if err := testenv.RmdirRetry(d); err != nil {
					t.Errorf("remove cgroup %s: %v", d, err)
				}
			}
		}
	})
	return root
}

// cgroupHierarchyDirs are the cgroup mounts: each v1 hierarchy and the
// unified one, or the v2 root.
func cgroupHierarchyDirs() []string {
	if testenv.CgroupV2() {
		return []string{testenv.CgroupRoot}
	}
	var out []string
	ents, _ := os.ReadDir(testenv.CgroupRoot)
	for _, e := range ents {
		p := filepath.Join(testenv.CgroupRoot, e.Name())
		if st, err := os.Lstat(p); err == nil && st.IsDir() {
			out = append(out, p)
		}
	}
	return out
}

// shardOf is the bridge's placement of a pod with room everywhere: the
// first of its uid's order under the rig's placement key (docs/nri.md).
func (r *nriRig) shardOf(uid string) int { return nribridge.ShardOrder(r.key, uid, len(r.shards))[0] }

// uidOnShard makes a pod uid the bridge places on shard; -1: any.
func (r *nriRig) uidOnShard(shard int) string {
	for {
		uid := testenv.NewActorUID()
		if shard < 0 || r.shardOf(uid) == shard {
			return uid
		}
	}
}

// nriPod is a pod a test made.
type nriPod struct {
	name, uid, id, handler, template string
	shard                            int           // the statsd the bridge places it on
	cgroup                           string        // the cgroup its figures are read from
	took                             time.Duration // crictl runp's wall time
	returned                         time.Time     // when crictl runp returned
}

// runPod makes a pod with crictl: a runc pod ("" handler) under its own
// pod-level cgroup <cgRoot>/pod<uid> (made here, as the kubelet makes one),
// a runsc pod in containerd's default /k8s.io/<id>. Its uid is placed on
// shard (-1: any). The template label is set when template is not empty.
func (r *nriRig) runPod(t *testing.T, name, handler string, shard int, template string) *nriPod {
	t.Helper()
	p := &nriPod{name: name, uid: r.uidOnShard(shard), handler: handler, template: template}
	p.shard = r.shardOf(p.uid)
	spec := testenv.PodSpec{Name: name, Namespace: nriNamespace, UID: p.uid, Handler: handler}
	if template != "" {
		spec.Labels = map[string]string{nriTemplateLabel: template}
	}
	if handler == "" {
		spec.CgroupParent = r.cgRoot + "/pod" + p.uid
		for _, d := range cgroupDirs(spec.CgroupParent) {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		p.cgroup = spec.CgroupParent
	}
	start := time.Now()
	p.id = r.c.RunPod(t, spec)
	p.returned = time.Now()
	p.took = p.returned.Sub(start)
	if handler != "" {
		p.cgroup = r.c.InspectPod(t, p.id).CgroupsPath
	}
	return p
}

// runDefaultPod makes a runc pod in containerd's default cgroup parent
// (/k8s.io/<id>), with no template: the latency pods.
func (r *nriRig) runDefaultPod(t *testing.T, name string) *nriPod {
	t.Helper()
	p := &nriPod{name: name, uid: testenv.NewActorUID()}
	start := time.Now()
	p.id = r.c.RunPod(t, testenv.PodSpec{Name: name, Namespace: nriNamespace, UID: p.uid})
	p.returned = time.Now()
	p.took = p.returned.Sub(start)
	return p
}

// nriBinding is one actor a statsd holds: its sample, or why it has none.
type nriBinding struct {
	shard   int
	epoch   int64
	sample  *sandboxstatsv1.WorkloadStatsSample
	pending *sandboxstatsv1.PendingWorkload
}

// listShard lists what one statsd holds (StatsActiveWorkloads).
func (r *nriRig) listShard(t *testing.T, i int) *sandboxstatsv1.StatsActiveWorkloadsResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := r.stats[i].StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil {
		t.Fatalf("StatsActiveWorkloads of statsd %d: %v", i, err)
	}
	return resp
}

// bindings lists every statsd's bindings by actor uid: an actor bound once
// has one entry.
func (r *nriRig) bindings(t *testing.T) map[string][]nriBinding {
	t.Helper()
	out := map[string][]nriBinding{}
	for i := range r.shards {
		resp := r.listShard(t, i)
		for _, s := range resp.GetSamples() {
			out[s.GetActorUid()] = append(out[s.GetActorUid()], nriBinding{shard: i, epoch: s.GetEpochUnixNano(), sample: s})
		}
		for _, p := range resp.GetPending() {
			uid := p.GetIdentity().GetActorUid()
			out[uid] = append(out[uid], nriBinding{shard: i, epoch: p.GetEpochUnixNano(), pending: p})
		}
	}
	return out
}

// ended lists every statsd's ended activations (every page) by actor uid.
func (r *nriRig) ended(t *testing.T) map[string][]*sandboxstatsv1.EndedActivation {
	t.Helper()
	out := map[string][]*sandboxstatsv1.EndedActivation{}
	for i := range r.shards {
		token := ""
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := r.stats[i].ListEndedActivations(ctx, &sandboxstatsv1.ListEndedActivationsRequest{PageToken: token})
			cancel()
			if err != nil {
				t.Fatalf("ListEndedActivations of statsd %d: %v", i, err)
			}
			for _, e := range resp.GetEnded() {
				uid := e.GetIdentity().GetActorUid()
				out[uid] = append(out[uid], e)
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
	}
	return out
}

// waitBound waits up to d for each pod to be bound (listed by a statsd)
// and returns how long after its crictl runp returned it was first seen;
// the statsd are listed every 20 ms.
func (r *nriRig) waitBound(t *testing.T, d time.Duration, pods ...*nriPod) map[string]time.Duration {
	t.Helper()
	seen := map[string]time.Duration{}
	deadline := time.Now().Add(d)
	for {
		b := r.bindings(t)
		now := time.Now()
		for _, p := range pods {
			if _, ok := seen[p.uid]; !ok && len(b[p.uid]) > 0 {
				seen[p.uid] = now.Sub(p.returned)
			}
		}
		if len(seen) == len(pods) {
			return seen
		}
		if now.After(deadline) {
			var missing []string
			for _, p := range pods {
				if _, ok := seen[p.uid]; !ok {
					missing = append(missing, p.name+" "+p.uid)
				}
			}
			t.Fatalf("not bound within %v: %v\nstatsnri log:\n%s", d, missing, r.bridge.logTail(6000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitEnded waits up to d for an ended record of each uid and returns them.
func (r *nriRig) waitEnded(t *testing.T, d time.Duration, uids ...string) map[string]*sandboxstatsv1.EndedActivation {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		e := r.ended(t)
		out := map[string]*sandboxstatsv1.EndedActivation{}
		for _, uid := range uids {
			if len(e[uid]) > 0 {
				out[uid] = e[uid][0]
			}
		}
		if len(out) == len(uids) {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ended record of %d of %v within %v\nstatsnri log:\n%s", len(uids)-len(out), uids, d, r.bridge.logTail(6000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkPodSample holds a pod's sample to its own pod: its identity (actor
// uid = pod uid, name, namespace, the template from the label) and its
// figures equal to its own cgroup's as the kernel's files say them, read
// right before (k0) and after (k1) the call that answered it, and to no
// other pod's.
func checkPodSample(t *testing.T, p *nriPod, s *sandboxstatsv1.WorkloadStatsSample, pods []*nriPod, k0, k1 map[string]kernelFigures) {
	t.Helper()
	if s.GetActorUid() != p.uid || s.GetActorName() != p.name || s.GetActorNamespace() != nriNamespace ||
		s.GetTemplateNamespace() != nriNamespace || s.GetTemplateName() != p.template {
		t.Errorf("pod %s (uid %s, template %s/%s): sample's identity uid %q name %q namespace %q template %q/%q", p.name, p.uid, nriNamespace, p.template,
			s.GetActorUid(), s.GetActorName(), s.GetActorNamespace(), s.GetTemplateNamespace(), s.GetTemplateName())
	}
	if s.GetSource() != sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP || !strings.Contains(s.GetSourceDetail(), p.cgroup) {
		t.Errorf("pod %s: source %v %q, want its cgroup %s", p.name, s.GetSource(), s.GetSourceDetail(), p.cgroup)
	}
	if off := offKernel(s, k0[p.uid], k1[p.uid]); len(off) > 0 {
		t.Errorf("pod %s: its sample is not its cgroup %s's: %s", p.name, p.cgroup, strings.Join(off, "; "))
	}
	for _, o := range pods {
		if o != p && len(offKernel(s, k0[o.uid], k1[o.uid])) == 0 {
			t.Errorf("pod %s: its sample equals pod %s's cgroup", p.name, o.name)
		}
	}
	k := k1[p.uid]
	t.Logf("pod %s (%s, statsd %d): memory %d B (kernel %d), peak %d B (kernel %d), working set %d B (kernel %d), CPU %d us (kernel %d), processes %v; %s",
		p.name, handlerName(p.handler), p.shard, s.GetMemoryCurrentBytes(), k.current, s.GetMemoryPeakBytes(), k.peak,
		s.GetMemoryWorkingSetBytes(), k.workingSet, s.GetCpuUsageUsec(), k.cpuUsec, deref32(s.SandboxProcesses), s.GetSourceDetail())
}

func handlerName(h string) string {
	if h == "" {
		return "runc"
	}
	return h
}

func deref32(p *uint32) string {
	if p == nil {
		return "absent"
	}
	return fmt.Sprint(*p)
}

// podKernels reads each pod's cgroup, by uid.
func podKernels(t *testing.T, pods []*nriPod) map[string]kernelFigures {
	t.Helper()
	out := map[string]kernelFigures{}
	for _, p := range pods {
		out[p.uid] = readKernel(t, p.cgroup)
	}
	return out
}
