package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/microvm"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// worstRefID is the i-th container id of a set round: 128 bytes (a
// ContainerRef's cap), and worstName a 253-byte name (the names' cap).
func worstRefID(round, i int) string {
	p := fmt.Sprintf("r%d-c%02d-", round, i)
	return p + strings.Repeat("x", 128-len(p))
}

func worstName(round, i int) string {
	p := fmt.Sprintf("r%d-n%02d-", round, i)
	return p + strings.Repeat("n", 253-len(p))
}

// TestWorstCaseExitedContainers: the most containers a sample can carry, 25
// live and 25 exited (identity.MaxExited, the oldest folded), every id and
// name at its cap, the hostile guest's replies: every answer stays under
// its cap; a sample over 24 KiB folds its exited containers first (the
// live ones kept, the sum kept), and the exited list stays bounded across
// any number of updates.
func TestWorstCaseExitedContainers(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a 25-container fake agent through 4 set rounds")
	}
	ctx := context.Background()
	const rounds = 4 // 75 containers leave: 51 of them folded
	var opts []kataagentfake.Option
	for r := range rounds {
		for i := range worstContainers {
			opts = append(opts, kataagentfake.WithContainer(worstRefID(r, i), hostileReply()))
		}
	}
	agent := kataagentfake.New(t, t.TempDir(), opts...)
	h := newHarness(t, func(c *identity.Config) {
		c.EndedRetention = 1 << 62
		c.BaselineRetry = time.Millisecond
		c.StateDir = t.TempDir()
		c.Open = func(ref source.SandboxRef) (source.Source, source.HostSampler, error) {
			src, err := microvm.Open(ref, microvm.Config{})
			return src, nil, err
		}
	})
	set := func(r int) []*sandboxstatsv1.ContainerRef {
		var out []*sandboxstatsv1.ContainerRef
		for i := range worstContainers {
			out = append(out, cref(worstRefID(r, i), worstName(r, i)))
		}
		return out
	}
	ref := &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM, AgentAddress: agent.Address(), Containers: set(0)}
	h.runWithBaseline(t, ref, false)
	sizes := map[string]int{}
	var last *sandboxstatsv1.WorkloadStatsSample
	for r := range rounds {
		if r > 0 {
			if _, err := h.lifecycle.UpdateWorkloadContainers(ctx, &sandboxstatsv1.UpdateWorkloadContainersRequest{ActorUid: "actor-a", Containers: set(r)}); err != nil {
				t.Fatal(err)
			}
		}
		w, err := h.client.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-a"})
		if err != nil {
			t.Fatal(err)
		}
		sizes["one sample"] = max(sizes["one sample"], proto.Size(w.GetSample()))
		sizes["StatsWorkload"] = max(sizes["StatsWorkload"], proto.Size(w))
		last = w.GetSample()
	}
	a, err := h.client.StatsActiveWorkloads(ctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sizes["StatsActiveWorkloads"] = proto.Size(a)
	var live, exited int
	for _, c := range last.GetContainers() {
		if c.GetExited() {
			exited++
		} else {
			live++
		}
	}
	var cuts []string
	for _, x := range last.GetAbsent() {
		if strings.HasPrefix(x.GetReason(), cutPrefix) {
			cuts = append(cuts, x.GetField()+": "+x.GetReason())
		}
	}
	t.Logf("last sample: %d live, %d exited entries; cuts: %s", live, exited, strings.Join(cuts, " | "))
	if live != worstContainers || exited != 1 {
		t.Errorf("%d live and %d exited entries, want %d live and the exited folded into 1", live, exited, worstContainers)
	}
	f := last.GetContainers()[len(last.GetContainers())-1]
	if want := (rounds - 1) * worstContainers; f.GetId() != identity.FoldedExitedID || f.GetName() != identity.FoldedExitedID || foldedCount(f) != want {
		t.Errorf("the folded entry is %q %q holding %d, want %q (fixed name) holding %d", f.GetId(), f.GetName(), foldedCount(f), identity.FoldedExitedID, want)
	}
	resp, err := h.lifecycle.CheckpointWorkload(ctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: "actor-a"})
	if err != nil {
		t.Fatal(err)
	}
	sizes["CheckpointWorkload"] = proto.Size(resp)
	l, err := h.client.ListEndedActivations(ctx, &sandboxstatsv1.ListEndedActivationsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sizes["ListEndedActivations"] = proto.Size(l)
	for _, k := range []string{"one sample", "StatsWorkload", "StatsActiveWorkloads", "CheckpointWorkload", "ListEndedActivations"} {
		t.Logf("%-22s %8d bytes", k, sizes[k])
		if sizes[k] >= maxResponseBytes {
			t.Errorf("%s: %d bytes, not under %d", k, sizes[k], maxResponseBytes)
		}
	}
	if sizes["one sample"] > maxSampleBytes {
		t.Errorf("one sample: %d bytes, over its cap of %d", sizes["one sample"], maxSampleBytes)
	}
}
