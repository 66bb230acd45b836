package server

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestBaselineCache: a baseline's message is made once and shared (by
// baseline, identity, class and epoch), equals baselineToProto's, stays as
// it was when an answer holding it is cut (capSampleTo cuts a copy), and
// the cache stays within its bound.
func TestBaselineCache(t *testing.T) {
	var ifaces []source.InterfaceCounters
	for i := range 200 {
		ifaces = append(ifaces, source.InterfaceCounters{Name: fmt.Sprintf("eth%d-%s", i, strings.Repeat("x", 40)), RxBytes: uint64(i)})
	}
	cpu := uint64(5)
	first := source.Reading{Kind: source.KindGuestAgent, CPUUsageUsec: &cpu, Network: source.NewNetwork(source.NetworkLayerGuest, "test", ifaces)}
	b := &identity.Baseline{Kind: identity.BaselineFirstRead, AtUnixNano: 7, FirstRead: &first}
	id := identity.Identity{ActorUID: "a"}
	var c baselineCache

	m := c.of(b, id, source.ClassMicroVM, 1)
	if diff := cmp.Diff(baselineToProto(b, id, source.ClassMicroVM, 1), m, protocmp.Transform()); diff != "" {
		t.Errorf("cached message (-baselineToProto +cached):\n%s", diff)
	}
	if c.of(b, id, source.ClassMicroVM, 1) != m {
		t.Error("the same baseline made a second message")
	}
	for name, other := range map[string]*sandboxstatsv1.EpochBaseline{
		"another identity": c.of(b, identity.Identity{ActorUID: "b"}, source.ClassMicroVM, 1),
		"another epoch":    c.of(b, id, source.ClassMicroVM, 2),
		"another baseline": c.of(&identity.Baseline{Kind: identity.BaselineFirstRead, AtUnixNano: 7, FirstRead: &first}, id, source.ClassMicroVM, 1),
	} {
		if other == m {
			t.Errorf("%s: shared the message", name)
		}
	}
	if c.of(nil, id, source.ClassMicroVM, 1) != nil {
		t.Error("no baseline: want nil")
	}

	want := proto.Clone(m)
	s := &sandboxstatsv1.WorkloadStatsSample{ActorUid: "a", EpochBaseline: m}
	capSampleTo(s, 2048, "the sample")
	if n := len(s.GetEpochBaseline().GetFirstRead().GetNetwork().GetInterfaces()); n >= len(ifaces) {
		t.Fatalf("the first read kept %d interfaces: no cut made", n)
	}
	if diff := cmp.Diff(want, m, protocmp.Transform()); diff != "" {
		t.Errorf("a cut changed the shared message (-before +after):\n%s", diff)
	}
	if c.of(b, id, source.ClassMicroVM, 1) != m {
		t.Error("after the cut: another message")
	}

	for i := range 3 * maxCachedBaselines {
		c.of(&identity.Baseline{Kind: identity.BaselineEpochStart, AtUnixNano: int64(i)}, id, source.ClassGVisor, int64(i))
		if len(c.m) > maxCachedBaselines {
			t.Fatalf("%d entries, over the bound %d", len(c.m), maxCachedBaselines)
		}
	}
}
