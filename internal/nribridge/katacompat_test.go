package nribridge

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
)

// TestKataRunAcrossStatsdVersions: a Kata pod's Run carries its containers
// both as containers (with names) and as container_ids (the same ids in
// the same order), so that during a rolling upgrade that updates the
// bridge first an older statsd (which drops containers, needs
// container_ids and does not know UpdateWorkloadContainers) binds it too:
// the pod is measured by both, a later change is an Update (the older one
// keeps the Run's set).
func TestKataRunAcrossStatsdVersions(t *testing.T) {
	for _, tc := range []struct {
		name       string
		older      bool
		wantNames  []string // the bound containers, "name=id"
		wantIDs    []string // the bound container_ids
		wantEvents []string
		afterIDs   []string // container_ids once c3 is created
	}{
		{"this statsd", false, []string{"=kata1", "nc1=c1", "nc2=c2"}, []string{"kata1", "c1", "c2"},
			[]string{"bind uid-k", "update uid-k", "checkpoint uid-k runtime-stopped"}, []string{"kata1", "c1", "c2", "c3"}},
		{"an older statsd", true, []string{}, []string{"kata1", "c1", "c2"},
			[]string{"bind uid-k", "unimplemented uid-k", "checkpoint uid-k runtime-stopped"}, []string{"kata1", "c1", "c2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := shortDir(t)
			f := fakes(t, 1)[0]
			f.SetOlder(tc.older)
			b := startBridge(t, []*statsdfake.Lifecycle{f}, func(o *Options) { o.Kata = KataLayout{Root: root}; o.Settle = 100 * time.Millisecond })
			p := &api.PodSandbox{Id: "kata1", Uid: "uid-k", Name: "vm", Namespace: "shop", RuntimeHandler: "kata-clh", Pid: 777}
			ctr := func(id string) *api.Container { return &api.Container{Id: id, PodSandboxId: "kata1", Name: "n" + id} }
			b.RunPodSandbox(p)
			b.ContainerCreated(p, ctr("c1"))
			b.ContainerCreated(p, ctr("c2"))
			// The layout appears after the containers: the Run names them.
			layOutKata1(t, root)
			eventually(t, "bound", func() bool { return len(f.Bound()) == 1 })
			ref := f.Bound()["uid-k"].GetSandbox()
			if diff := cmp.Diff(tc.wantNames, statsdfake.Names(ref.GetContainers())); diff != "" {
				t.Errorf("containers bound (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantIDs, ref.GetContainerIds()); diff != "" {
				t.Errorf("container_ids bound (-want +got):\n%s", diff)
			}
			b.ContainerCreated(p, ctr("c3"))
			eventually(t, "the change sent", func() bool { return len(f.Events()) == 2 })
			if diff := cmp.Diff(tc.afterIDs, f.Bound()["uid-k"].GetSandbox().GetContainerIds()); diff != "" {
				t.Errorf("container_ids after c3 (-want +got):\n%s", diff)
			}
			if !b.healthyBinding("uid-k") {
				t.Error("the pod's binding is not held as bound")
			}
			b.StopPodSandbox(p)
			eventually(t, "checkpointed", func() bool { return len(f.Bound()) == 0 })
			time.Sleep(200 * time.Millisecond)
			if diff := cmp.Diff(tc.wantEvents, f.Events()); diff != "" {
				t.Errorf("statsd's events (-want +got):\n%s", diff)
			}
		})
	}
}

// layOutKata1 writes sandbox kata1's persist.json under root (Cloud
// Hypervisor, VMM pid 4242, agent hvsock:///run/vc/vm/kata1/clh.sock:1024).
func layOutKata1(t *testing.T, root string) {
	t.Helper()
	dir := filepath.Join(root, "sbs", "kata1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Whole or not at all (a rename): a bridge retrying meanwhile must not
	// read half a file (that is not "not yet" but unactionable until the
	// next listing, past the test's 5 s).
	tmp := filepath.Join(dir, ".persist.json.tmp")
	if err := os.WriteFile(tmp, []byte(`{"HypervisorState":{"Type":"clh","Pid":4242},"AgentState":{"URL":"hvsock:///run/vc/vm/kata1/clh.sock:1024"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "persist.json")); err != nil {
		t.Fatal(err)
	}
}
