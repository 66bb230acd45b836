package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// netDevTx returns the transmit bytes of /proc/<pid>/net/dev summed over
// the interfaces but loopback: the kernel's view of the network namespace
// pid runs in.
func netDevTx(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/dev", pid))
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, l := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(l, ":")
		if !ok || strings.TrimSpace(name) == "lo" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 16 {
			continue
		}
		v, err := strconv.ParseUint(f[8], 10, 64)
		if err != nil {
			t.Fatalf("/proc/%d/net/dev: %q: %v", pid, l, err)
		}
		sum += float64(v)
	}
	return sum
}

// netnsHolders returns the pids whose network namespace is the one with
// inode ino.
func netnsHolders(ino uint64) []int {
	want := fmt.Sprintf("net:[%d]", ino)
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "net")); err == nil && l == want {
			out = append(out, pid)
		}
	}
	return out
}

// TestIntegrationGVisorNetworkPrometheus: a real gVisor sandbox (runsc
// --platform=ptrace with its sandbox network) in a network namespace the
// test makes, joined by a veth pair to a second one (169.254.77.1/30 and .2,
// see testenv.NetNSPair), bound to a real statsd by sentry pid, polled by
// the statsagent binary and scraped by Debian's Prometheus. A 10 MiB
// transfer from inside the sandbox (busybox nc) to a listener in the second
// namespace raises PromQL sandboxstats_workload_network_transmit_bytes_total
// by 10 MiB ± 5 %, within 5 % of what the listener counted and within 1 %
// of the kernel's own count (/proc/<sentry pid>/net/dev, read raw by the
// test); promtool check metrics is clean on the live scrape. After the test
// (its cleanups run at the end of a subtest) both namespaces and the veth
// are gone (ip netns list, ip link show) and no process is left in them.
func TestIntegrationGVisorNetworkPrometheus(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real gVisor sandbox, statsd, statsagent and Prometheus; not under -short")
	}
	var a, b testenv.NetNS
	var inodes []uint64
	t.Run("transfer", func(t *testing.T) {
		a, b = testenv.NetNSPair(t) // registered first: removed after the sandbox
		for _, ns := range []testenv.NetNS{a, b} {
			var st syscall.Stat_t
			if err := syscall.Stat(ns.Path, &st); err != nil {
				t.Fatal(err)
			}
			inodes = append(inodes, st.Ino)
		}
		sb := testenv.StartSandboxWith(t, testenv.SandboxOptions{NetNS: a.Path}, "/bin/sh", "-c", "while true; do sleep 1; done")
		bin := testenv.BuildBinaries(t, "statsagent")
		dir := fleetDir(t)
		d := startStatsdIn(t, bin, dir, "net")
		agentURL := testenv.StartStatsagent(t, bin, dir, "--sockets", filepath.Join(dir, "stats", "*.sock"),
			"--interval", "500ms", "--min-interval", "100ms", "--timeout", "5s", "--label-actor")
		u, _ := url.Parse(agentURL)
		prom := testenv.StartPrometheus(t, []string{u.Host}, 500*time.Millisecond)
		statsctl(t, bin, "run-workload", "--lifecycle-socket", d.Lifecycle, "--actor-uid", "net", "--actor-name", "net",
			"--actor-namespace", "team", "--template-namespace", "tmpl", "--template-name", "py",
			"--class", "gvisor", "--sentry-pid", strconv.Itoa(sb.PID))
		testenv.WaitNewSweeps(t, agentURL)

		const q = `sandboxstats_workload_network_transmit_bytes_total{actor_uid="net"}`
		raw0 := netDevTx(t, sb.PID)
		// Idle, the namespace sends at most a few packets (IPv6 neighbour
		// discovery): PromQL has caught up when it is within 64 KiB.
		v0, ok := promValue(t, prom, q, func(v float64) bool { return v >= raw0-64<<10 && v <= raw0+64<<10 })
		if !ok {
			t.Fatalf("PromQL %s: no series (the kernel counts %.0f bytes sent)", q, raw0)
		}
		const size = 10 << 20
		got, addr, took := testenv.SendFromSandbox(t, sb, b, size>>20, 2*time.Minute)
		raw1 := netDevTx(t, sb.PID)
		v1, _ := promValue(t, prom, q, func(v float64) bool { return within(v-v0, raw1-raw0, 0.01) })
		rise := v1 - v0
		t.Logf("10 MiB from the sandbox to %s in %v: listener received %d bytes; PromQL %s %.0f -> %.0f (+%.0f bytes, %+.2f %% over the payload: headers); /proc/%d/net/dev tx %.0f -> %.0f (+%.0f)",
			addr, took.Round(time.Millisecond), got, q, v0, v1, rise, 100*(rise-size)/size, sb.PID, raw0, raw1, raw1-raw0)
		if got != size {
			t.Errorf("listener received %d bytes, want %d", got, size)
		}
		if !within(rise, size, 0.05) || !within(rise, float64(got), 0.05) || !within(rise, raw1-raw0, 0.01) {
			t.Errorf("PromQL transmit bytes rose by %.0f, want %d ± 5 %% (and the listener's %d ± 5 %%, the kernel's %.0f ± 1 %%)", rise, size, got, raw1-raw0)
		}

		resp, err := http.Get(agentURL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), "sandboxstats_workload_network_transmit_bytes_total{") {
			t.Errorf("the live scrape has no network series")
		}
		if lint := testenv.PromtoolCheckMetrics(t, body); lint != "" {
			t.Errorf("promtool check metrics on the live scrape:\n%s", lint)
		}
	})
	if a.Name == "" {
		return // failed before making the namespaces
	}

	// Everything the subtest made is gone: the namespaces (their names and
	// every process in them) and the veth pair.
	var left []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		left = nil
		netns, err := exec.Command("ip", "netns", "list").CombinedOutput()
		if err != nil {
			t.Fatalf("ip netns list: %v: %s", err, netns)
		}
		links, err := exec.Command("ip", "link", "show").CombinedOutput()
		if err != nil {
			t.Fatalf("ip link show: %v: %s", err, links)
		}
		for _, ns := range []testenv.NetNS{a, b} {
			if strings.Contains(string(netns), ns.Name) {
				left = append(left, "namespace "+ns.Name)
			}
			if strings.Contains(string(links), ns.Link) {
				left = append(left, "link "+ns.Link)
			}
		}
		for i, ino := range inodes {
			if pids := netnsHolders(ino); len(pids) > 0 {
				left = append(left, fmt.Sprintf("processes %v in the namespace that was %s", pids, []testenv.NetNS{a, b}[i].Name))
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("left behind after the test: %s", strings.Join(left, "; "))
	} else {
		t.Logf("after the test: namespaces %s and %s, links %s and %s, and every process in them gone", a.Name, b.Name, a.Link, b.Link)
	}
}
