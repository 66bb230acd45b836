package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// TestActivationsReadsEveryPage: with 64 ended activations of about 8.5
// KiB each (ten pages), `statsctl activations` prints all of them, oldest
// first, in the table and in JSON.
func TestActivationsReadsEveryPage(t *testing.T) {
	d := startDaemon(t)
	d.src.set(source.Reading{Kind: source.KindCgroup, Detail: strings.Repeat("d", 8<<10), MemoryCurrentBytes: 1 << 20, CPUUsageUsec: cpuUsec(1)}, nil)
	ctx := context.Background()
	var want []string
	for i := range identity.DefaultEndedMax {
		id := identity.Identity{ActorUID: fmt.Sprintf("actor-%02d", i)}
		if _, _, err := d.store.Bind(ctx, identity.OpRun, id, source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/sbx"}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.store.Release(ctx, id.ActorUID); err != nil {
			t.Fatal(err)
		}
		want = append(want, id.ActorUID)
	}
	out, errOut, code := d.ctl(t, "activations", "--socket", "$STATS")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got []string
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i, line := range lines[1 : len(lines)-1] {
		if f := strings.Fields(line); f[0] == fmt.Sprint(i+1) {
			got = append(got, f[1])
		}
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("table lists %d activations numbered in order: %v", len(got), got)
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, "sequences 1 to 64 held, next 65") {
		t.Errorf("the table's last line: %q; want the ended log", last)
	}
	out, errOut, code = d.ctl(t, "activations", "--socket", "$STATS", "-o", "json")
	if code != 0 {
		t.Fatalf("-o json: exit %d: %s", code, errOut)
	}
	var resp struct {
		Ended []struct {
			Identity struct {
				ActorUID string `json:"actor_uid"`
			} `json:"identity"`
			Sequence string `json:"sequence"`
		} `json:"ended"`
		EndedLog struct {
			NextSequence string `json:"next_sequence"`
		} `json:"ended_log"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("%v: %.200s", err, out)
	}
	if len(resp.Ended) != len(want) || resp.Ended[63].Identity.ActorUID != want[63] || resp.Ended[63].Sequence != "64" || resp.EndedLog.NextSequence != "65" {
		t.Errorf("JSON lists %d activations (the last #%s), next sequence %q", len(resp.Ended), resp.Ended[len(resp.Ended)-1].Sequence, resp.EndedLog.NextSequence)
	}
}

// TestActivationsBeyondTheAgentsCap: a statsd keeping more ended records
// than the node agent's sweep reads from one daemon (--ended-max 300, the
// agent's --max-ended 256) still shows every one of them to a person.
func TestActivationsBeyondTheAgentsCap(t *testing.T) {
	const n = 300
	d := startDaemonAt(t, "", func(c *identity.Config) { c.EndedMax = n; c.EndedRetention = 1 << 62 })
	d.src.set(source.Reading{Kind: source.KindCgroup, MemoryCurrentBytes: 1 << 20, CPUUsageUsec: cpuUsec(1)}, nil)
	ctx := context.Background()
	for i := range n {
		id := identity.Identity{ActorUID: fmt.Sprintf("actor-%03d", i)}
		if _, _, err := d.store.Bind(ctx, identity.OpRun, id, source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/sbx"}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.store.Release(ctx, id.ActorUID); err != nil {
			t.Fatal(err)
		}
	}
	out, errOut, code := d.ctl(t, "activations", "--socket", "$STATS")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != n+2 {
		t.Errorf("table lists %d activations, want %d", len(lines)-2, n)
	}
}
