package nribridge

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"

	ssapi "github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/foreign"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// The bounds statsd puts on what the bridge sends (internal/identity's
// validator; a test runs it on the mapping's output).
const (
	maxActorUIDBytes  = 128
	maxIdentityBytes  = 253
	maxContainers     = 25  // SandboxRef.containers
	maxContainerBytes = 128 // ContainerRef.id
	maxPathBytes      = 4096
)

// Kind is how the pods of a watched runtime handler are measured.
type Kind int

const (
	// KindCgroup: the pod's cgroup (its cgroup parent, the pod-level cgroup
	// holding every container; else the sandbox's cgroups path), sent as a
	// gVisor-class cgroup_path. Any watched handler that is neither gVisor
	// nor Kata: runc stands in for a sandbox in tests.
	KindCgroup Kind = iota + 1
	// KindGVisor: the sentry's pid (NRI's pod pid for runsc), statsd finding
	// its cgroup; the sandbox's cgroups path when the pid is 0.
	KindGVisor
	// KindKata: the guest agent's address and the VMM's pid from Kata's
	// per-sandbox layout, the pod's containers (with the sandbox's own) as the
	// guest's containers.
	KindKata
)

// String is the kind's name in logs and metrics.
func (k Kind) String() string {
	switch k {
	case KindCgroup:
		return "cgroup"
	case KindGVisor:
		return "gvisor"
	case KindKata:
		return "kata"
	default:
		return "unwatched"
	}
}

// Source says where a template comes from: a pod label or annotation.
type Source struct {
	Annotation bool
	Key        string
}

// String is the source as ParseSource reads it.
func (s Source) String() string {
	if s.Annotation {
		return "annotation:" + s.Key
	}
	return "label:" + s.Key
}

// ParseSource reads "label:KEY" or "annotation:KEY".
func ParseSource(s string) (Source, error) {
	kind, key, ok := strings.Cut(s, ":")
	switch {
	case !ok || key == "":
		return Source{}, fmt.Errorf("%q: want label:KEY or annotation:KEY", s)
	case kind == "label":
		return Source{Key: key}, nil
	case kind == "annotation":
		return Source{Annotation: true, Key: key}, nil
	default:
		return Source{}, fmt.Errorf("%q: %q is neither label nor annotation", s, kind)
	}
}

// Config is the mapping's configuration.
type Config struct {
	// Handlers are the runtime handlers whose pods are bound: globs
	// (path.Match) of RuntimeClass handler names. Pods of any other handler
	// are ignored.
	Handlers []string
	// GVisorHandlers and KataHandlers are globs naming the watched handlers
	// of each kind; a watched handler in neither is KindCgroup.
	GVisorHandlers []string
	KataHandlers   []string
	// DefaultRuntime is the name an empty handler stands for (the runtime
	// handler of pods without a RuntimeClass: containerd's
	// default_runtime_name, "runc"). It is matched as that name.
	DefaultRuntime string
	// Templates are where a pod's template is read, first present wins: a
	// value "namespace/name", or "name" (the template's namespace is then
	// the pod's). None present: no template.
	Templates []Source
}

// Validate checks the globs.
func (c Config) Validate() error {
	for _, list := range [][]string{c.Handlers, c.GVisorHandlers, c.KataHandlers} {
		for _, g := range list {
			if _, err := path.Match(g, ""); err != nil {
				return fmt.Errorf("handler glob %q: %w", g, err)
			}
		}
	}
	return nil
}

// HandlerName is the handler a pod ran with, DefaultRuntime for an empty one.
func (c Config) HandlerName(handler string) string {
	if handler == "" {
		return c.DefaultRuntime
	}
	return handler
}

// KindOf returns the kind of a pod's runtime handler, or 0 when it is not
// watched.
func (c Config) KindOf(handler string) Kind {
	h := c.HandlerName(handler)
	if !matchAny(c.Handlers, h) {
		return 0
	}
	switch {
	case matchAny(c.KataHandlers, h):
		return KindKata
	case matchAny(c.GVisorHandlers, h):
		return KindGVisor
	default:
		return KindCgroup
	}
}

func matchAny(globs []string, s string) bool {
	return slices.ContainsFunc(globs, func(g string) bool {
		ok, _ := path.Match(g, s)
		return ok
	})
}

// Unmappable is a pod the bridge cannot bind: Reason is the metric label,
// the error says why.
type Unmappable struct {
	Reason string
	Err    error
}

func (u *Unmappable) Error() string { return u.Err.Error() }
func (u *Unmappable) Unwrap() error { return u.Err }

func unmappable(reason, format string, args ...any) error {
	return &Unmappable{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// ReasonOf returns the Unmappable reason of err, or "" when it is not one.
func ReasonOf(err error) string {
	var u *Unmappable
	if errors.As(err, &u) {
		return u.Reason
	}
	return ""
}

// ValidUID reports why a pod uid cannot be an actor uid (1 to 128 bytes of
// printable ASCII without space), or nil. A uid is never cut: two pods
// would share one actor.
func ValidUID(uid string) error {
	switch {
	case uid == "":
		return unmappable("invalid-pod-uid", "the pod has no uid")
	case len(uid) > maxActorUIDBytes:
		return unmappable("invalid-pod-uid", "pod uid %s is %d bytes, more than %d", foreign.Quote(uid), len(uid), maxActorUIDBytes)
	case strings.IndexFunc(uid, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0:
		return unmappable("invalid-pod-uid", "pod uid %s is not printable ASCII", foreign.Quote(uid))
	}
	return nil
}

// IdentityOf is the workload identity of a pod: actor uid = the pod uid,
// name and namespace the pod's, the template from the first of
// c.Templates the pod carries. Foreign text is made printable ASCII and cut
// to statsd's 253 bytes here, where it enters.
func (c Config) IdentityOf(pod *api.PodSandbox) (*sandboxstatsv1.WorkloadIdentity, error) {
	if err := ValidUID(pod.GetUid()); err != nil {
		return nil, err
	}
	id := &sandboxstatsv1.WorkloadIdentity{
		ActorUid:       pod.GetUid(),
		ActorName:      foreign.ASCII(pod.GetName(), maxIdentityBytes),
		ActorNamespace: foreign.ASCII(pod.GetNamespace(), maxIdentityBytes),
	}
	for _, src := range c.Templates {
		m := pod.GetLabels()
		if src.Annotation {
			m = pod.GetAnnotations()
		}
		v := m[src.Key]
		if v == "" {
			continue
		}
		ns, name, ok := strings.Cut(v, "/")
		if !ok {
			ns, name = pod.GetNamespace(), v
		}
		id.TemplateNamespace = foreign.ASCII(ns, maxIdentityBytes)
		id.TemplateName = foreign.ASCII(name, maxIdentityBytes)
		break
	}
	return id, nil
}

// Sandbox is what the bridge knows of a pod's sandbox from NRI: enough to
// make its SandboxRef (with Kata's layout for a Kata pod).
type Sandbox struct {
	Kind Kind
	// ID is the pod sandbox id (containerd's; Kata's sandbox and its pause
	// container's id in the guest).
	ID string
	// PID is NRI's pod pid: the sentry for runsc, the VMM for Kata, the
	// pause process for runc; 0 when the sandbox has no task.
	PID uint32
	// CgroupsPath is the sandbox's cgroups path and CgroupParent the
	// pod-level cgroup, both as NRI gives them (cgroupfs paths, or
	// systemd's "slice:prefix:name" and "name.slice").
	CgroupsPath  string
	CgroupParent string
}

// SandboxOf is the sandbox part of a pod of kind k.
func SandboxOf(k Kind, pod *api.PodSandbox) Sandbox {
	return Sandbox{
		Kind:         k,
		ID:           pod.GetId(),
		PID:          pod.GetPid(),
		CgroupsPath:  pod.GetLinux().GetCgroupsPath(),
		CgroupParent: pod.GetLinux().GetCgroupParent(),
	}
}

// Kata is a Kata sandbox as its per-sandbox layout describes it (see
// KataLayout.Resolve).
type Kata struct {
	// AgentAddress is the guest agent's address as statsd takes it:
	// hvsock://<path>:<port> or vsock://<cid>:<port>.
	AgentAddress string
	// VMMPID is the hypervisor's pid (0: unknown).
	VMMPID int
	// Hypervisor is Kata's name of it (clh, firecracker, qemu), for logs.
	Hypervisor string
}

// RefOf is the SandboxRef of a sandbox. kata is the resolved layout of a
// Kata sandbox (ignored for the other kinds); containers are the pod's
// application containers (ContainerRefs), passed as
// SandboxRef.containers for every kind. Kata's ids go as container_ids
// too, in the same order: a statsd older than containers (a rolling
// upgrade that updates the bridge first) reads those and ignores the
// field it does not know; a newer one checks that both agree.
func RefOf(s Sandbox, containers []Container, kata Kata) (*sandboxstatsv1.SandboxRef, error) {
	refs, _, err := ContainerRefs(s, containers)
	if err != nil {
		return nil, err
	}
	switch s.Kind {
	case KindGVisor:
		if s.PID != 0 {
			if s.PID > 1<<31-1 {
				return nil, unmappable("invalid-pid", "sandbox %s: pid %d out of range", foreign.Quote(s.ID), s.PID)
			}
			return &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, SentryPid: int32(s.PID), Containers: refs}, nil
		}
		p, err := CgroupPath(s.CgroupsPath)
		if err != nil {
			return nil, fmt.Errorf("sandbox %s has no pid: %w", foreign.Quote(s.ID), err)
		}
		return &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: p, Containers: refs}, nil
	case KindCgroup:
		from := s.CgroupParent
		if from == "" {
			from = s.CgroupsPath
		}
		p, err := CgroupPath(from)
		if err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", foreign.Quote(s.ID), err)
		}
		return &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, CgroupPath: p, Containers: refs}, nil
	case KindKata:
		ref := &sandboxstatsv1.SandboxRef{
			SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM,
			AgentAddress: kata.AgentAddress,
			ContainerIds: ssapi.ContainerIDs(refs),
			Containers:   refs,
		}
		vmm := kata.VMMPID
		if vmm == 0 && s.PID <= 1<<31-1 {
			vmm = int(s.PID)
		}
		if vmm > 0 && vmm <= 1<<31-1 {
			ref.VmmPid = int32(vmm)
		}
		return ref, nil
	default:
		return nil, unmappable("unwatched", "sandbox %s: handler not watched", foreign.Quote(s.ID))
	}
}

// Container is an application container of a pod as NRI tells of it (the
// pause container is the sandbox, never one).
type Container struct {
	// ID is the runtime's container id: the CRI's, which is runsc's
	// container id for a runsc pod and the guest agent's for a Kata pod.
	ID string
	// Name is the container's name in the pod spec (NRI's Container.name).
	Name string
}

// ContainerRefs are the containers statsd is given for a pod
// (SandboxRef.containers, UpdateWorkloadContainers): for Kata the
// sandbox's own first (the pause container in the guest, which statsd
// sums too; no name), then the pod's containers in the order given (the
// order the bridge learnt of them), at most 25 in all, names made
// printable ASCII and cut to 253 bytes. It also returns how many were left
// out (over 25, or an id statsd does not accept): the bridge counts them.
func ContainerRefs(s Sandbox, containers []Container) ([]*sandboxstatsv1.ContainerRef, int, error) {
	var refs []*sandboxstatsv1.ContainerRef
	seen := map[string]bool{}
	if s.Kind == KindKata {
		if err := validContainerID(s.ID); err != nil {
			return nil, 0, unmappable("invalid-sandbox-id", "sandbox id: %w", err)
		}
		refs = append(refs, &sandboxstatsv1.ContainerRef{Id: s.ID})
		seen[s.ID] = true
	}
	left := 0
	for _, c := range containers {
		switch {
		case seen[c.ID]:
		case validContainerID(c.ID) != nil, len(refs) == maxContainers:
			left++
		default:
			seen[c.ID] = true
			refs = append(refs, &sandboxstatsv1.ContainerRef{Id: c.ID, Name: foreign.ASCII(c.Name, maxIdentityBytes)})
		}
	}
	return refs, left, nil
}

func validContainerID(id string) error {
	if id == "" || len(id) > maxContainerBytes || strings.IndexFunc(id, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
		return fmt.Errorf("%s is empty, longer than %d bytes or not printable ASCII", foreign.Quote(id), maxContainerBytes)
	}
	return nil
}

// CgroupPath turns a cgroups path as NRI gives it into the absolute,
// clean path relative to the cgroup mount that statsd takes: a cgroupfs
// path as it is (cleaned), systemd's "slice:prefix:name" as runc's systemd
// driver lays it out (/a.slice/a-b.slice/prefix-name.scope) and a bare
// "name.slice" (a pod-level cgroup parent under systemd) expanded the same
// way.
func CgroupPath(p string) (string, error) {
	var out string
	switch {
	case p == "":
		return "", unmappable("no-cgroup", "no cgroups path")
	case len(p) > maxPathBytes || strings.IndexFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return "", unmappable("invalid-cgroup", "cgroups path %s is too long or has a control character", foreign.Quote(p))
	case slices.Contains(strings.Split(p, "/"), ".."):
		return "", unmappable("invalid-cgroup", "cgroups path %s has a \"..\" element", foreign.Quote(p))
	case strings.HasPrefix(p, "/"):
		out = path.Clean(p)
	case strings.Count(p, ":") == 2:
		parts := strings.SplitN(p, ":", 3)
		slice, prefix, name := parts[0], parts[1], parts[2]
		if slice == "" {
			slice = "system.slice"
		}
		dir, err := expandSlice(slice)
		if err != nil {
			return "", unmappable("invalid-cgroup", "cgroups path %s: %w", foreign.Quote(p), err)
		}
		unit := name
		if !strings.HasSuffix(name, ".slice") {
			if prefix != "" {
				unit = prefix + "-" + name
			}
			unit += ".scope"
		}
		if name == "" || strings.Contains(unit, "/") {
			return "", unmappable("invalid-cgroup", "cgroups path %s: bad unit name", foreign.Quote(p))
		}
		out = path.Join(dir, unit)
	case strings.HasSuffix(p, ".slice") && !strings.ContainsAny(p, ":/"):
		dir, err := expandSlice(p)
		if err != nil {
			return "", unmappable("invalid-cgroup", "cgroup parent %s: %w", foreign.Quote(p), err)
		}
		out = dir
	default:
		return "", unmappable("invalid-cgroup", "cgroups path %s is neither absolute nor systemd's slice:prefix:name", foreign.Quote(p))
	}
	if out == "/" {
		return "", unmappable("invalid-cgroup", "cgroups path %s names the root cgroup: the whole host, not a sandbox", foreign.Quote(p))
	}
	return out, nil
}

// expandSlice turns a systemd slice name into its cgroup path:
// "a-b-c.slice" is /a.slice/a-b.slice/a-b-c.slice, "-.slice" the root.
func expandSlice(slice string) (string, error) {
	name, ok := strings.CutSuffix(slice, ".slice")
	if !ok || strings.Contains(name, "/") {
		return "", fmt.Errorf("%s is not a slice name", foreign.Quote(slice))
	}
	if name == "-" {
		return "/", nil
	}
	var b strings.Builder
	prefix := ""
	for _, part := range strings.Split(name, "-") {
		if part == "" {
			return "", fmt.Errorf("slice %s has an empty component", foreign.Quote(slice))
		}
		b.WriteString("/" + prefix + part + ".slice")
		prefix += part + "-"
	}
	return b.String(), nil
}
