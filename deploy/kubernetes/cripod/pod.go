package cripod

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Options are what a node decides about a pod, beside its spec.
type Options struct {
	// Name and UID are the pod's (the DaemonSet controller names a pod
	// <daemonset>-<5 characters>); both required.
	Name, UID string
	// NodeName is the node's name (spec.nodeName, the fieldRef).
	NodeName string
	// PodDir is the pod's directory on the node, the kubelet's
	// /var/lib/kubelet/pods/<uid>: its emptyDirs, ConfigMap volumes,
	// termination-message files and container logs are made below it.
	// Required, absolute.
	PodDir string
	// HostPaths moves host paths: a hostPath volume whose path is a key or
	// lies below one is taken from the value instead (the longest key
	// wins). For a node whose directories are elsewhere (a test's
	// temporary directory); nil: every path is the node's own.
	HostPaths map[string]string
	// NodeNetwork runs the pod in the node's network namespace although its
	// spec does not ask for it: for a runtime without CNI (no pod network).
	// The pod then gets no hostname of its own, and its ports are the
	// node's.
	NodeNetwork bool
	// CgroupParent is the sandbox's linux.cgroup_parent (the kubelet's
	// kubepods/<qos>/pod<uid>); "": the runtime's default.
	CgroupParent string
	// WithoutSeccomp leaves every seccomp profile out: for a runtime built
	// without seccomp (a runc without libseccomp refuses any profile). The
	// pod then runs with more system calls allowed than on a node, never
	// fewer.
	WithoutSeccomp bool
	// RecursiveReadOnlyMounts: the runtime handler reports the
	// RecursiveReadOnlyMounts feature (CRI RuntimeStatus, its handlers'
	// features; crictl info's runtimeHandlers). A volume mount's
	// recursiveReadOnly is resolved by it as the kubelet does: IfPossible
	// is recursive only if set, Enabled fails without it.
	RecursiveReadOnlyMounts bool
	// KubernetesService is the ClusterIP:port of the Service kubernetes in
	// the namespace default, which the kubelet gives every container as
	// KUBERNETES_SERVICE_HOST and the rest, service links or not; "":
	// 10.96.0.1:443 (kubeadm's default service range's first address).
	KubernetesService string
	// NodeMemoryBytes is the node's memory capacity, for the oom_score_adj
	// of a Burstable pod's containers; 0 gives them 999 (as for a request of
	// nothing).
	NodeMemoryBytes int64
}

// Pod is a pod as the kubelet hands it to the runtime.
type Pod struct {
	Sandbox        *runtimeapi.PodSandboxConfig
	InitContainers []*Container // run one after the other to completion, first
	Containers     []*Container
	Volumes        []Volume // what Materialize makes on the node

	spec corev1.PodSpec
	opts Options
	env  map[string]*corev1.ConfigMap
}

// Container is one container's config at its first attempt.
type Container struct {
	Name   string
	Config *runtimeapi.ContainerConfig
}

// ErrUnsupported marks a pod field this package does not translate (and a
// kubelet would): the pod would not run as the manifest says.
var ErrUnsupported = errors.New("cripod: not supported")

// FromDaemonSet translates ds's pod template as the kubelet would for a pod
// of it on this node, with the ConfigMaps configMaps (by name) for its
// volumes and environment.
func FromDaemonSet(ds *appsv1.DaemonSet, configMaps map[string]*corev1.ConfigMap, opts Options) (*Pod, error) {
	if opts.Name == "" || opts.UID == "" || !filepath.IsAbs(opts.PodDir) {
		return nil, errors.New("cripod: Options.Name, UID and an absolute PodDir are required")
	}
	spec := ds.Spec.Template.Spec
	if err := supported(spec); err != nil {
		return nil, err
	}
	p := &Pod{spec: spec, opts: opts, env: configMaps}
	meta := ds.Spec.Template.ObjectMeta
	ns := ds.Namespace
	if ns == "" {
		ns = "default"
	}
	vols, err := p.volumes(configMaps)
	if err != nil {
		return nil, err
	}
	p.Volumes = vols
	p.Sandbox = p.sandbox(meta.Labels, meta.Annotations, ns)
	for _, c := range spec.InitContainers {
		cc, err := p.container(c, ns)
		if err != nil {
			return nil, err
		}
		p.InitContainers = append(p.InitContainers, cc)
	}
	for _, c := range spec.Containers {
		cc, err := p.container(c, ns)
		if err != nil {
			return nil, err
		}
		p.Containers = append(p.Containers, cc)
	}
	return p, nil
}

// supported refuses the pod fields this package does not translate.
func supported(spec corev1.PodSpec) error {
	var bad []string
	if spec.HostUsers != nil && !*spec.HostUsers {
		bad = append(bad, "hostUsers")
	}
	if spec.RuntimeClassName != nil {
		bad = append(bad, "runtimeClassName")
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		bad = append(bad, "the service account token (set automountServiceAccountToken: false)")
	}
	if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
		bad = append(bad, "service links (set enableServiceLinks: false)")
	}
	if spec.DNSConfig != nil {
		bad = append(bad, "dnsConfig")
	}
	if len(spec.HostAliases) > 0 {
		bad = append(bad, "hostAliases")
	}
	if len(spec.EphemeralContainers) > 0 {
		bad = append(bad, "ephemeralContainers")
	}
	// fsGroup: the kubelet also chowns and setgids the pod's volumes to
	// it (SetVolumeOwnership), which this package does not do.
	if sc := spec.SecurityContext; sc != nil && (sc.SELinuxOptions != nil || sc.AppArmorProfile != nil || sc.WindowsOptions != nil ||
		sc.SupplementalGroupsPolicy != nil || sc.FSGroup != nil || sc.FSGroupChangePolicy != nil) {
		bad = append(bad, "securityContext (SELinux, AppArmor, Windows, supplementalGroupsPolicy, fsGroup or fsGroupChangePolicy)")
	}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		if c.RestartPolicy != nil {
			bad = append(bad, c.Name+": restartPolicy (sidecar)")
		}
		if len(c.VolumeDevices) > 0 || c.ResizePolicy != nil || c.Stdin || c.TTY {
			bad = append(bad, c.Name+": volumeDevices, resizePolicy, stdin or tty")
		}
		if sc := c.SecurityContext; sc != nil && (sc.SELinuxOptions != nil || sc.AppArmorProfile != nil || sc.WindowsOptions != nil || sc.ProcMount != nil) {
			bad = append(bad, c.Name+": securityContext (SELinux, AppArmor, Windows or procMount)")
		}
		for _, m := range c.VolumeMounts {
			if m.SubPathExpr != "" {
				bad = append(bad, c.Name+": volumeMount "+m.Name+" (subPathExpr)")
			}
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %s", ErrUnsupported, strings.Join(bad, "; "))
	}
	return nil
}

// sandbox is the PodSandboxConfig (the kubelet's generatePodSandboxConfig).
func (p *Pod) sandbox(labels, annotations map[string]string, ns string) *runtimeapi.PodSandboxConfig {
	spec := p.spec
	l := map[string]string{}
	for k, v := range labels {
		l[k] = v
	}
	l["io.kubernetes.pod.name"] = p.opts.Name
	l["io.kubernetes.pod.namespace"] = ns
	l["io.kubernetes.pod.uid"] = p.opts.UID
	a := map[string]string{}
	for k, v := range annotations {
		a[k] = v
	}
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: p.opts.Name, Namespace: ns, Uid: p.opts.UID, Attempt: 0},
		LogDirectory: filepath.Join(p.opts.PodDir, "logs"),
		Labels:       l,
		Annotations:  a,
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent:    p.opts.CgroupParent,
			SecurityContext: p.sandboxSecurity(),
		},
	}
	if !p.hostNetwork() {
		cfg.Hostname = p.opts.Name
		if spec.Hostname != "" {
			cfg.Hostname = spec.Hostname
		}
	}
	if sc := spec.SecurityContext; sc != nil && len(sc.Sysctls) > 0 {
		cfg.Linux.Sysctls = map[string]string{}
		for _, s := range sc.Sysctls {
			cfg.Linux.Sysctls[s.Name] = s.Value
		}
	}
	for _, c := range spec.Containers {
		for _, port := range c.Ports {
			cfg.PortMappings = append(cfg.PortMappings, &runtimeapi.PortMapping{
				Protocol:      protocol(port.Protocol),
				ContainerPort: port.ContainerPort,
				HostPort:      port.HostPort,
				HostIp:        port.HostIP,
			})
		}
	}
	return cfg
}

func protocol(p corev1.Protocol) runtimeapi.Protocol {
	switch p {
	case corev1.ProtocolUDP:
		return runtimeapi.Protocol_UDP
	case corev1.ProtocolSCTP:
		return runtimeapi.Protocol_SCTP
	}
	return runtimeapi.Protocol_TCP
}

// hostNetwork: the pod is in the node's network namespace, by its spec or
// by Options.NodeNetwork.
func (p *Pod) hostNetwork() bool { return p.spec.HostNetwork || p.opts.NodeNetwork }

// namespaces are the pod's namespace modes (the kubelet's
// namespacesForPod): the network and IPC the pod's or the node's; PID the
// container's own unless the node's (hostPID) or the pod's
// (shareProcessNamespace).
func (p *Pod) namespaces() *runtimeapi.NamespaceOption {
	ns := &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_POD, Pid: runtimeapi.NamespaceMode_CONTAINER, Ipc: runtimeapi.NamespaceMode_POD}
	if p.hostNetwork() {
		ns.Network = runtimeapi.NamespaceMode_NODE
	}
	if p.spec.HostIPC {
		ns.Ipc = runtimeapi.NamespaceMode_NODE
	}
	switch {
	case p.spec.HostPID:
		ns.Pid = runtimeapi.NamespaceMode_NODE
	case p.spec.ShareProcessNamespace != nil && *p.spec.ShareProcessNamespace:
		ns.Pid = runtimeapi.NamespaceMode_POD
	}
	return ns
}

// container is one container's ContainerConfig (the kubelet's
// generateContainerConfig), attempt 0.
func (p *Pod) container(c corev1.Container, ns string) (*Container, error) {
	env, err := p.environment(c, ns)
	if err != nil {
		return nil, err
	}
	mounts, err := p.mounts(c)
	if err != nil {
		return nil, err
	}
	vars := map[string]string{}
	for _, kv := range env {
		vars[kv.Key] = string(kv.Value)
	}
	ports := "[]"
	if len(c.Ports) > 0 {
		var b strings.Builder
		for i, port := range c.Ports {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"name":%q,"containerPort":%d,"protocol":%q}`, port.Name, port.ContainerPort, port.Protocol)
		}
		ports = "[" + b.String() + "]"
	}
	grace := int64(30)
	if p.spec.TerminationGracePeriodSeconds != nil {
		grace = *p.spec.TerminationGracePeriodSeconds
	}
	termPath := c.TerminationMessagePath
	if termPath == "" {
		termPath = corev1.TerminationMessagePathDefault
	}
	cfg := &runtimeapi.ContainerConfig{
		Metadata:   &runtimeapi.ContainerMetadata{Name: c.Name, Attempt: 0},
		Image:      &runtimeapi.ImageSpec{Image: c.Image, UserSpecifiedImage: c.Image},
		Command:    expandAll(c.Command, vars),
		Args:       expandAll(c.Args, vars),
		WorkingDir: c.WorkingDir,
		Envs:       env,
		Mounts:     mounts,
		Labels: map[string]string{
			"io.kubernetes.container.name": c.Name,
			"io.kubernetes.pod.name":       p.opts.Name,
			"io.kubernetes.pod.namespace":  ns,
			"io.kubernetes.pod.uid":        p.opts.UID,
		},
		Annotations: map[string]string{
			"io.kubernetes.container.restartCount":             "0",
			"io.kubernetes.container.terminationMessagePath":   termPath,
			"io.kubernetes.container.terminationMessagePolicy": string(orDefault(c.TerminationMessagePolicy, corev1.TerminationMessageReadFile)),
			"io.kubernetes.container.ports":                    ports,
			"io.kubernetes.pod.terminationGracePeriod":         strconv.FormatInt(grace, 10),
		},
		LogPath: filepath.Join(c.Name, "0.log"),
		Linux: &runtimeapi.LinuxContainerConfig{
			Resources:       p.resources(c),
			SecurityContext: p.containerSecurity(c),
		},
	}
	return &Container{Name: c.Name, Config: cfg}, nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Restarted is the config of the container's restart number n (n >= 1), as
// the kubelet makes it after the container exited: the same config, its
// attempt and restart count n, its log n.log.
func (c *Container) Restarted(n uint32) *runtimeapi.ContainerConfig {
	cfg := proto.Clone(c.Config).(*runtimeapi.ContainerConfig)
	cfg.Metadata.Attempt = n
	cfg.Annotations["io.kubernetes.container.restartCount"] = strconv.FormatUint(uint64(n), 10)
	cfg.LogPath = filepath.Join(c.Name, strconv.FormatUint(uint64(n), 10)+".log")
	return cfg
}
