package nodeagent

// This file serves the per-container series under cAdvisor's names and
// labels (--cadvisor-compat), so that rules written for the kubelet's
// /metrics/cadvisor (kube-prometheus-stack's
// node_namespace_pod_container:container_cpu_usage_seconds_total:sum_irate
// and the container_memory_* ones) give sandboxed pods their real values.
// namespace and pod are the actor's namespace and name (the NRI bridge
// names an actor after its pod), container the container's name (its id
// when statsd has no name). image is cadvisorImage: statsd is not told a
// container's image, and the rules select image!="" (the kubelet's rows of
// a pod's own cgroup have no image).

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sandboxstats/sandboxstats/internal/rate"
)

// cadvisorImage is the image label of the cAdvisor-shaped series.
const cadvisorImage = "(sandboxstats)"

// cadvisorPod is the container label under which the sandbox's own share
// (rate.CounterSandboxOwnCPU) is exported in container_cpu_usage_seconds_total:
// the name cAdvisor gave a pod's sandbox (pause) container under
// dockershim. kube-prometheus's per-container rule, summed by pod, then
// gives the pod's CPU (containers + own), as for a runc pod with its pause
// container; tools that want the application containers only already
// leave "POD" out (VPA's Prometheus history); it stays apart from the
// kubelet's own pause row under containerd (container=""). A Kubernetes
// container's name is a lowercase DNS label: never "POD".
const cadvisorPod = "POD"

// cadvisorKey is the cAdvisor-shaped series of container name of the
// actor namespace/pod.
func cadvisorKey(namespace, pod, name string) containerKey {
	return containerKey{labels: labelSet{actorNamespace: cut(namespace), actorName: cut(pod)}, container: name, cadvisor: true}
}

// chargeCAdvisorPod adds the sandbox's own share in charges (a sample's or
// an ended record's, of the actor namespace/pod) to its container="POD"
// series; nothing without CAdvisorCompat or when charges have none (absent
// stays absent).
func (m *metrics) chargeCAdvisorPod(namespace, pod string, charges rate.Charges, now time.Time) {
	if m.cadvisor == nil {
		return
	}
	c, ok := charges.Of(rate.CounterID{Counter: rate.CounterSandboxOwnCPU})
	if !ok {
		return
	}
	cv := m.containerSeries(cadvisorKey(namespace, pod, cadvisorPod), now)
	cv.cpu = addSat(cv.cpu, c.Value)
}

// cAdvisor's names.
const (
	metricCAdvisorCPU        = "container_cpu_usage_seconds_total"
	metricCAdvisorMemory     = "container_memory_usage_bytes"
	metricCAdvisorWorkingSet = "container_memory_working_set_bytes"
)

var cadvisorLabels = []string{"namespace", "pod", "container", "image"}

type cadvisorDescs struct {
	cpu, memory, wset *prometheus.Desc
}

func newCAdvisorDescs() *cadvisorDescs {
	return &cadvisorDescs{
		cpu: prometheus.NewDesc(metricCAdvisorCPU,
			"cAdvisor's name (--cadvisor-compat): "+metricContainerCPU+" by namespace, pod (the actor's) and container (its name: a container restarted and its exited predecessor are one series), summed over the workloads that share them; container=\"POD\": the sandbox's own share ("+metricSandboxOwnCPU+").", cadvisorLabels, nil),
		memory: prometheus.NewDesc(metricCAdvisorMemory,
			"cAdvisor's name (--cadvisor-compat): "+metricContainerMemory+"; absent where the source has no figure of the container's own.", cadvisorLabels, nil),
		wset: prometheus.NewDesc(metricCAdvisorWorkingSet,
			"cAdvisor's name (--cadvisor-compat): "+metricContainerWorkingSet+"; absent where the source has none of the container's own.", cadvisorLabels, nil),
	}
}

// containerDescs are the descriptors of the per-container series.
func (m *metrics) containerDescs() []*prometheus.Desc {
	ds := []*prometheus.Desc{m.descCtrCPU, m.descCtrCur, m.descCtrWS, m.descCtrPids}
	if m.cadvisor != nil {
		ds = append(ds, m.cadvisor.cpu, m.cadvisor.memory, m.cadvisor.wset)
	}
	return ds
}

// collectContainers sends snap's per-container series.
func (m *metrics) collectContainers(ch chan<- prometheus.Metric, snap *snapshot) {
	names := append(m.labelNames[:len(m.labelNames):len(m.labelNames)], "container")
	for k, cv := range snap.containers {
		var (
			pairs                []*dto.LabelPair
			err                  error
			cpu, cur, wset, pids *prometheus.Desc
		)
		if k.cadvisor {
			if m.cadvisor == nil {
				continue
			}
			pairs, err = labelPairs(cadvisorLabels, []string{k.labels.actorNamespace, k.labels.actorName, k.container, cadvisorImage})
			cpu, cur, wset = m.cadvisor.cpu, m.cadvisor.memory, m.cadvisor.wset
		} else {
			pairs, err = labelPairs(names, append(k.labels.values(m.cfg.LabelActor), k.container))
			cpu, cur, wset, pids = m.descCtrCPU, m.descCtrCur, m.descCtrWS, m.descCtrPids
		}
		send := func(d *prometheus.Desc, t prometheus.ValueType, v float64) {
			if err != nil {
				ch <- prometheus.NewInvalidMetric(d, err)
				return
			}
			s := newSnapMetric(d, t, v, pairs)
			if t == prometheus.CounterValue {
				s.count.CreatedTimestamp = timestamppb.New(cv.start)
			}
			ch <- s
		}
		send(cpu, prometheus.CounterValue, float64(cv.cpu)/1e6)
		if !cv.sampled || !cv.running {
			continue // charged at an end, not in the last sweep, or exited: no gauges
		}
		if !cv.noCurrent {
			send(cur, prometheus.GaugeValue, float64(cv.current))
		}
		if !cv.noWset {
			send(wset, prometheus.GaugeValue, float64(cv.wset))
		}
		if pids != nil && !cv.noPids {
			send(pids, prometheus.GaugeValue, float64(cv.pids))
		}
	}
}
