package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

func floodingSource(i, n int) *fakeSource {
	r := cgroupRdg
	r.MemoryCurrentBytes, r.MemoryWorkingSetBytes, r.CPUUsageUsec = uint64(i)<<20, uint64(i)<<20, cpuUsec(uint64(i)*1000)
	r.Network = &source.Network{Layer: source.NetworkLayerHostNamespace, Total: &source.InterfaceCounters{Name: "total"}}
	for k := range n {
		r.Network.Interfaces = append(r.Network.Interfaces, source.InterfaceCounters{Name: fmt.Sprintf("veth%011d", k), RxBytes: 1 << 40})
	}
	return &fakeSource{reading: r}
}

// floodingSource is actor i's sandbox reporting n interfaces.

// TestActiveAnswerBoundedWithALargeEndedRecord: the first ended record goes
// into every discovery answer whatever its size (a flooder's, its final at
// the 24 KiB cap); the samples leave room for it. Before, they left 8 KiB
// and the answer was 69,156 bytes.
func TestActiveAnswerBoundedWithALargeEndedRecord(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, func(c *identity.Config) { c.MaxWorkloads = 16 })
	f.mu.Lock()
	for i := 1; i <= 3; i++ {
		f.srcs[fleetRef(i).GetCgroupPath()] = floodingSource(i, 880)
	}
	f.mu.Unlock()
	f.run(t, fleetID(1), fleetRef(1))
	if _, err := f.store.Release(ctx, "actor-1"); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 3; i++ {
		f.run(t, fleetID(i), fleetRef(i))
	}
	resp, err := f.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range resp.GetSamples() {
		t.Logf("sample %s: %d bytes, %d absent", x.GetActorUid(), proto.Size(x), len(x.GetAbsent()))
	}
	for _, x := range resp.GetEnded() {
		t.Logf("ended %s: %d bytes", x.GetIdentity().GetActorUid(), proto.Size(x))
	}
	t.Logf("%d samples, %d pending, %d ended, %d bytes", len(resp.GetSamples()), len(resp.GetPending()), len(resp.GetEnded()), proto.Size(resp))
	if size := proto.Size(resp); size > maxResponseBytes {
		t.Fatalf("answer of %d bytes, over %d", size, maxResponseBytes)
	}
}

// TestActiveAnswerBoundedWithLongPending: 64 workloads with the longest
// valid identities whose reads fail with long errors: their pending entries
// are cut (details, then identities to the actor uid, each cut said) to
// half the page. Before, 32 of them made an answer of 70,343 bytes.
func TestActiveAnswerBoundedWithLongPending(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, func(c *identity.Config) { c.MaxWorkloads = identity.LimitMaxWorkloads })
	f.opens = func(ref source.SandboxRef) source.Source {
		return &fakeSource{err: fmt.Errorf("%w: open %s/cpu.stat: no such file or directory", source.ErrNotMeasurable, ref.CgroupPath)}
	}
	long := strings.Repeat("n", 253)
	for i := 1; i <= identity.LimitMaxWorkloads; i++ {
		id := &sandboxstatsv1.WorkloadIdentity{ActorUid: fmt.Sprintf("actor-%d-%s", i, strings.Repeat("u", 100)), ActorName: long, ActorNamespace: long, TemplateNamespace: long, TemplateName: long}
		ref := &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: fmt.Sprintf("/pod/actor-%d/%s", i, strings.Repeat("p", 1500))}
		f.run(t, id, ref)
	}
	resp, err := f.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d samples, %d pending, %d bytes", len(resp.GetSamples()), len(resp.GetPending()), proto.Size(resp))
	if size := proto.Size(resp); size > maxResponseBytes {
		t.Fatalf("answer of %d bytes, over %d", size, maxResponseBytes)
	}
	if n := len(resp.GetPending()); n != identity.LimitMaxWorkloads {
		t.Fatalf("%d pending, want every workload (%d)", n, identity.LimitMaxWorkloads)
	}
	for _, p := range resp.GetPending() {
		if !strings.HasPrefix(p.GetIdentity().GetActorUid(), "actor-") || !strings.HasPrefix(p.GetDetail(), "cut: ") {
			t.Fatalf("pending %v: the actor uid kept and the cut said", p)
		}
	}
}

type hungSource struct{}

func (hungSource) Sample(ctx context.Context) (source.Reading, error) {
	<-ctx.Done()
	return source.Reading{}, fmt.Errorf("%w: %w", source.ErrTimeout, ctx.Err())
}
func (hungSource) Close() error { return nil }

// okSource answers at once, like a bounded read, unless its ctx is done.
type okSource struct{}

func (okSource) Sample(ctx context.Context) (source.Reading, error) {
	if err := ctx.Err(); err != nil {
		return source.Reading{}, fmt.Errorf("%w: %w", source.ErrTimeout, err)
	}
	return cgroupRdg, nil
}
func (okSource) Close() error { return nil }

// TestHungHalfCostsTheOtherHalfNothing: 32 hung guests sorted before 32
// healthy ones. Every binding's read starts at once under its own bound,
// so the healthy ones all answer. Before, the hung ones held every slot of
// a fan-out of 32 for the shared bound and the healthy ones started with it
// spent: 0 samples.
func TestHungHalfCostsTheOtherHalfNothing(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, func(c *identity.Config) { c.MaxWorkloads = 64; c.ReadTimeout = 300 * time.Millisecond })
	f.opens = func(ref source.SandboxRef) source.Source {
		if strings.Contains(ref.CgroupPath, "hung") {
			return hungSource{}
		}
		return okSource{}
	}
	for i := range 32 {
		f.run(t, &sandboxstatsv1.WorkloadIdentity{ActorUid: fmt.Sprintf("a-%02d", i)}, &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: fmt.Sprintf("/pod/hung-%d", i)})
		f.run(t, &sandboxstatsv1.WorkloadIdentity{ActorUid: fmt.Sprintf("b-%02d", i)}, &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: fmt.Sprintf("/pod/ok-%d", i)})
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := f.client.StatsActiveWorkloads(rctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.GetSamples()); n != 32 {
		t.Errorf("%d samples of the 32 healthy workloads (pending %d, e.g. %v)", n, len(resp.GetPending()), resp.GetPending()[len(resp.GetPending())-1])
	}
}
