package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// sampleByPID opens a source on a real sandbox by its sentry pid.
func sampleByPID(t *testing.T, sb *testenv.Sandbox) (source.Source, func(what string) source.Reading) {
	t.Helper()
	s, err := Open(source.SandboxRef{Class: source.ClassGVisor, SentryPID: sb.PID}, Config{Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, func(what string) source.Reading {
		t.Helper()
		r, err := s.Sample(context.Background())
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return r
	}
}

// TestIntegrationGVisorMemoryLimit starts a real sandbox whose OCI spec sets
// linux.resources.memory.limit to 64 MiB and writes 200 MiB into its
// /dev/shm (the sentry's memfd, charged to the sandbox cgroup): the host
// kernel OOM-kills in the sandbox cgroup. The sample by sentry pid shows the
// 64 MiB limit and the kill.
func TestIntegrationGVisorMemoryLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real gVisor sandbox; not under -short")
	}
	sb := testenv.StartSandboxWith(t, testenv.SandboxOptions{MemoryLimit: 64 << 20}, "/bin/sh", "-c", "while true; do sleep 1; done")
	_, sample := sampleByPID(t, sb)
	r0 := sample("idle")
	if r0.Memory == nil || r0.Memory.LimitBytes == nil || *r0.Memory.LimitBytes != (source.Limit{Value: 64 << 20}) {
		t.Fatalf("memory signals %+v, want a 64 MiB limit (absent %+v)", r0.Memory, r0.Absent)
	}
	if mode, err := detectMode(DefaultCgroupRoot); err == nil && mode == ModeUnified {
		// v2 only: memory.high, as the kernel's file says it.
		dir := filepath.Join(DefaultCgroupRoot, sb.CgroupPath)
		for _, f := range []struct {
			name string
			got  *source.Limit
		}{{"memory.max", r0.Memory.LimitBytes}, {"memory.high", r0.Memory.HighBytes}} {
			b, err := os.ReadFile(filepath.Join(dir, f.name))
			if err != nil {
				t.Fatal(err)
			}
			want, err := parseLimit(b)
			if err != nil {
				t.Fatalf("%s/%s: %v", dir, f.name, err)
			}
			t.Logf("%s: statsd %+v, the kernel's %q", f.name, f.got, strings.TrimSpace(string(b)))
			if f.got == nil || *f.got != want {
				t.Errorf("%s: statsd %+v, the kernel's file %q", f.name, f.got, strings.TrimSpace(string(b)))
			}
		}
	}
	out, err := sb.Runsc(t, "", "exec", sb.ID, "/bin/dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=1M", "count=200")
	t.Logf("dd of 200 MiB into /dev/shm under a 64 MiB limit: %v %s", err, strings.TrimSpace(string(out)))
	var r source.Reading
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		r = sample("after dd")
		if (r.Memory.OOMKills != nil && *r.Memory.OOMKills > 0) || time.Now().After(deadline) {
			break
		}
	}
	m := r.Memory
	procs := "absent"
	if r.SandboxProcesses != nil {
		procs = fmt.Sprint(*r.SandboxProcesses)
	}
	t.Logf("sample: limit %+v, oom_kills %v, under_oom %v, memory current %.1f MiB, peak %.1f MiB, processes %s",
		*m.LimitBytes, deref64(m.OOMKills), m.UnderOOM != nil && *m.UnderOOM, float64(r.MemoryCurrentBytes)/mib, float64(deref64(r.MemoryPeakBytes))/mib, procs)
	if m.OOMKills == nil || *m.OOMKills == 0 {
		t.Errorf("oom_kills = %v after writing 200 MiB under a 64 MiB limit, want at least 1", m.OOMKills)
	}
	if *m.LimitBytes != (source.Limit{Value: 64 << 20}) {
		t.Errorf("limit %+v, want 64 MiB", *m.LimitBytes)
	}
}

func deref64(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}

// TestIntegrationGVisorNetworkNone: a sandbox run with --network=none has a
// namespace with loopback only: the sample says so and has no total.
func TestIntegrationGVisorNetworkNone(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real gVisor sandbox; not under -short")
	}
	sb := testenv.StartSandbox(t, "", "/bin/sh", "-c", "while true; do sleep 1; done")
	_, sample := sampleByPID(t, sb)
	r := sample("idle")
	n := r.Network
	if n == nil || !n.LoopbackOnly || n.Total != nil || n.Loopback == nil || len(n.Interfaces) != 0 {
		t.Fatalf("network %+v, want loopback only with no total", n)
	}
	t.Logf("--network=none: loopback only (%s), total absent: %q", n.Origin, absentWhy(r, "network.total"))
	if r.Pids == nil || r.Pids.Current == 0 || r.Throttling == nil || r.Memory == nil || r.Memory.LimitBytes == nil {
		t.Errorf("a sandbox runsc made in every v1 hierarchy: pids %+v, throttling %+v, memory %+v (absent %+v)", r.Pids, r.Throttling, r.Memory, r.Absent)
	}
	sig := signalsOf(r)
	t.Logf("the rest of the sample: memory %+v limit %+v; throttling quota %+v; pids %+v limit %+v; block_io %s; absent %+v",
		*sig.Memory, *sig.Memory.LimitBytes, *sig.Throttling.QuotaUsec, *sig.Pids, sig.Pids.Limit, blockIOLine(r), sig.Absent)
}

// TestIntegrationGVisorNetwork starts a real sandbox with runsc's sandbox
// network in a network namespace the test makes, joined by a veth pair to a
// second namespace (169.254.77.1/30 and .2, nothing routed elsewhere). A
// 10 MiB transfer from inside the sandbox (busybox nc) to a listener in the
// second namespace raises the sample's transmit bytes by 10 MiB ± 5 %, and
// the listener counts the same 10 MiB.
func TestIntegrationGVisorNetwork(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real gVisor sandbox; not under -short")
	}
	a, b := testenv.NetNSPair(t) // registered first: removed after the sandbox
	sb := testenv.StartSandboxWith(t, testenv.SandboxOptions{NetNS: a.Path}, "/bin/sh", "-c", "while true; do sleep 1; done")
	_, sample := sampleByPID(t, sb)
	r0 := sample("idle")
	if r0.Network == nil || r0.Network.Total == nil || r0.Network.Layer != source.NetworkLayerHostNamespace {
		t.Fatalf("network %+v (absent %+v), want the veth %s in the total", r0.Network, r0.Absent, a.Link)
	}
	const size = 10 << 20
	got, addr, took := testenv.SendFromSandbox(t, sb, b, size>>20, time.Minute)
	r1 := sample("sent")
	tx := int64(r1.Network.Total.TxBytes - r0.Network.Total.TxBytes)
	t.Logf("10 MiB from the sandbox to %s in %v: listener received %d bytes; sample tx +%d bytes (%.2f %% over the payload: headers), interfaces %+v",
		addr, took.Round(time.Millisecond), got, tx, 100*float64(tx-size)/size, r1.Network.Interfaces)
	if got != size {
		t.Errorf("listener received %d bytes, want %d", got, size)
	}
	if !within(tx, size, 0.05) || !within(tx, got, 0.05) {
		t.Errorf("transmit bytes rose by %d, want %d ± 5 %% (and the listener's %d)", tx, size, got)
	}
	if r1.Network.Loopback == nil || r1.Network.Total.Name != "total" {
		t.Errorf("loopback %+v, total %+v: want loopback apart from the total", r1.Network.Loopback, r1.Network.Total)
	}
}
