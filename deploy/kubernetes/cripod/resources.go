package cripod

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The kubelet's constants (pkg/kubelet/cm, pkg/kubelet/qos).
const (
	minShares             = 2
	sharesPerCPU          = 1024
	milliCPUToCPU         = 1000
	quotaPeriod           = 100000 // µs
	minQuotaPeriod        = 1000
	guaranteedOOMScoreAdj = -997
	besteffortOOMScoreAdj = 1000
)

// resources are the container's cgroup settings (the kubelet's
// generateLinuxContainerResources on cgroup v1: no swap setting): CPU
// shares from the request, a CFS quota from the limit, the memory limit,
// and the OOM score of the pod's QoS class.
func (p *Pod) resources(c corev1.Container) *runtimeapi.LinuxContainerResources {
	r := &runtimeapi.LinuxContainerResources{}
	req, lim := c.Resources.Requests, c.Resources.Limits
	cpuReq := req.Cpu().MilliValue()
	if _, ok := req[corev1.ResourceCPU]; !ok {
		if l, ok := lim[corev1.ResourceCPU]; ok { // a limit alone is the request too
			cpuReq = l.MilliValue()
		}
	}
	r.CpuShares = max(minShares, cpuReq*sharesPerCPU/milliCPUToCPU)
	if l, ok := lim[corev1.ResourceCPU]; ok {
		r.CpuPeriod = quotaPeriod
		r.CpuQuota = max(minQuotaPeriod, l.MilliValue()*quotaPeriod/milliCPUToCPU)
	}
	if l, ok := lim[corev1.ResourceMemory]; ok {
		r.MemoryLimitInBytes = l.Value()
	}
	r.OomScoreAdj = p.oomScoreAdj(c)
	return r
}

// qos is the pod's QoS class (pkg/apis/core/v1/helper/qos).
func (p *Pod) qos() corev1.PodQOSClass {
	requests, limits := false, false
	guaranteed := true
	for _, c := range slices.Concat(p.spec.InitContainers, p.spec.Containers) {
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			r, hasReq := c.Resources.Requests[name]
			l, hasLim := c.Resources.Limits[name]
			requests = requests || hasReq && !r.IsZero()
			limits = limits || hasLim && !l.IsZero()
			if !hasLim || hasReq && r.Cmp(l) != 0 {
				guaranteed = false
			}
		}
	}
	switch {
	case !requests && !limits:
		return corev1.PodQOSBestEffort
	case guaranteed:
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

// oomScoreAdj is the container's oom_score_adj (pkg/kubelet/qos
// GetContainerOOMScoreAdjust; no node-critical priority here).
func (p *Pod) oomScoreAdj(c corev1.Container) int64 {
	switch p.qos() {
	case corev1.PodQOSGuaranteed:
		return guaranteedOOMScoreAdj
	case corev1.PodQOSBestEffort:
		return besteffortOOMScoreAdj
	}
	adj := int64(besteffortOOMScoreAdj - 1)
	if p.opts.NodeMemoryBytes > 0 {
		adj = 1000 - 1000*c.Resources.Requests.Memory().Value()/p.opts.NodeMemoryBytes
	}
	if adj < 1000+guaranteedOOMScoreAdj {
		return 1000 + guaranteedOOMScoreAdj
	}
	if adj == besteffortOOMScoreAdj {
		return adj - 1
	}
	return adj
}
