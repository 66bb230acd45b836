package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestIntegrationPidFileSecretsNeverEchoed: a launcher (or whoever holds the
// lifecycle socket) names as the VMM pid file a file holding a secret, as
// --vmm-pid-file /etc/shadow or /proc/self/environ would. Before, statsctl
// host printed the file in its "not a positive integer" error, and so did
// statsctl drift and the log. No byte of it may reach StatsHost,
// StatsWorkload with include_host, ListDriftFindings or the log, and
// statsd's peak RSS stays under 64 MiB.
func TestIntegrationPidFileSecretsNeverEchoed(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the statsd binary")
	}
	bin := testenv.BuildBinaries(t)
	dir := t.TempDir()
	const secret = "SECRETxyzzy"
	shadow := filepath.Join(dir, "shadow")
	os.WriteFile(shadow, []byte("root:$6$"+secret+"$hash:19000:0:99999:7:::\n"), 0o600)
	environ := filepath.Join(dir, "environ")
	os.WriteFile(environ, []byte(strings.Repeat("PATH=/usr/bin\x00", 20)+"TOKEN="+secret+"\x00"), 0o600)
	short := filepath.Join(dir, "short.pid")
	os.WriteFile(short, []byte(secret), 0o600)
	link := filepath.Join(dir, "srv1", "qemu.pid")
	os.MkdirAll(filepath.Dir(link), 0o755)
	os.Symlink(shadow, link)

	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("web", kataagentfake.V2(kataagentfake.Container{UsageBytes: 1 << 20})))
	for _, pidFile := range []string{shadow, environ, short, link} {
		t.Run(filepath.Base(pidFile), func(t *testing.T) {
			d := testenv.StartStatsd(t, bin, "--drift-interval", "100ms", "--drift-grace", "0s")
			stats, life := clients(t, d)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if _, err := life.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{
				Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: "actor-vm"},
				Sandbox: &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM,
					AgentAddress: agent.Address(), ContainerIds: []string{"web"}, VmmPidFile: pidFile},
			}); err != nil {
				t.Fatal(err)
			}
			var a answers
			var reasons []string
			for range 5 {
				h, err := stats.StatsHost(ctx, &sandboxstatsv1.StatsHostRequest{ActorUid: "actor-vm"})
				a.note("StatsHost", h, err, secret)
				if err == nil {
					reasons = append(reasons, h.GetHost().GetVmmThreads().GetError())
				}
				w, err := stats.StatsWorkload(ctx, &sandboxstatsv1.StatsWorkloadRequest{ActorUid: "actor-vm", IncludeHost: true})
				a.note("StatsWorkload include_host", w, err, secret)
				f, err := stats.ListDriftFindings(ctx, &sandboxstatsv1.ListDriftFindingsRequest{})
				a.note("ListDriftFindings", f, err, secret)
				time.Sleep(150 * time.Millisecond)
			}
			a.check(t)
			logs, _ := os.ReadFile(d.Log)
			if strings.Contains(string(logs), secret) {
				t.Errorf("the log holds the secret")
			}
			rss := peakRSS(t, d)
			if rss > maxRSSBytes {
				t.Errorf("statsd peak RSS %d MiB, want under %d MiB", rss>>20, maxRSSBytes>>20)
			}
			t.Logf("observed: the thread view says %q; statsd peak RSS %.1f MiB", reasons[0], float64(rss)/(1<<20))
		})
	}
}
