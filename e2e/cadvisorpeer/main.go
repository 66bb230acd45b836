// Command cadvisorpeer is the peer of the node cost benchmark
// (e2e BenchmarkPeer): the cAdvisor a kubelet embeds, set up as the kubelet
// sets it up, tracking the benchmark's cgroups and serving its Prometheus
// collector over HTTP. It is a module of its own (e2e/cadvisorpeer/go.mod)
// so that cAdvisor and its dependencies stay out of sandboxstats' module;
// internal/testenv builds it (BuildCadvisorPeer) and caches the binary.
//
// What it takes from the kubelet (kubernetes pkg/kubelet/cadvisor
// cadvisor_linux.go New, and pkg/kubelet/server/server.go for
// /metrics/cadvisor), at github.com/google/cadvisor v0.53.0:
//
//   - manager.New with an in-memory stats cache of 2 minutes
//     (statsCacheDuration), the real sysfs, the container handlers the
//     kubelet registers (containerd, CRI-O, systemd; none of them is
//     running here, so the raw cgroup handler takes the cgroups), the raw
//     cgroup prefix whitelist (the kubelet passes its cgroup roots:
//     /kubepods and the system cgroups; here --raw-cgroup-prefix, the
//     benchmark's parent cgroup), no env metadata, no perf events, no
//     resctrl;
//   - the metric set of the kubelet's manager and of its /metrics/cadvisor
//     collector: CPU usage and load, memory, disk I/O and usage, network,
//     app, process and OOM metrics; event storage off (the kubelet's flag
//     overrides event_storage_event_limit and event_storage_age_limit);
//   - metrics.NewPrometheusMachineCollector and metrics.NewPrometheusCollector
//     with the kubelet's request options (by name, the latest sample,
//     recursive from /) and label function (id, name, image and the pod,
//     namespace and container of a Kubernetes container) in a registry of
//     their own, served on /metrics with promhttp (ContinueOnError).
//
// What differs, and why: housekeeping is fixed (--housekeeping, 2 s by
// default, allow_dynamic false) where the kubelet asks for 15 s and lets
// cAdvisor stretch it, so that both sides of the benchmark sample every
// workload at the same interval; the kubelet's authentication, the rest of
// its HTTP server and the cloud-provider probes are not here. The process
// is only cAdvisor: the kubelet itself would add its own binary's pages and
// heap on top.
//
// What it reads per container sample (each housekeeping, every 2 s), so
// that the benchmark compares like with like (docs/design.md, "The node's
// cost beside the kubelet's cAdvisor"): runc's cgroup manager GetStats over
// every mounted v1 subsystem (cpu, cpuacct with per-CPU usage, cpuset,
// memory, blkio, pids, hugetlb), and for the process metrics cgroup.procs,
// each process's /proc/<pid>/fd and the first one's limits; the root
// container adds the host's network (/proc/<pid>/net/dev) and the root
// filesystem's usage. A scrape builds the series of every container from
// the cache's latest sample.
//
// Usage:
//
//	cadvisorpeer --listen 127.0.0.1:0 --raw-cgroup-prefix /mypods
//
// It prints "cadvisorpeer serving addr=HOST:PORT" once the manager started
// and the listener is open, and exits 0 on SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/google/cadvisor/cache/memory"
	cadvisormetrics "github.com/google/cadvisor/container"
	info "github.com/google/cadvisor/info/v1"
	v2 "github.com/google/cadvisor/info/v2"
	"github.com/google/cadvisor/manager"
	"github.com/google/cadvisor/metrics"
	"github.com/google/cadvisor/utils/sysfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/utils/clock"

	// The container handlers the kubelet registers.
	_ "github.com/google/cadvisor/container/containerd/install"
	_ "github.com/google/cadvisor/container/crio/install"
	_ "github.com/google/cadvisor/container/systemd/install"
)

// statsCacheDuration is the kubelet's: how long samples stay in memory.
const statsCacheDuration = 2 * time.Minute

// The kubelet's labels of a Kubernetes container (pkg/kubelet/types).
const (
	podNameLabel       = "io.kubernetes.pod.name"
	podNamespaceLabel  = "io.kubernetes.pod.namespace"
	containerNameLabel = "io.kubernetes.container.name"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "cadvisorpeer:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:0", "TCP address serving /metrics")
	prefixes := flag.String("raw-cgroup-prefix", "", "comma-separated cgroup path prefixes the raw handler tracks (the kubelet's cgroup roots)")
	housekeeping := flag.Duration("housekeeping", 2*time.Second, "fixed housekeeping interval of every container")
	// The kubelet's overrides of cAdvisor's flags: no event storage.
	for name, v := range map[string]string{"event_storage_event_limit": "default=0", "event_storage_age_limit": "default=0"} {
		if err := flag.Set(name, v); err != nil {
			return fmt.Errorf("cAdvisor flag %s: %w", name, err)
		}
	}
	flag.Parse()
	var whitelist []string
	if *prefixes != "" {
		whitelist = strings.Split(*prefixes, ",")
	}

	included := cadvisormetrics.MetricSet{
		cadvisormetrics.CpuUsageMetrics:     struct{}{},
		cadvisormetrics.MemoryUsageMetrics:  struct{}{},
		cadvisormetrics.CpuLoadMetrics:      struct{}{},
		cadvisormetrics.DiskIOMetrics:       struct{}{},
		cadvisormetrics.DiskUsageMetrics:    struct{}{},
		cadvisormetrics.NetworkUsageMetrics: struct{}{},
		cadvisormetrics.AppMetrics:          struct{}{},
		cadvisormetrics.ProcessMetrics:      struct{}{},
		cadvisormetrics.OOMMetrics:          struct{}{},
	}
	dynamic := false
	m, err := manager.New(memory.New(statsCacheDuration, nil), sysfs.NewRealSysFs(),
		manager.HousekeepingConfig{Interval: housekeeping, AllowDynamic: &dynamic},
		included, http.DefaultClient, whitelist, nil, "", 0)
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	if err := m.Start(); err != nil {
		return fmt.Errorf("manager start: %w", err)
	}
	defer m.Stop()

	r := prometheus.NewRegistry()
	r.MustRegister(metrics.NewPrometheusMachineCollector(m, included))
	r.MustRegister(metrics.NewPrometheusCollector(m, containerLabels, included, clock.RealClock{},
		v2.RequestOptions{IdType: v2.TypeName, Count: 1, Recursive: true}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(r, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("cadvisorpeer serving addr=%s\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// containerLabels is the kubelet's label function of /metrics/cadvisor
// (pkg/kubelet/server containerPrometheusLabelsFunc): the cgroup as id, its
// first alias as name, the image, and the pod, namespace and container of
// a Kubernetes container.
func containerLabels(c *info.ContainerInfo) map[string]string {
	var name, image, pod, namespace, containerName string
	if len(c.Aliases) > 0 {
		name = c.Aliases[0]
	}
	image = c.Spec.Image
	if v, ok := c.Spec.Labels[podNameLabel]; ok {
		pod = v
	}
	if v, ok := c.Spec.Labels[podNamespaceLabel]; ok {
		namespace = v
	}
	if v, ok := c.Spec.Labels[containerNameLabel]; ok {
		containerName = v
	}
	return map[string]string{
		metrics.LabelID:    c.Name,
		metrics.LabelName:  name,
		metrics.LabelImage: image,
		"pod":              pod,
		"namespace":        namespace,
		"container":        containerName,
	}
}
