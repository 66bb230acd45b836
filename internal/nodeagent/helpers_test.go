package nodeagent

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

type bytesBuffer = bytes.Buffer

// golden compares got with testdata/name, rewriting it under -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", path, diff)
	}
}

// sample is a measured cgroup sample of actor in one fixed epoch.
func sample(actor string, cpuUsec, memCur uint64) *sandboxstatsv1.WorkloadStatsSample {
	return &sandboxstatsv1.WorkloadStatsSample{
		ActorUid:              actor,
		ActorName:             actor + "-name",
		ActorNamespace:        "team-a",
		TemplateNamespace:     "templates",
		TemplateName:          "python",
		SandboxClass:          sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR,
		Source:                sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP,
		MemoryCurrentBytes:    memCur,
		MemoryWorkingSetBytes: memCur / 2,
		MemoryPeakBytes:       proto.Uint64(memCur * 2),
		CpuUsageUsec:          proto.Uint64(cpuUsec),
		EpochUnixNano:         time.Date(2026, 11, 29, 16, 0, 0, 0, time.UTC).UnixNano(),
	}
}
