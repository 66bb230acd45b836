package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestIntegrationNRIBindsPods: three pods made with crictl under a real
// containerd (two runc pods under pod-level cgroups the test made, as the
// kubelet makes them, each holding a workload of its own size beside its
// sandbox; one runsc pod), the bridge spreading them over two statsd by
// their uid. Each is bound within 2 s of crictl runp returning (the
// statsd listed every 20 ms), on the statsd the bridge's hash places it on,
// once; each sample is its own pod's (actor uid = pod uid, name,
// namespace, the template from the pod's label) and equal to its own
// cgroup's figures as the kernel's files say them (the runc pods' pod-level
// cgroup, the runsc pod's sandbox cgroup found by the sentry's pid), read
// right before and after; and statsagent, polling the two statsd, exports
// each pod's series under the template its label named.
func TestIntegrationNRIBindsPods(t *testing.T) {
	r := startNRIRig(t)
	r.bridge.start(t)
	took := r.bridge.waitHealthy(t, 10*time.Second)
	t.Logf("statsnri connected and synchronized %v after its metrics listener", took.Round(time.Millisecond))
	agent := testenv.StartStatsagent(t, r.bin, r.dir, "--sockets", filepath.Join(r.dir, "stats", "*.sock"),
		"--interval", "500ms", "--min-interval", "100ms", "--timeout", "5s")

	specs := []struct {
		name, handler string
		shard         int
		allocMiB      int // the workload beside a runc pod's sandbox
	}{
		{"web-a", "", 0, 16},
		{"web-b", "", 1, 48},
		{"gv", "runsc", 1, 0},
	}
	var pods []*nriPod
	for _, s := range specs {
		p := r.runPod(t, s.name, s.handler, s.shard, "tmpl-"+s.name)
		lat := r.waitBound(t, 2*time.Second, p)[p.uid]
		t.Logf("pod %s (%s, %s) started in %v, bound %v after crictl runp returned", p.name, handlerName(p.handler), p.id[:12],
			p.took.Round(time.Millisecond), lat.Round(time.Millisecond))
		pods = append(pods, p)
	}
	if !testenv.CgroupV2() {
		// A workload of its own size in each runc pod, in a leaf of the
		// pod-level cgroup as a container would be.
		for i, s := range specs {
			if s.allocMiB == 0 {
				continue
			}
			leaf := pods[i].cgroup + "/app"
			for _, d := range cgroupDirs(leaf) {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			w := testenv.StartChild(t, "TestWorkloadChild")
			moveTo(t, leaf, w.Cmd.Process.Pid)
			w.Do(t, fmt.Sprintf("alloc %d", s.allocMiB))
			w.Do(t, "burn 100")
		}
	}

	// Each pod bound once, where the hash places it.
	b := r.bindings(t)
	for _, p := range pods {
		if got := b[p.uid]; len(got) != 1 || got[0].shard != p.shard {
			t.Errorf("pod %s (uid %s): bound %+v, want once, on statsd %d", p.name, p.uid, got, p.shard)
		}
	}
	if len(b) != len(pods) {
		t.Errorf("the statsd hold %d actors, want the %d pods", len(b), len(pods))
	}

	// Each sample is its own pod's cgroup's.
	for i := range r.shards {
		k0 := podKernels(t, pods)
		resp := r.listShard(t, i)
		k1 := podKernels(t, pods)
		if len(resp.GetPending()) > 0 {
			t.Errorf("statsd %d: pending %v", i, resp.GetPending())
		}
		for _, s := range resp.GetSamples() {
			j := slices.IndexFunc(pods, func(p *nriPod) bool { return p.uid == s.GetActorUid() })
			if j < 0 {
				t.Errorf("statsd %d holds %q, no pod of the test", i, s.GetActorUid())
				continue
			}
			checkPodSample(t, pods[j], s, pods, k0, k1)
		}
	}

	// statsagent's metrics carry each pod's template.
	m := testenv.WaitNewSweeps(t, agent)
	for _, p := range pods {
		labels := fmt.Sprintf("{sandbox_class=gvisor,source=cgroup,template_name=%s,template_namespace=%s}", p.template, nriNamespace)
		mem, ok := m["sandboxstats_workload_memory_current_bytes"+labels]
		cpu, okCPU := m["sandboxstats_workload_cpu_seconds_total"+labels]
		if !ok || !okCPU || mem <= 0 {
			var have []string
			for k := range m {
				if strings.HasPrefix(k, "sandboxstats_workload_memory_current_bytes") {
					have = append(have, k)
				}
			}
			t.Errorf("pod %s: statsagent exports no memory/CPU series %s (memory %v %v, CPU %v); memory series: %v", p.name, labels, ok, mem, okCPU, have)
			continue
		}
		t.Logf("statsagent: pod %s as template %s/%s: memory %.0f B, CPU %.3f s", p.name, nriNamespace, p.template, mem, cpu)
	}
	nm := r.bridge.metrics(t)
	t.Logf("statsnri: run-pod-sandbox events %v, bindings %v/%v, runs ok %v/%v",
		nm["sandboxstats_nri_events_total{event=run-pod-sandbox}"],
		nm["sandboxstats_nri_statsd_bindings{statsd="+r.shards[0].Lifecycle+"}"], nm["sandboxstats_nri_statsd_bindings{statsd="+r.shards[1].Lifecycle+"}"],
		nm["sandboxstats_nri_statsd_calls_total{call=run,result=ok,statsd="+r.shards[0].Lifecycle+"}"], nm["sandboxstats_nri_statsd_calls_total{call=run,result=ok,statsd="+r.shards[1].Lifecycle+"}"])
}
