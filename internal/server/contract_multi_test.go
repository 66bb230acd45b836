package server

// The contract with several workloads bound to one statsd: each read answers
// for the named actor only, each lifecycle call touches its actor only, and
// one workload's hung or flooding source costs the others nothing.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// fleet is a harness whose Run opens, for each cgroup path, a source of its
// own: actor i's sandbox reads i MiB and i ms of CPU, so a number tells
// whose it is.
type fleet struct {
	*harness
	mu   sync.Mutex
	srcs map[string]*fakeSource
	// opens, when set, opens a ref instead of its own fakeSource.
	opens func(source.SandboxRef) source.Source
}

func newFleet(t testing.TB, with ...func(*identity.Config)) *fleet {
	f := &fleet{srcs: map[string]*fakeSource{}}
	// Bindings a restarted store restores open their own sources too.
	own := func(c *identity.Config) {
		c.Open = func(ref source.SandboxRef) (source.Source, source.HostSampler, error) {
			if f.opens != nil {
				return f.opens(ref), nil, nil
			}
			return f.src(ref.CgroupPath), nil, nil
		}
	}
	f.harness = newHarness(t, append(with, own)...)
	return f
}

// src is the source of the sandbox at path (made on first use).
func (f *fleet) src(path string) *fakeSource {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.srcs[path] == nil {
		i := actorIndex(path)
		r := cgroupRdg
		r.MemoryCurrentBytes, r.MemoryWorkingSetBytes, r.CPUUsageUsec = uint64(i)<<20, uint64(i)<<20, cpuUsec(uint64(i)*1000)
		f.srcs[path] = &fakeSource{reading: r}
	}
	return f.srcs[path]
}

// actorIndex is i of "/pod/actor-<i>-_pause" or "actor-<i>".
func actorIndex(s string) int {
	var i int
	s = strings.TrimPrefix(s, "/pod/")
	fmt.Sscanf(s, "actor-%d", &i)
	return i
}

func fleetID(i int) *sandboxstatsv1.WorkloadIdentity {
	return &sandboxstatsv1.WorkloadIdentity{ActorUid: fmt.Sprintf("actor-%d", i), TemplateNamespace: "tns", TemplateName: "tpl"}
}

// fleetRef is actor i's sandbox in the upstream layout.
func fleetRef(i int) *sandboxstatsv1.SandboxRef {
	return &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: fmt.Sprintf("/pod/actor-%d-_pause", i)}
}

// wantOwn fails unless s is actor i's own sample: its identity and its
// sandbox's numbers.
func wantOwn(t *testing.T, i int, s *sandboxstatsv1.WorkloadStatsSample) {
	t.Helper()
	if s.GetActorUid() != fleetID(i).GetActorUid() || s.GetMemoryCurrentBytes() != uint64(i)<<20 || s.GetCpuUsageUsec() != uint64(i)*1000 {
		t.Fatalf("sample for actor-%d: actor %q, %d bytes, %d us: not its own", i, s.GetActorUid(), s.GetMemoryCurrentBytes(), s.GetCpuUsageUsec())
	}
}

func activeActors(r *sandboxstatsv1.StatsActiveWorkloadsResponse) (samples, pending []string) {
	for _, s := range r.GetSamples() {
		samples = append(samples, s.GetActorUid())
	}
	for _, p := range r.GetPending() {
		pending = append(pending, p.GetIdentity().GetActorUid()+" "+p.GetReason().String())
	}
	return samples, pending
}

func TestSeveralWorkloadsContract(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, func(c *identity.Config) { c.MaxWorkloads = 4 })
	epochs := map[int]int64{}
	for i := 1; i <= 4; i++ {
		epochs[i] = f.run(t, fleetID(i), fleetRef(i))
	}

	t.Run("keyed read of each answers its own numbers", func(t *testing.T) {
		for i := 1; i <= 4; i++ {
			resp, err := f.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: fleetID(i).GetActorUid()})
			if err != nil {
				t.Fatal(err)
			}
			wantOwn(t, i, resp.GetSample())
			if resp.GetSample().GetEpochUnixNano() != epochs[i] {
				t.Fatalf("actor-%d: epoch %d, want %d", i, resp.GetSample().GetEpochUnixNano(), epochs[i])
			}
		}
	})
	t.Run("an actor not bound is ACTOR_MISMATCH beside others", func(t *testing.T) {
		_, err := f.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-9"})
		wantStatus(t, err, codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_MISMATCH)
		_, err = f.client.StatsHost(ctx, &sandboxstatsv1.StatsHostRequest{ActorUid: "actor-9"})
		wantStatus(t, err, codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_MISMATCH)
	})
	t.Run("StatsHost per actor", func(t *testing.T) {
		for i := 1; i <= 4; i++ {
			resp, err := f.client.StatsHost(ctx, &sandboxstatsv1.StatsHostRequest{ActorUid: fleetID(i).GetActorUid()})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetIdentity().GetActorUid() != fleetID(i).GetActorUid() || resp.GetEpochUnixNano() != epochs[i] {
				t.Fatalf("StatsHost of actor-%d answered %v", i, resp.GetIdentity())
			}
		}
	})
	t.Run("discovery read: one sample per binding, sorted", func(t *testing.T) {
		resp, err := f.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetSamples()) != 4 || len(resp.GetPending()) != 0 || resp.GetNoSampleReason() != 0 {
			t.Fatalf("answer: %v", resp)
		}
		for k, s := range resp.GetSamples() {
			wantOwn(t, k+1, s)
		}
	})
	t.Run("over the ceiling is RESOURCE_EXHAUSTED and changes nothing", func(t *testing.T) {
		_, err := f.lifecycle.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{Identity: fleetID(5), Sandbox: fleetRef(5)})
		wantStatus(t, err, codes.ResourceExhausted, sandboxstatsv1.ErrorReason_ERROR_REASON_TOO_MANY_WORKLOADS)
		_, err = f.lifecycle.RestoreWorkload(ctx, &sandboxstatsv1.RestoreWorkloadRequest{Identity: fleetID(5), Sandbox: fleetRef(5)})
		wantStatus(t, err, codes.ResourceExhausted, sandboxstatsv1.ErrorReason_ERROR_REASON_TOO_MANY_WORKLOADS)
		if n := len(f.store.Bindings()); n != 4 {
			t.Fatalf("%d bound after a refused Run", n)
		}
	})
	t.Run("the same sandbox for another actor is WORKLOAD_BOUND", func(t *testing.T) {
		for _, ref := range []*sandboxstatsv1.SandboxRef{
			fleetRef(2),
			{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: fleetRef(3).GetCgroupPath(), VmmPid: 9},
		} {
			_, err := f.lifecycle.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{Identity: fleetID(1), Sandbox: ref})
			wantStatus(t, err, codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_WORKLOAD_BOUND)
		}
		if b := f.store.Bound("actor-1"); b == nil || b.EpochUnixNano != epochs[1] {
			t.Fatal("a refused Run changed actor-1's binding")
		}
	})
	t.Run("an identical Run is a retry", func(t *testing.T) {
		if epoch := f.run(t, fleetID(3), fleetRef(3)); epoch != epochs[3] {
			t.Fatalf("retry epoch %d, want %d", epoch, epochs[3])
		}
	})
	t.Run("restore of one starts its new epoch only", func(t *testing.T) {
		resp, err := f.lifecycle.RestoreWorkload(ctx, &sandboxstatsv1.RestoreWorkloadRequest{Identity: fleetID(2), Sandbox: fleetRef(2)})
		if err != nil {
			t.Fatal(err)
		}
		if r := resp.GetReplaced(); r.GetIdentity().GetActorUid() != "actor-2" || r.GetEpochUnixNano() != epochs[2] ||
			r.GetOutcome() != sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_REPLACED || r.GetFinal().GetCpuUsageUsec() != 2000 {
			t.Fatalf("replaced = %v", r)
		}
		epochs[2] = resp.GetEpochUnixNano()
		for i := 1; i <= 4; i++ {
			if b := f.store.Bound(fleetID(i).GetActorUid()); b.EpochUnixNano != epochs[i] {
				t.Fatalf("actor-%d epoch %d, want %d", i, b.EpochUnixNano, epochs[i])
			}
		}
	})
	t.Run("checkpoint of one ends it only; a retry returns the same record", func(t *testing.T) {
		resp, err := f.lifecycle.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-3"})
		if err != nil {
			t.Fatal(err)
		}
		e := resp.GetEnded()
		if e.GetIdentity().GetActorUid() != "actor-3" || e.GetFinal().GetCpuUsageUsec() != 3000 || e.GetEpochUnixNano() != epochs[3] {
			t.Fatalf("ended = %v", e)
		}
		again, err := f.lifecycle.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-3"})
		if err != nil || !proto.Equal(again.GetEnded(), e) {
			t.Fatalf("retry = %v, %v; want the same record", again.GetEnded(), err)
		}
		_, err = f.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-3"})
		wantStatus(t, err, codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_MISMATCH)
		active, err := f.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		samples, _ := activeActors(active)
		if diff := cmp.Diff([]string{"actor-1", "actor-2", "actor-4"}, samples); diff != "" {
			t.Fatalf("samples after the checkpoint (-want +got):\n%s", diff)
		}
		var ended []string
		for _, e := range active.GetEnded() {
			ended = append(ended, e.GetIdentity().GetActorUid()+" "+e.GetOutcome().String())
		}
		if diff := cmp.Diff([]string{"actor-2 ACTIVATION_OUTCOME_REPLACED", "actor-3 ACTIVATION_OUTCOME_CHECKPOINTED"}, ended); diff != "" {
			t.Fatalf("ended beside the samples (-want +got):\n%s", diff)
		}
		list, err := f.client.ListEndedActivations(ctx, &sandboxstatsv1.ListEndedActivationsRequest{})
		if err != nil || len(list.GetEnded()) != 2 {
			t.Fatalf("ListEndedActivations = %v, %v", list, err)
		}
	})
	t.Run("every binding checkpointed: NO_WORKLOAD", func(t *testing.T) {
		for _, i := range []int{1, 2, 4} {
			if _, err := f.lifecycle.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: fleetID(i).GetActorUid()}); err != nil {
				t.Fatal(err)
			}
		}
		_, err := f.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-1"})
		wantStatus(t, err, codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_NO_WORKLOAD)
		_, err = f.lifecycle.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-9"})
		wantStatus(t, err, codes.FailedPrecondition, sandboxstatsv1.ErrorReason_ERROR_REASON_NO_WORKLOAD)
	})
}

// TestSeveralWorkloadsRestart: a statsd restarted on the same state finds
// every binding, each answering its own numbers in its own epoch.
func TestSeveralWorkloadsRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	withDir := func(c *identity.Config) { c.StateDir = dir }
	f := newFleet(t, withDir)
	epochs := map[int]int64{}
	for i := 1; i <= 3; i++ {
		epochs[i] = f.run(t, fleetID(i), fleetRef(i))
	}
	f.store.Close()

	g := newFleet(t, withDir)
	resp, err := g.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetSamples()) != 3 {
		t.Fatalf("after restart: %v", resp)
	}
	for k, s := range resp.GetSamples() {
		wantOwn(t, k+1, s)
		if s.GetEpochUnixNano() != epochs[k+1] {
			t.Fatalf("actor-%d epoch %d after restart, want %d", k+1, s.GetEpochUnixNano(), epochs[k+1])
		}
	}
}

// TestHungNeighbourCostsNothing: one workload's reads hang (a guest agent
// that stopped answering); the others' keyed reads answer at once, and the
// discovery read answers in the caller's time with their samples and the
// hung one pending.
// hungFleet is a fleet with a 2 s read timeout and actors 1 to n bound,
// actor-2's source hung (each read runs to its bound).
func hungFleet(t *testing.T, n int) *fleet {
	f := newFleet(t, func(c *identity.Config) { c.ReadTimeout = 2 * time.Second })
	hung := &blockingSource{block: make(chan struct{})}
	close(hung.block)
	f.opens = func(ref source.SandboxRef) source.Source {
		if actorIndex(ref.CgroupPath) == 2 {
			return hung
		}
		return f.src(ref.CgroupPath)
	}
	for i := 1; i <= n; i++ {
		f.run(t, fleetID(i), fleetRef(i))
	}
	return f
}

func TestHungNeighbourCostsNothing(t *testing.T) {
	ctx := context.Background()
	f := hungFleet(t, 4)
	// The hung read of actor-2 in flight while the others are read.
	hungCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	go f.client.StatsWorkload(hungCtx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-2"})
	for _, i := range []int{1, 3, 4} {
		start := time.Now()
		resp, err := f.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: fleetID(i).GetActorUid()})
		if err != nil {
			t.Fatal(err)
		}
		wantOwn(t, i, resp.GetSample())
		if took := time.Since(start); took > 100*time.Millisecond {
			t.Fatalf("actor-%d's read took %s beside a hung neighbour", i, took)
		}
	}
	pollCtx, pollCancel := context.WithTimeout(ctx, 400*time.Millisecond)
	defer pollCancel()
	start := time.Now()
	resp, err := f.client.StatsActiveWorkloads(pollCtx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil {
		t.Fatalf("discovery read beside a hung neighbour: %v", err)
	}
	if took := time.Since(start); took > 350*time.Millisecond {
		t.Errorf("discovery read took %s of the caller's 400 ms", took)
	}
	samples, pending := activeActors(resp)
	if diff := cmp.Diff([]string{"actor-1", "actor-3", "actor-4"}, samples); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"actor-2 ERROR_REASON_READ_TIMEOUT"}, pending); diff != "" {
		t.Errorf("pending (-want +got):\n%s", diff)
	}
}

// TestAnswerSharedFairly: a flooding guest (every sample at its 24 KiB cap)
// among many workloads cannot push the others out of the discovery answer:
// each keeps its whole sample, the flooders are cut to their share, each
// cut named, and the answer stays within its page.
func TestAnswerSharedFairly(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, func(c *identity.Config) { c.MaxWorkloads = identity.LimitMaxWorkloads })
	flood := func(i int) *fakeSource {
		r := cgroupRdg
		r.MemoryCurrentBytes, r.MemoryWorkingSetBytes, r.CPUUsageUsec = uint64(i)<<20, uint64(i)<<20, cpuUsec(uint64(i)*1000)
		r.Network = &source.Network{Layer: source.NetworkLayerHostNamespace, Total: &source.InterfaceCounters{Name: "total"}}
		for k := range 2000 {
			r.Network.Interfaces = append(r.Network.Interfaces, source.InterfaceCounters{Name: fmt.Sprintf("veth%011d", k), RxBytes: 1 << 40})
		}
		return &fakeSource{reading: r}
	}
	for _, tc := range []struct {
		name     string
		bindings int
		flooders []int
	}{
		{"one flooder among 8", 8, []int{3}},
		{"4 flooders among 32", 32, []int{1, 9, 17, 30}},
		{"every one of 64 floods", 64, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, b := range f.store.Bindings() {
				if _, err := f.store.Release(ctx, b.Identity.ActorUID); err != nil {
					t.Fatal(err)
				}
			}
			f.mu.Lock()
			clear(f.srcs)
			for i := 1; i <= tc.bindings; i++ {
				if tc.flooders == nil || slices.Contains(tc.flooders, i) {
					f.srcs[fleetRef(i).GetCgroupPath()] = flood(i)
				}
			}
			f.mu.Unlock()
			for i := 1; i <= tc.bindings; i++ {
				f.run(t, fleetID(i), fleetRef(i))
			}
			resp, err := f.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if size := proto.Size(resp); size > maxResponseBytes {
				t.Fatalf("answer of %d bytes, over %d", size, maxResponseBytes)
			}
			if n := len(resp.GetSamples()) + len(resp.GetPending()); n != tc.bindings {
				t.Fatalf("%d samples and pending entries, want one per binding (%d)", n, tc.bindings)
			}
			var cut int
			for _, s := range resp.GetSamples() {
				i := actorIndex(s.GetActorUid())
				wantOwn(t, i, s)
				named := slices.ContainsFunc(s.GetAbsent(), func(a *sandboxstatsv1.AbsentValue) bool {
					return strings.HasPrefix(a.GetReason(), cutPrefix)
				})
				flooder := tc.flooders == nil || slices.Contains(tc.flooders, i)
				switch {
				case !flooder && (named || len(s.GetAbsent()) != 0):
					t.Fatalf("actor-%d (quiet) was cut: %v", i, s.GetAbsent())
				case flooder && !named:
					t.Fatalf("actor-%d (flooding) kept %d interfaces without a cut named", i, len(s.GetNetwork().GetInterfaces()))
				case flooder:
					cut++
				}
			}
			for _, p := range resp.GetPending() {
				if p.GetReason() != sandboxstatsv1.ErrorReason_ERROR_REASON_ANSWER_FULL || !strings.HasPrefix(p.GetDetail(), "cut: ") {
					t.Fatalf("pending %v", p)
				}
			}
			t.Logf("%d bindings: %d samples (%d with a cut named), %d pending ANSWER_FULL, %d bytes",
				tc.bindings, len(resp.GetSamples()), cut, len(resp.GetPending()), proto.Size(resp))
		})
	}
}

// TestConcurrentActorsRace runs Run, Restore and Checkpoint of different
// actors against keyed and discovery reads (with -race): every sample
// answered carries the numbers of the actor it names, never another's.
func TestConcurrentActorsRace(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, func(c *identity.Config) { c.MaxWorkloads = 6 })
	var wg sync.WaitGroup
	for i := 1; i <= 6; i++ {
		wg.Go(func() {
			for n := range 30 {
				var err error
				switch n % 3 {
				case 0:
					_, err = f.lifecycle.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{Identity: fleetID(i), Sandbox: fleetRef(i)})
				case 1:
					_, err = f.lifecycle.RestoreWorkload(ctx, &sandboxstatsv1.RestoreWorkloadRequest{Identity: fleetID(i), Sandbox: fleetRef(i)})
				case 2:
					_, err = f.lifecycle.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: fleetID(i).GetActorUid()})
				}
				if err != nil {
					t.Errorf("actor-%d call %d: %v", i, n, err)
				}
			}
		})
		wg.Go(func() {
			for range 60 {
				resp, err := f.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: fleetID(i).GetActorUid()})
				if err == nil {
					wantOwn(t, i, resp.GetSample())
				}
			}
		})
	}
	wg.Go(func() {
		for range 60 {
			resp, err := f.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
			if err != nil {
				t.Errorf("discovery read: %v", err)
				return
			}
			for _, s := range resp.GetSamples() {
				wantOwn(t, actorIndex(s.GetActorUid()), s)
				for _, e := range resp.GetEnded() {
					if e.GetIdentity().GetActorUid() == s.GetActorUid() && e.GetEpochUnixNano() == s.GetEpochUnixNano() {
						t.Errorf("a sample beside its own record: %s epoch %d", s.GetActorUid(), s.GetEpochUnixNano())
					}
				}
			}
		}
	})
	wg.Wait()
}
