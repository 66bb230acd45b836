package cripod

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The paths the kubelet masks and makes read-only in a container's /proc
// and /sys unless it is privileged (k8s.io/kubernetes pkg/securitycontext,
// ProcMount Default).
var (
	defaultMaskedPaths = []string{"/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
		"/sys/firmware", "/sys/devices/virtual/powercap"}
	defaultReadonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// sandboxSecurity is the sandbox's security context: the pod's namespaces,
// user, groups and seccomp profile, privileged if any container is.
func (p *Pod) sandboxSecurity() *runtimeapi.LinuxSandboxSecurityContext {
	sc := &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: p.namespaces()}
	psc := p.spec.SecurityContext
	if psc != nil {
		sc.RunAsUser = int64Value(psc.RunAsUser)
		sc.RunAsGroup = int64Value(psc.RunAsGroup)
		sc.Seccomp = seccomp(psc.SeccompProfile)
	}
	if p.opts.WithoutSeccomp {
		sc.Seccomp = nil
	}
	sc.SupplementalGroups = p.supplementalGroups()
	for _, c := range slices.Concat(p.spec.InitContainers, p.spec.Containers) {
		if c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
			sc.Privileged = true
		}
	}
	return sc
}

// supplementalGroups are the pod's supplementalGroups (an fsGroup is
// refused: supported).
func (p *Pod) supplementalGroups() []int64 {
	psc := p.spec.SecurityContext
	if psc == nil {
		return nil
	}
	return slices.Clone(psc.SupplementalGroups)
}

// containerSecurity is the container's security context (the kubelet's
// determineEffectiveSecurityContext and convertToRuntimeSecurityContext):
// the container's settings over the pod's.
func (p *Pod) containerSecurity(c corev1.Container) *runtimeapi.LinuxContainerSecurityContext {
	psc := p.spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	csc := c.SecurityContext
	if csc == nil {
		csc = &corev1.SecurityContext{}
	}
	sc := &runtimeapi.LinuxContainerSecurityContext{
		NamespaceOptions:   p.namespaces(),
		RunAsUser:          int64Value(first(csc.RunAsUser, psc.RunAsUser)),
		RunAsGroup:         int64Value(first(csc.RunAsGroup, psc.RunAsGroup)),
		SupplementalGroups: p.supplementalGroups(),
		Seccomp:            seccomp(first(csc.SeccompProfile, psc.SeccompProfile)),
	}
	if p.opts.WithoutSeccomp {
		sc.Seccomp = nil
	}
	if csc.Privileged != nil {
		sc.Privileged = *csc.Privileged
	}
	if csc.ReadOnlyRootFilesystem != nil {
		sc.ReadonlyRootfs = *csc.ReadOnlyRootFilesystem
	}
	// AllowPrivilegeEscalation false is no_new_privs; unset is the
	// runtime's default (privileges may be gained).
	if csc.AllowPrivilegeEscalation != nil {
		sc.NoNewPrivs = !*csc.AllowPrivilegeEscalation
	}
	if caps := csc.Capabilities; caps != nil {
		sc.Capabilities = &runtimeapi.Capability{}
		for _, a := range caps.Add {
			sc.Capabilities.AddCapabilities = append(sc.Capabilities.AddCapabilities, string(a))
		}
		for _, d := range caps.Drop {
			sc.Capabilities.DropCapabilities = append(sc.Capabilities.DropCapabilities, string(d))
		}
	}
	if !sc.Privileged {
		sc.MaskedPaths = slices.Clone(defaultMaskedPaths)
		sc.ReadonlyPaths = slices.Clone(defaultReadonlyPaths)
	}
	return sc
}

// first is the first of a and b that is not nil.
func first[T any](a, b *T) *T {
	if a != nil {
		return a
	}
	return b
}

func int64Value(v *int64) *runtimeapi.Int64Value {
	if v == nil {
		return nil
	}
	return &runtimeapi.Int64Value{Value: *v}
}

// seccomp is the runtime's profile for a pod's: none (the kubelet's
// SeccompDefault off) is Unconfined.
func seccomp(p *corev1.SeccompProfile) *runtimeapi.SecurityProfile {
	if p == nil {
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Unconfined}
	}
	switch p.Type {
	case corev1.SeccompProfileTypeRuntimeDefault:
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault}
	case corev1.SeccompProfileTypeLocalhost:
		ref := ""
		if p.LocalhostProfile != nil {
			ref = *p.LocalhostProfile
		}
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Localhost, LocalhostRef: ref}
	}
	return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Unconfined}
}
