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
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// cadvisorImage is the image label of the cAdvisor-shaped series.
const cadvisorImage = "(sandboxstats)"

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
			"cAdvisor's name (--cadvisor-compat): "+metricContainerCPU+" by namespace, pod (the actor's) and container, summed over the workloads that share them.", cadvisorLabels, nil),
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
		if !cv.sampled {
			continue // charged at an end, not in the last sweep: no gauges
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
