package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/nodeagent"
	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestActivationLogStdout: with --activation-log - the agent writes one JSON
// line per ended activation to its standard output, once however many
// sweeps the daemon serves the record in, and nothing else there (its log
// goes to standard error).
func TestActivationLogStdout(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	restored := false
	restore := func() {
		if !restored {
			os.Stdout, restored = stdout, true
		}
	}
	t.Cleanup(restore)
	var out bytes.Buffer
	read := make(chan struct{})
	go func() {
		defer close(read)
		_, _ = out.ReadFrom(r)
	}()

	dir := t.TempDir()
	sock := filepath.Join(dir, "d1.sock")
	d := statsdfake.Start(t, sock)
	d.SetNoSample(sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD, "no workload is bound to this statsd")
	base, stop, logs := startAgent(t, "--sockets", filepath.Join(dir, "*.sock"), "--interval", "1s", "--min-interval", "100ms",
		"--timeout", "2s", "--activation-log", "-")
	restore() // run took os.Stdout before it said it serves

	now := time.Now()
	vm := &sandboxstatsv1.EndedActivation{ // begun before the agent started: logged, not charged
		Identity:     &sandboxstatsv1.WorkloadIdentity{ActorUid: "vm-1", ActorName: "alice", ActorNamespace: "team", TemplateNamespace: "tmpl", TemplateName: "py"},
		SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM, Source: sandboxstatsv1.StatsSource_STATS_SOURCE_GUEST_AGENT,
		EpochUnixNano: now.Add(-30 * time.Second).UnixNano(), EndUnixNano: now.UnixNano(),
		Outcome:         sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_CHECKPOINTED,
		FinalProvenance: sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_LAST_GOOD_POLL, FinalAgeNanos: 1_500_000_000,
		FinalReason: "read timed out: agent StatsContainer: context deadline exceeded",
		CpuUsec:     proto.Uint64(700_000), MemoryPeakBytes: proto.Uint64(64 << 20), MemoryPeakIsLowerBound: true,
		BaselineDelayNanos: 250_000_000,
	}
	gv := &sandboxstatsv1.EndedActivation{ // begun and ended between two sweeps: charged whole
		Identity:     &sandboxstatsv1.WorkloadIdentity{ActorUid: "gv-1", TemplateNamespace: "tmpl", TemplateName: "py"},
		SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, Source: sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP,
		EpochUnixNano: now.UnixNano(), EndUnixNano: now.Add(400 * time.Millisecond).UnixNano(),
		Outcome:         sandboxstatsv1.ActivationOutcome_ACTIVATION_OUTCOME_OOM_KILLED,
		FinalProvenance: sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_READ_AT_END,
		CpuUsec:         proto.Uint64(250_000), MemoryPeakBytes: proto.Uint64(128 << 20),
	}
	d.SetResponse(&sandboxstatsv1.StatsActiveWorkloadsResponse{NoSampleReason: sandboxstatsv1.NoSampleReason_NO_SAMPLE_REASON_NO_WORKLOAD,
		Ended: []*sandboxstatsv1.EndedActivation{vm, gv}})
	first := scrape(t, base)["sandboxstats_agent_sweeps_total{}"]
	waitSweeps(t, base, first+4) // both records served in at least three sweeps
	stop()
	w.Close()
	<-read

	f := func(v float64) *float64 { return &v }
	want := []nodeagent.ActivationRecord{
		{ActorUID: "vm-1", ActorName: "alice", ActorNamespace: "team", TemplateNamespace: "tmpl", TemplateName: "py",
			SandboxClass: "microvm", Source: "guest-agent", EpochUnixNano: vm.EpochUnixNano, EndUnixNano: vm.EndUnixNano,
			DurationSeconds: 30, Outcome: "checkpointed", FinalProvenance: "last-good-poll", FinalAgeSeconds: 1.5,
			FinalReason: vm.FinalReason, CPUSeconds: f(0.7), ChargedSeconds: 0, Charge: "unseen-before-start",
			MemoryPeakBytes: proto.Uint64(64 << 20), MemoryPeakIsLowerBound: true, BaselineDelaySeconds: 0.25, Socket: sock},
		{ActorUID: "gv-1", TemplateNamespace: "tmpl", TemplateName: "py",
			SandboxClass: "gvisor", Source: "cgroup", EpochUnixNano: gv.EpochUnixNano, EndUnixNano: gv.EndUnixNano,
			DurationSeconds: 0.4, Outcome: "oom-killed", FinalProvenance: "read-at-end",
			CPUSeconds: f(0.25), ChargedSeconds: 0.25, Charge: "whole", MemoryPeakBytes: proto.Uint64(128 << 20), Socket: sock},
	}
	var got []nodeagent.ActivationRecord
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		var rec nodeagent.ActivationRecord
		if err := dec.Decode(&rec); err != nil {
			t.Fatalf("stdout line %q is not an activation record: %v\nlog:\n%s", sc.Text(), err, logs)
		}
		// The final event's log.record.uid: 32 hex digits (its derivation is
		// nodeagent's TestEventUIDStable's).
		if len(rec.UID) != 32 || strings.Trim(rec.UID, "0123456789abcdef") != "" {
			t.Errorf("line %q: uid %q, want 32 hex digits", sc.Text(), rec.UID)
		}
		rec.UID = ""
		got = append(got, rec)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("activation log on stdout (-want +got):\n%s\nlog:\n%s", diff, logs)
	}
}
