package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/microvm"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func cref(id, name string) *sandboxstatsv1.ContainerRef {
	return &sandboxstatsv1.ContainerRef{Id: id, Name: name}
}

// gvContainers is a gVisor reading listing containers with their CPU.
func gvContainers(cpu uint64, cs ...source.Container) source.Reading {
	r := cgroupRdg
	r.CPUUsageUsec = cpuUsec(cpu)
	r.Containers = cs
	return r
}

func gvCtr(id string, cpu uint64) source.Container {
	return source.Container{ID: id, CPUUsageUsec: cpuUsec(cpu),
		Absent: []source.Absent{{Field: "memory_current_bytes", Reason: "sandbox-wide"}}}
}

// TestUpdateWorkloadContainersContract: the epoch stays; an actor not bound
// is NO_WORKLOAD or ACTOR_MISMATCH; a set that does not validate is
// INVALID_REQUEST and changes nothing; a Run repeated with another set is a
// retry that updates it; names from the binding win over the runtime's.
func TestUpdateWorkloadContainersContract(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	update := func(actor string, cs ...*sandboxstatsv1.ContainerRef) (*sandboxstatsv1.UpdateWorkloadContainersResponse, error) {
		return h.lifecycle.UpdateWorkloadContainers(ctx, &sandboxstatsv1.UpdateWorkloadContainersRequest{ActorUid: actor, Containers: cs})
	}
	_, err := update("actor-a", cref("c1", "web"))
	wantStatus(t, err, codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_NO_WORKLOAD)

	ref := &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: "/statstest",
		Containers: []*sandboxstatsv1.ContainerRef{cref("4c1e0f", "app")}}
	epoch := h.run(t, identA, ref)
	b := h.store.Bound("actor-a")

	t.Run("update keeps the epoch, the binding and the source", func(t *testing.T) {
		resp, err := update("actor-a", cref("4c1e0f", "web"), cref("9b27aa", "sidecar"))
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetEpochUnixNano() != epoch || h.store.Bound("actor-a") != b || h.opens.Load() != 1 {
			t.Fatalf("epoch %d (want %d), binding kept %v, opens %d", resp.GetEpochUnixNano(), epoch, h.store.Bound("actor-a") == b, h.opens.Load())
		}
		h.src.set(gvContainers(2_000_000, source.Container{ID: "4c1e0f", Name: "from-annotation", CPUUsageUsec: cpuUsec(900_000)}, gvCtr("9b27aa", 100_000)), nil)
		s, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, c := range s.GetSample().GetContainers() {
			names = append(names, c.GetName())
		}
		if diff := cmp.Diff([]string{"web", "sidecar"}, names); diff != "" || s.GetSample().GetEpochUnixNano() != epoch {
			t.Errorf("names (-want +got):\n%s epoch %d", diff, s.GetSample().GetEpochUnixNano())
		}
	})
	t.Run("unknown actor", func(t *testing.T) {
		_, err := update("actor-b", cref("c1", ""))
		wantStatus(t, err, codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_MISMATCH)
		_, err = update("", cref("c1", ""))
		wantStatus(t, err, codes.InvalidArgument, sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_REQUEST)
	})
	t.Run("an invalid set changes nothing", func(t *testing.T) {
		before := b.Activation.Containers()
		for _, cs := range [][]*sandboxstatsv1.ContainerRef{
			{cref("a", ""), cref("a", "again")},
			{cref("", "noid")},
			{cref(strings.Repeat("i", 129), "")},
			{cref("a", "new\nline")},
		} {
			_, err := update("actor-a", cs...)
			wantStatus(t, err, codes.InvalidArgument, sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_REQUEST)
		}
		if diff := cmp.Diff(before, b.Activation.Containers()); diff != "" {
			t.Errorf("a refused update changed the set (-want +got):\n%s", diff)
		}
	})
	t.Run("a Run repeated with another set updates it, same epoch", func(t *testing.T) {
		again := &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: "/statstest",
			Containers: []*sandboxstatsv1.ContainerRef{cref("4c1e0f", "renamed")}}
		if e := h.run(t, identA, again); e != epoch || h.store.Bound("actor-a") != b || h.opens.Load() != 1 {
			t.Fatalf("epoch %d (want %d), binding kept %v, opens %d", e, epoch, h.store.Bound("actor-a") == b, h.opens.Load())
		}
		if diff := cmp.Diff([]source.ContainerRef{{ID: "4c1e0f", Name: "renamed"}}, b.Activation.Containers()); diff != "" {
			t.Errorf("set (-want +got):\n%s", diff)
		}
	})
	t.Run("a container gone keeps its last CPU, in samples and the final", func(t *testing.T) {
		h.src.set(gvContainers(2_500_000, gvCtr("4c1e0f", 1_300_000)), nil)
		s, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
		if err != nil {
			t.Fatal(err)
		}
		want := &sandboxstatsv1.ContainerStats{Id: "9b27aa", Name: "sidecar", CpuUsageUsec: cpuUsec(100_000), Exited: true,
			Absent: []*sandboxstatsv1.AbsentValue{{Field: "memory_current_bytes", Reason: identity.ReasonExited},
				{Field: "memory_working_set_bytes", Reason: identity.ReasonExited}, {Field: "pids_current", Reason: identity.ReasonExited}}}
		cs := s.GetSample().GetContainers()
		if len(cs) != 2 || cs[0].GetExited() || cs[0].GetName() != "renamed" {
			t.Fatalf("containers %v", cs)
		}
		if diff := cmp.Diff(want, cs[1], protocmp.Transform()); diff != "" {
			t.Errorf("the exited container (-want +got):\n%s", diff)
		}
		h.src.set(source.Reading{}, source.ErrNotMeasurable) // the final is the last good poll: it still carries it
		resp, err := h.lifecycle.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a"})
		if err != nil {
			t.Fatal(err)
		}
		fcs := resp.GetEnded().GetFinal().GetContainers()
		if len(fcs) != 2 {
			t.Fatalf("final containers %v", fcs)
		}
		if diff := cmp.Diff(want, fcs[1], protocmp.Transform()); diff != "" {
			t.Errorf("the final's exited container (-want +got):\n%s", diff)
		}
	})
}

// TestContainerSetSurvivesRestart: statsd restarted (a new store on the same
// state directory) keeps the set and the exited containers.
func TestContainerSetSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	h := newHarness(t, func(c *identity.Config) { c.StateDir = dir })
	ref := &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: "/statstest",
		Containers: []*sandboxstatsv1.ContainerRef{cref("4c1e0f", "app"), cref("9b27aa", "sidecar")}}
	epoch := h.run(t, identA, ref)
	h.src.set(gvContainers(1_000_000, gvCtr("4c1e0f", 600_000), gvCtr("9b27aa", 40_000)), nil)
	if _, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"}); err != nil {
		t.Fatal(err)
	}
	h.src.set(gvContainers(1_500_000, gvCtr("4c1e0f", 1_000_000)), nil)
	if _, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.lifecycle.UpdateWorkloadContainers(ctx, &sandboxstatsv1.UpdateWorkloadContainersRequest{ActorUid: "actor-a",
		Containers: []*sandboxstatsv1.ContainerRef{cref("4c1e0f", "web")}}); err != nil {
		t.Fatal(err)
	}
	// The exit a read found is written in the background.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(dir, "binding.json"))
		if strings.Contains(string(b), `"9b27aa"`) && strings.Contains(string(b), `"exited"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("binding.json has no exited container: %s", b)
		}
	}
	h.store.Close()

	h2 := newHarness(t, func(c *identity.Config) { c.StateDir = dir })
	h2.src.set(gvContainers(1_800_000, gvCtr("4c1e0f", 1_200_000)), nil)
	s, err := h2.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		ID, Name string
		CPU      uint64
		Exited   bool
	}
	var got []row
	for _, c := range s.GetSample().GetContainers() {
		got = append(got, row{c.GetId(), c.GetName(), c.GetCpuUsageUsec(), c.GetExited()})
	}
	want := []row{{"4c1e0f", "web", 1_200_000, false}, {"9b27aa", "sidecar", 40_000, true}}
	if diff := cmp.Diff(want, got); diff != "" || s.GetSample().GetEpochUnixNano() != epoch {
		t.Errorf("after a restart (-want +got):\n%s epoch %d, want %d", diff, s.GetSample().GetEpochUnixNano(), epoch)
	}
}

// TestKataUpdateMidActivation: the guest-agent fake with three containers
// (busy, kernel-heavy, idle) behind the real micro-VM source. An update
// drops the idle one and adds a fourth mid-activation: the dropped one
// keeps its last CPU (user and system too) in every later sample and the
// final, the sample's CPU sum with it; the added one is read from the next
// sample on, its whole counter its own (it started in the activation); the
// epoch, the baseline and the connection stay.
func TestKataUpdateMidActivation(t *testing.T) {
	ctx := context.Background()
	c := func(total, user, system uint64) kataagentfake.Container {
		return kataagentfake.Container{UsageBytes: 8 << 20, CPUTotal: total * 1000, CPUUser: user * 1000, CPUSystem: system * 1000, Pids: 1}
	}
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithVersion("4.1.0"),
		kataagentfake.WithContainer("busy", kataagentfake.V2(c(2_500_000, 2_400_000, 100_000))),
		kataagentfake.WithContainer("kernel", kataagentfake.V2(c(500_000, 100_000, 400_000))),
		kataagentfake.WithContainer("idle", kataagentfake.V2(c(7_000, 4_000, 3_000))),
		kataagentfake.WithContainer("added", kataagentfake.V2(c(30_000, 20_000, 10_000))))
	h := newHarness(t, func(cfg *identity.Config) {
		cfg.BaselineRetry = time.Millisecond
		cfg.Open = func(ref source.SandboxRef) (source.Source, source.HostSampler, error) {
			src, err := microvm.Open(ref, microvm.Config{})
			return src, nil, err
		}
	})
	ref := &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM, AgentAddress: agent.Address(),
		Containers: []*sandboxstatsv1.ContainerRef{cref("busy", "app"), cref("kernel", "indexer"), cref("idle", "init")}}
	h.runWithBaseline(t, ref, false)
	stats := func() *sandboxstatsv1.WorkloadStatsSample {
		t.Helper()
		s, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
		if err != nil {
			t.Fatal(err)
		}
		return s.GetSample()
	}
	first := stats()
	if first.GetCpuUsageUsec() != 3_007_000 || len(first.GetContainers()) != 3 {
		t.Fatalf("before: cpu %d, %d containers", first.GetCpuUsageUsec(), len(first.GetContainers()))
	}
	if _, err := h.lifecycle.UpdateWorkloadContainers(ctx, &sandboxstatsv1.UpdateWorkloadContainersRequest{ActorUid: "actor-a",
		Containers: []*sandboxstatsv1.ContainerRef{cref("busy", "app"), cref("kernel", "indexer"), cref("added", "sidecar")}}); err != nil {
		t.Fatal(err)
	}
	// The idle container's cgroup goes on counting in the guest (it is no
	// longer asked): its figure stays the last read.
	agent.SetContainer("idle", kataagentfake.V2(c(900_000, 800_000, 100_000)))
	agent.SetContainer("busy", kataagentfake.V2(c(3_000_000, 2_850_000, 150_000)))

	type row struct {
		ID, Name          string
		CPU, User, System uint64
		Exited, HasMemory bool
	}
	rows := func(s *sandboxstatsv1.WorkloadStatsSample) []row {
		var out []row
		for _, c := range s.GetContainers() {
			out = append(out, row{c.GetId(), c.GetName(), c.GetCpuUsageUsec(), c.GetCpuUserUsec(), c.GetCpuSystemUsec(), c.GetExited(), c.MemoryCurrentBytes != nil})
		}
		return out
	}
	want := []row{
		{"busy", "app", 3_000_000, 2_850_000, 150_000, false, true},
		{"kernel", "indexer", 500_000, 100_000, 400_000, false, true},
		{"added", "sidecar", 30_000, 20_000, 10_000, false, true},
		{"idle", "init", 7_000, 4_000, 3_000, true, false},
	}
	for i := range 2 {
		s := stats()
		if diff := cmp.Diff(want, rows(s)); diff != "" {
			t.Errorf("sample %d after the update (-want +got):\n%s", i, diff)
		}
		if s.GetCpuUsageUsec() != 3_537_000 || s.GetEpochUnixNano() != first.GetEpochUnixNano() {
			t.Errorf("sample %d: cpu %d (want 3537000: the containers' sum, the exited one's kept), epoch %d (want %d)",
				i, s.GetCpuUsageUsec(), s.GetEpochUnixNano(), first.GetEpochUnixNano())
		}
	}
	if accepted, _, _, _ := agent.Counts(); accepted != 1 {
		t.Errorf("%d connections: the update reopened the source", accepted)
	}
	resp, err := h.lifecycle.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, rows(resp.GetEnded().GetFinal())); diff != "" {
		t.Errorf("the final (-want +got):\n%s", diff)
	}
	// The activation's own CPU: the final's sum less the baseline's (taken
	// before the update, with the idle container's 7 ms in it).
	if got := resp.GetEnded().GetCpuUsec(); got != 3_537_000-3_007_000 {
		t.Errorf("the activation's CPU %d, want %d", got, 3_537_000-3_007_000)
	}
}

// TestFoldExitedKeepsSums: the cut that folds a sample's exited containers
// keeps the live ones as they were and the exited ones' counter sums, in
// identity's shape (fixed name, the count in the gauges' reason), the count
// of an entry identity folded already included.
func TestFoldExitedKeepsSums(t *testing.T) {
	live := &sandboxstatsv1.ContainerStats{Id: "app", CpuUsageUsec: cpuUsec(900)}
	s := &sandboxstatsv1.WorkloadStatsSample{Containers: []*sandboxstatsv1.ContainerStats{
		live,
		{Id: identity.FoldedExitedID, Name: identity.FoldedExitedID, Exited: true, CpuUsageUsec: cpuUsec(30), CpuUserUsec: cpuUsec(20),
			Absent: []*sandboxstatsv1.AbsentValue{{Field: "memory_current_bytes", Reason: identity.FoldedReason(2)}}},
		{Id: "init", Exited: true, CpuUsageUsec: cpuUsec(7)},
		{Id: "gone", Exited: true},
	}}
	if n := foldExited(cutParts{samples: []*sandboxstatsv1.WorkloadStatsSample{s}}); n != 2 {
		t.Errorf("folded %d entries away, want 2", n)
	}
	four := identity.FoldedReason(4)
	exited := []*sandboxstatsv1.AbsentValue{{Field: "memory_current_bytes", Reason: four},
		{Field: "memory_working_set_bytes", Reason: four}, {Field: "pids_current", Reason: four}}
	want := []*sandboxstatsv1.ContainerStats{live, {Id: identity.FoldedExitedID, Name: identity.FoldedExitedID, Exited: true,
		CpuUsageUsec: cpuUsec(37), CpuUserUsec: cpuUsec(20),
		Absent: append([]*sandboxstatsv1.AbsentValue{{Field: "cpu_system_usec", Reason: "none of the folded containers had it"}}, exited...)}}
	if diff := cmp.Diff(want, s.GetContainers(), protocmp.Transform()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
