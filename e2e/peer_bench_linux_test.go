package e2e

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"

	"github.com/sandboxstats/sandboxstats/internal/nrifake"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// The peer benchmark's fixed terms (docs/design.md, "The node's cost beside
// the kubelet's cAdvisor").
const (
	// peerInterval is both sides' sampling and scrape interval: statsagent's
	// --interval, cAdvisor's housekeeping, the benchmark's scrapes.
	peerInterval = 2 * time.Second
	// peerWindow is the window over which each process's CPU is measured.
	peerWindow = 40 * time.Second
	// layoutWait is how long the NRI layout's memory is measured after its
	// first sweep (the window of a setup without cAdvisor): past statsd's
	// --release-after (5 s), well before the next sweep (60 s).
	layoutWait = 15 * time.Second
)

// peerSetup is one measurement: n workloads (pods, each a real v1 cgroup
// holding a process that burns a little CPU) bound through statsnri over
// shards statsd, polled by one statsagent with --label-actor every
// interval and scraped as often; cAdvisor beside them when cadvisor is set.
type peerSetup struct {
	n, shards int
	interval  time.Duration
	cadvisor  bool
}

// shippedInterval is the deploy files' statsagent --interval and
// PodMonitor scrape interval.
const shippedInterval = 60 * time.Second

// peerResult is what one setup measured: the CPU each side used over
// peerWindow, and each process's Pss at its end.
type peerResult struct {
	samples                                 float64 // workload samples of each side in the window: n x window/interval
	statsdCPU, agentCPU, nriCPU, cadvisorCP time.Duration
	statsdPss, agentPss, nriPss, cadvisorPs uint64
	// Anonymous memory (smaps_rollup) of each side: the rest of Pss is
	// file pages, the binaries' shared among the shards.
	statsdAnon, agentAnon, nriAnon, cadvisorAnon uint64
	// ticks is each side's CPU in the window by /proc/<pid>/stat's 10 ms
	// ticks, printed beside the ns figures.
	ticks map[string]time.Duration
}

func (r peerResult) ourCPU() time.Duration { return r.statsdCPU + r.agentCPU + r.nriCPU }
func (r peerResult) ourPss() uint64        { return r.statsdPss + r.agentPss + r.nriPss }

// peerSetups are the setups BenchmarkPeer* measure, in this order, in one
// run: the node at 32, 110 and 256 workloads (ceil(n/32) shards, 32 being
// statsd's default --max-workloads) beside
// cAdvisor, sampled and scraped every 2 s; then the shipped NRI layout
// (8 shards) at 110 and 256 pods alone, swept and scraped at the shipped
// interval (60 s: its Pss between two sweeps).
var peerSetups = []peerSetup{
	{n: 32, shards: 1, interval: peerInterval, cadvisor: true},
	{n: 110, shards: 4, interval: peerInterval, cadvisor: true},
	{n: 256, shards: 8, interval: peerInterval, cadvisor: true},
	{n: 110, shards: 8, interval: shippedInterval},
	{n: 256, shards: 8, interval: shippedInterval},
}

// window is how long s is measured: peerWindow beside cAdvisor, else
// layoutWait.
func (s peerSetup) window() time.Duration {
	if s.cadvisor {
		return peerWindow
	}
	return layoutWait
}

// peerRun holds the one measurement every BenchmarkPeer* row reads: the
// first benchmark that asks runs it (about three and a half minutes).
var peerRun struct {
	sync.Mutex
	tried bool
	res   []peerResult
}

// peerResults runs peerSetups once per test process and returns their
// results; a benchmark after a failed run is skipped.
func peerResults(b *testing.B) []peerResult {
	b.Helper()
	peerRun.Lock()
	defer peerRun.Unlock()
	if peerRun.tried {
		if peerRun.res == nil {
			b.Skip("the peer measurement failed in an earlier BenchmarkPeer*")
		}
		return peerRun.res
	}
	peerRun.tried = true
	needV1(b)
	nrilog.Set(quietNRI{}) // the runtime side in this process: its warnings only
	bin := testenv.BuildBinaries(b, "statsagent", "statsnri")
	peer := testenv.BuildCadvisorPeer(b)
	res := make([]peerResult, len(peerSetups))
	only := os.Getenv("SANDBOXSTATS_PEER_ONLY_N")
	for i, s := range peerSetups {
		if only != "" && (strconv.Itoa(s.n) != only || !s.cadvisor) {
			continue
		}
		res[i] = runPeer(b, bin, peer, s)
		r := res[i]
		perSample := "none in the window"
		if r.samples > 0 {
			perSample = fmt.Sprintf("ours %.3f ms, cAdvisor %.3f ms", r.perSample(r.ourCPU())/1e6, r.perSample(r.cadvisorCP)/1e6)
		}
		fmt.Printf("peer: n=%d shards=%d interval=%v: CPU over %v: statsd %v, statsagent %v, statsnri %v (ours %v), cAdvisor %v; per workload sample: %s; Pss (anonymous) statsd %.1f (%.1f) MiB, statsagent %.1f (%.1f) MiB, statsnri %.1f (%.1f) MiB, ours %.1f MiB, cAdvisor %.1f (%.1f) MiB\n",
			s.n, s.shards, s.interval, s.window(), r.statsdCPU, r.agentCPU, r.nriCPU, r.ourCPU(), r.cadvisorCP, perSample,
			toMiB(r.statsdPss), toMiB(r.statsdAnon), toMiB(r.agentPss), toMiB(r.agentAnon), toMiB(r.nriPss), toMiB(r.nriAnon),
			toMiB(r.ourPss()), toMiB(r.cadvisorPs), toMiB(r.cadvisorAnon))
		fmt.Printf("peer: n=%d: by /proc/<pid>/stat ticks: statsd %v, statsagent %v, statsnri %v, cAdvisor %v\n",
			s.n, r.ticks["statsd"], r.ticks["agent"], r.ticks["nri"], r.ticks["cadvisor"])
	}
	peerRun.res = res
	return res
}

// perSample is d in ns per workload sample.
func (r peerResult) perSample(d time.Duration) float64 { return float64(d.Nanoseconds()) / r.samples }

// reportPeer reports one row: value in the ns/op column (benchtable divides
// it by the group's baseline), goal (0: none) and extra metrics.
func reportPeer(b *testing.B, name string, value, goal float64, extra map[string]float64) {
	b.Run(name, func(b *testing.B) {
		for b.Loop() {
		}
		b.ReportMetric(value, "ns/op")
		if goal > 0 {
			b.ReportMetric(goal, "goal-x")
		}
		for unit, v := range extra {
			b.ReportMetric(v, unit)
		}
	})
}

// The BenchmarkPeer* rows measure, in one run (peerResults), what the
// shipped node layout costs beside the peer every Kubernetes node already
// runs, the kubelet's embedded cAdvisor (e2e/cadvisorpeer: v0.53.0's
// manager and Prometheus collector, the kubelet's metric set, housekeeping
// fixed at 2 s), on the same real v1 cgroups: at 32, 110 and 256 workloads,
// ceil(n/32) statsd shards, the NRI bridge statsnri binding the pods to
// them (the runtime side is internal/nrifake: containerd's own NRI
// adaptation, in the benchmark process, synchronizing the pods once and
// then idle), one statsagent with --label-actor sweeping every 2 s, both
// exporters scraped by the benchmark every 2 s. Each process's CPU over a
// 40 s window (its threads' /proc/<pid>/task/<tid>/schedstat, in ns), its Pss at the window's end
// (/proc/<pid>/smaps_rollup). Then the shipped NRI layout itself (8
// shards, statsagent sweeping and scraped every 60 s as the deploy files
// set it) at 110 and 256 pods, for its memory 15 s after its first sweep
// (about four and a half minutes in all). A value that is not a time is
// reported in the ns/op column (benchtable's ratio is what counts), its
// unit in the benchmark's doc.
//
// With SANDBOXSTATS_PEER_PERF set to a directory, the 110-workload window
// (or SANDBOXSTATS_PEER_PERF_N's) beside cAdvisor also runs `perf record -e cpu-clock -g -F 4000` (this
// host's VM offers no cycles event) on each side's processes (the statsd
// shards together, statsagent, statsnri, cAdvisor) for the window, into
// <dir>/<side>.data (the CPU figures of that run then include perf's
// disturbance). With SANDBOXSTATS_PEER_ONLY_N set to 32, 110 or 256 only
// that setup beside cAdvisor runs (its CPU row alone; the others skip).

// BenchmarkPeerCPUPerSample32: ns of CPU per workload sample, ours (the
// shards, statsnri and statsagent) over cAdvisor's, at 32 workloads.
func BenchmarkPeerCPUPerSample32(b *testing.B) { benchPeerCPU(b, 0) }

// BenchmarkPeerCPUPerSample110 is BenchmarkPeerCPUPerSample32 at 110.
func BenchmarkPeerCPUPerSample110(b *testing.B) { benchPeerCPU(b, 1) }

// BenchmarkPeerCPUPerSample256 is BenchmarkPeerCPUPerSample32 at 256.
func BenchmarkPeerCPUPerSample256(b *testing.B) { benchPeerCPU(b, 2) }

func benchPeerCPU(b *testing.B, i int) {
	r := measured(b, peerResults(b)[i])
	reportPeer(b, "baseline", r.perSample(r.cadvisorCP), 0, nil)
	reportPeer(b, "ours", r.perSample(r.ourCPU()), 0.1, map[string]float64{
		"statsd-ns/sample": r.perSample(r.statsdCPU), "agent-ns/sample": r.perSample(r.agentCPU), "nri-ns/sample": r.perSample(r.nriCPU)})
}

// measured returns r, skipping b when SANDBOXSTATS_PEER_ONLY_N left r's
// setup out.
func measured(b *testing.B, r peerResult) peerResult {
	if r.samples == 0 {
		b.Skip("not measured (SANDBOXSTATS_PEER_ONLY_N)")
	}
	return r
}

// BenchmarkPeerPss32: the node's Pss in bytes, ours (the shards, statsnri
// and statsagent) over cAdvisor's, at 32 workloads.
func BenchmarkPeerPss32(b *testing.B) { benchPeerPss(b, 0) }

// BenchmarkPeerPss110 is BenchmarkPeerPss32 at 110.
func BenchmarkPeerPss110(b *testing.B) { benchPeerPss(b, 1) }

// BenchmarkPeerPss256 is BenchmarkPeerPss32 at 256.
func BenchmarkPeerPss256(b *testing.B) { benchPeerPss(b, 2) }

func benchPeerPss(b *testing.B, i int) {
	r := measured(b, peerResults(b)[i])
	reportPeer(b, "baseline", float64(r.cadvisorPs), 0, map[string]float64{"MiB": toMiB(r.cadvisorPs)})
	reportPeer(b, "ours", float64(r.ourPss()), 0.8, map[string]float64{
		"MiB": toMiB(r.ourPss()), "statsd-MiB": toMiB(r.statsdPss), "agent-MiB": toMiB(r.agentPss), "nri-MiB": toMiB(r.nriPss)})
}

// BenchmarkPeerCPUScaling: our ns of CPU per workload sample at 256
// workloads over ours at 32.
func BenchmarkPeerCPUScaling(b *testing.B) {
	res := peerResults(b)
	at32, at256 := measured(b, res[0]), measured(b, res[2])
	reportPeer(b, "baseline", at32.perSample(at32.ourCPU()), 0, nil)
	reportPeer(b, "at-256", at256.perSample(at256.ourCPU()), 1.2, nil)
}

// BenchmarkPeerNRILayoutPss110: the shipped NRI layout's Pss in bytes (8
// shards, statsnri, statsagent, at the shipped 60 s interval) at 110 pods
// over cAdvisor's at 110; no goal (docs/nri.md records it).
func BenchmarkPeerNRILayoutPss110(b *testing.B) { benchNRILayout(b, 1, 3) }

// BenchmarkPeerNRILayoutPss256 is BenchmarkPeerNRILayoutPss110 at 256.
func BenchmarkPeerNRILayoutPss256(b *testing.B) { benchNRILayout(b, 2, 4) }

func benchNRILayout(b *testing.B, peer, layout int) {
	res := peerResults(b)
	nri := measured(b, res[layout])
	reportPeer(b, "baseline", float64(res[peer].cadvisorPs), 0, map[string]float64{"MiB": toMiB(res[peer].cadvisorPs)})
	reportPeer(b, "8-shards-60s", float64(nri.ourPss()), 0, map[string]float64{
		"MiB": toMiB(nri.ourPss()), "statsd-MiB": toMiB(nri.statsdPss), "agent-MiB": toMiB(nri.agentPss), "nri-MiB": toMiB(nri.nriPss)})
}

// runPeer runs one setup and stops everything it started before returning
// (the cgroups are removed at the benchmark's end, empty by then).
func runPeer(b *testing.B, bin, peer string, s peerSetup) peerResult {
	b.Helper()
	var stops []func()
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	dir, err := os.MkdirTemp("", "peer")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) }) // after the processes' cleanups have logged

	// The pods: a parent cgroup (the kubelet's /kubepods) and one cgroup a
	// pod in the hierarchies a pod has, each holding a shell that wakes every
	// second to count to 300.
	parent := fmt.Sprintf("sbs-peer-%d-%d-%d", os.Getpid(), s.n, s.shards)
	hier := []string{"memory", "cpu", "cpuacct", "blkio", "pids"}
	dirs := func(rel string) []string {
		var d []string
		for _, h := range hier {
			d = append(d, filepath.Join(testenv.CgroupRoot, h, rel))
		}
		return d
	}
	testenv.MakeCgroup(b, dirs(parent)...)
	fifo := filepath.Join(dir, "tick")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		b.Fatal(err)
	}
	pods := make([]*api.PodSandbox, s.n)
	for i := range s.n {
		rel := fmt.Sprintf("%s/pod-%03d", parent, i)
		testenv.MakeCgroup(b, dirs(rel)...)
		cmd := exec.Command("bash", "-c", `exec 3<>"$1"; while :; do for ((i=0;i<300;i++)); do :; done; read -t 1 -u 3; done`, "burner", fifo)
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		stops = append(stops, func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		testenv.JoinCgroup(b, cmd.Process.Pid, dirs(rel)...)
		pods[i] = &api.PodSandbox{Id: fmt.Sprintf("sbx%03d", i), Uid: fmt.Sprintf("peer-uid-%03d", i), Name: fmt.Sprintf("pod-%03d", i),
			Namespace: fmt.Sprintf("ns-%d", i%16), RuntimeHandler: "runc", Pid: uint32(cmd.Process.Pid),
			Linux: &api.LinuxPodSandbox{CgroupsPath: "/" + rel, CgroupParent: "/" + rel}}
	}

	// Our node: the shards, the bridge, the agent.
	for _, d := range []string{"stats", "lifecycle"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			b.Fatal(err)
		}
	}
	var shards []*testenv.Statsd
	var bridgeArgs []string
	for i := range s.shards {
		d := testenv.StartStatsdAt(b, bin, filepath.Join(dir, "stats", fmt.Sprintf("nri-%d.sock", i)),
			filepath.Join(dir, "lifecycle", fmt.Sprintf("nri-%d.sock", i)), filepath.Join(dir, fmt.Sprintf("state-%d", i)))
		stops = append(stops, func() { d.Stop(b) })
		shards = append(shards, d)
		bridgeArgs = append(bridgeArgs, "--statsd", d.Lifecycle+","+d.Stats)
	}
	nriDir := filepath.Join(dir, "nri")
	if err := os.Mkdir(nriDir, 0o700); err != nil {
		b.Fatal(err)
	}
	nrifake.Start(b, nriDir, pods...)
	bridge := newBridgeProc(b, bin, dir, append(bridgeArgs, "--nri-socket", filepath.Join(nriDir, "nri.sock"),
		"--handlers", "runsc,kata*,runc", "--gvisor-handlers", "runsc*", "--kata-handlers", "kata*",
		"--placement-key-file", filepath.Join(dir, "placement.key"))...)
	bridge.start(b)
	stops = append(stops, func() { bridge.stop(b) })
	bridge.waitHealthy(b, 20*time.Second)
	// Every pod bound before the agent starts: its first sweep, at once,
	// is the only one of a setup at the shipped interval.
	waitFor(b, 60*time.Second, func() bool {
		var bound float64
		for k, v := range bridge.metrics(b) {
			if strings.HasPrefix(k, "sandboxstats_nri_statsd_bindings{") {
				bound += v
			}
		}
		return bound == float64(s.n)
	}, fmt.Sprintf("statsnri to bind the %d pods", s.n))
	agentURL, agent := testenv.StartStatsagentProcess(b, bin, dir, "--sockets", filepath.Join(dir, "stats", "*.sock"),
		"--interval", s.interval.String(), "--min-interval", s.interval.String(), "--label-actor")
	stops = append(stops, func() { _ = agent.Signal(syscall.SIGTERM) }) // reaped by its cleanup

	// The peer.
	var cad *exec.Cmd
	var cadURL string
	if s.cadvisor {
		cad, cadURL = startCadvisorPeer(b, peer, dir, "/"+parent)
		stops = append(stops, func() { testenv.StopProcess(b, cad, "cadvisorpeer") })
	}

	// Both exporters scraped every interval, as a Prometheus would (the Go
	// client asks for gzip, as Prometheus does).
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stops = append(stops, func() { cancel(); wg.Wait() })
	for _, u := range []string{agentURL, cadURL} {
		if u == "" {
			continue
		}
		wg.Go(func() { scrapeEvery(ctx, u+"/metrics", s.interval) })
	}

	// Warm: every pod's series on both exporters.
	waitFor(b, 60*time.Second, func() bool { return actorSeries(b, agentURL) == s.n }, fmt.Sprintf("statsagent to export the %d pods", s.n))
	if s.cadvisor {
		waitFor(b, 60*time.Second, func() bool { return cadvisorPods(b, cadURL, parent) == s.n }, fmt.Sprintf("cAdvisor to export the %d pods", s.n))
	}
	time.Sleep(2 * peerInterval)

	pids := map[string][]int{"agent": {agent.Pid}, "nri": {bridge.cmd.Process.Pid}}
	for _, d := range shards {
		pids["statsd"] = append(pids["statsd"], d.Cmd.Process.Pid)
	}
	if cad != nil {
		pids["cadvisor"] = []int{cad.Process.Pid}
	}
	var perf []*exec.Cmd
	if out := os.Getenv("SANDBOXSTATS_PEER_PERF"); out != "" && strconv.Itoa(s.n) == cmp.Or(os.Getenv("SANDBOXSTATS_PEER_PERF_N"), "110") && s.cadvisor {
		for role, ps := range pids {
			var list []string
			for _, p := range ps {
				list = append(list, strconv.Itoa(p))
			}
			c := exec.Command("perf", "record", "-e", "cpu-clock", "-g", "-F", "4000", "-p", strings.Join(list, ","),
				"-o", filepath.Join(out, role+".data"), "--", "sleep", strconv.Itoa(int(s.window().Seconds())))
			c.Stdout, c.Stderr = io.Discard, io.Discard
			if err := c.Start(); err != nil {
				b.Fatal(err)
			}
			perf = append(perf, c)
		}
	}
	cpu0, ticks0 := map[string]time.Duration{}, map[string]time.Duration{}
	for role, ps := range pids {
		cpu0[role], ticks0[role] = procCPU(b, ps)
	}
	time.Sleep(s.window())
	r := peerResult{samples: float64(s.n) * float64(s.window()/s.interval)}
	r.ticks = map[string]time.Duration{}
	cpu := func(role string) time.Duration {
		ns, ticks := procCPU(b, pids[role])
		r.ticks[role] = ticks - ticks0[role]
		return ns - cpu0[role]
	}
	pss := func(role string) (pss, anon uint64) {
		for _, p := range pids[role] {
			v, a := smapsRollup(b, p)
			pss, anon = pss+v, anon+a
		}
		return pss, anon
	}
	r.statsdCPU, r.agentCPU, r.nriCPU = cpu("statsd"), cpu("agent"), cpu("nri")
	r.statsdPss, r.statsdAnon = pss("statsd")
	r.agentPss, r.agentAnon = pss("agent")
	r.nriPss, r.nriAnon = pss("nri")
	if s.cadvisor {
		r.cadvisorCP = cpu("cadvisor")
		r.cadvisorPs, r.cadvisorAnon = pss("cadvisor")
	}
	for _, c := range perf {
		_ = c.Wait()
	}
	// Every pod was still exported at the end.
	if got := actorSeries(b, agentURL); got != s.n {
		b.Errorf("n=%d: statsagent exports %d pods at the end", s.n, got)
	}
	return r
}

// procCPU is the CPU the processes pids ran so far, in ns: the first field
// of /proc/<pid>/task/<tid>/schedstat (the scheduler's sum_exec_runtime)
// summed over every thread. /proc/<pid>/stat's user and system time are
// clock ticks of 10 ms, a tick's truncation at each end of a window a
// process: about 3% of a 32-workload window's statsd or statsagent CPU
// (a few hundred ms). A thread that exits in the window takes its time
// with it (a Go runtime keeps its threads); ticks, that stat's figure,
// is printed beside it.
func procCPU(t testing.TB, pids []int) (ns, ticks time.Duration) {
	t.Helper()
	for _, p := range pids {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", p))
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range tasks {
			path := fmt.Sprintf("/proc/%d/task/%s/schedstat", p, task.Name())
			b, err := os.ReadFile(path)
			if errors.Is(err, fs.ErrNotExist) {
				continue // the thread exited since the listing
			}
			if err != nil {
				t.Fatal(err)
			}
			f := strings.Fields(string(b))
			v, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", path, b, err)
			}
			ns += time.Duration(v)
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		// Fields after the command: state is 0, utime 11, stime 12.
		u, err1 := strconv.ParseUint(f[11], 10, 64)
		st, err2 := strconv.ParseUint(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("/proc/%d/stat: %q", p, s)
		}
		ticks += time.Duration(u+st) * 10 * time.Millisecond
	}
	return ns, ticks
}

// scrapeEvery GETs url every interval until ctx ends, reading each answer
// whole.
func scrapeEvery(ctx context.Context, url string, interval time.Duration) {
	c := &http.Client{Timeout: 10 * time.Second}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := c.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// actorSeries counts the workloads statsagent exports (its memory series,
// one per actor with --label-actor).
func actorSeries(t testing.TB, base string) int {
	n := 0
	for k := range testenv.Scrape(t, base) {
		if strings.HasPrefix(k, "sandboxstats_workload_memory_current_bytes{") && strings.Contains(k, "actor_uid=peer-uid-") {
			n++
		}
	}
	return n
}

// cadvisorPods counts the pods' cgroups cAdvisor exports (its
// container_memory_usage_bytes series under parent).
func cadvisorPods(t testing.TB, base, parent string) int {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.SplitSeq(string(body), "\n") {
		if strings.HasPrefix(line, "container_memory_usage_bytes{") && strings.Contains(line, `id="/`+parent+`/pod-`) {
			n++
		}
	}
	return n
}

var cadvisorServing = regexp.MustCompile(`cadvisorpeer serving addr=(\S+)`)

// startCadvisorPeer starts the peer cAdvisor tracking the cgroups under
// prefix and returns it with its base URL.
func startCadvisorPeer(t testing.TB, peer, dir, prefix string) (*exec.Cmd, string) {
	t.Helper()
	logPath := filepath.Join(dir, "cadvisorpeer.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(peer, "--listen", "127.0.0.1:0", "--raw-cgroup-prefix", prefix, "--housekeeping", peerInterval.String())
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(logPath)
		if m := cadvisorServing.FindSubmatch(b); m != nil {
			return cmd, "http://" + string(m[1])
		}
	}
	b, _ := os.ReadFile(logPath)
	testenv.StopProcess(t, cmd, "cadvisorpeer")
	t.Fatalf("cadvisorpeer did not start within 30 s:\n%s", b)
	return nil, ""
}

func toMiB(b uint64) float64 { return float64(b) / (1 << 20) }

// quietNRI keeps NRI's runtime side (nrifake, in the benchmark process) to
// its warnings and errors, which go to stderr: its every connection and
// synchronization would otherwise be in make bench's output.
type quietNRI struct{}

func (quietNRI) Debugf(context.Context, string, ...any) {}
func (quietNRI) Infof(context.Context, string, ...any)  {}
func (quietNRI) Warnf(_ context.Context, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nri: warning: "+format+"\n", args...)
}
func (quietNRI) Errorf(_ context.Context, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nri: error: "+format+"\n", args...)
}
