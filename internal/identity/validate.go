package identity

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/microvm"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// Limits on lifecycle requests.
const (
	maxActorUIDBytes  = 128
	maxNameBytes      = 253
	MaxContainerIDs   = 25
	maxContainerBytes = 256
	// maxContainerRefIDBytes bounds a ContainerRef's id (the proto's).
	maxContainerRefIDBytes = 128
	maxPathBytes           = 4096
)

// ErrInvalid marks a request that failed validation; nothing was changed.
var ErrInvalid = errors.New("identity: invalid request")

// Identity names a workload.
type Identity struct {
	ActorUID          string `json:"actor_uid"`
	ActorName         string `json:"actor_name,omitempty"`
	ActorNamespace    string `json:"actor_namespace,omitempty"`
	TemplateNamespace string `json:"template_namespace,omitempty"`
	TemplateName      string `json:"template_name,omitempty"`
	// WorkerPool is optional (upstream's ate.workerpool.name).
	WorkerPool string `json:"worker_pool,omitempty"`
}

// ValidateActorUID checks an actor uid: 1 to 128 bytes of printable ASCII.
func ValidateActorUID(uid string) error {
	if uid == "" {
		return fmt.Errorf("%w: actor_uid is required", ErrInvalid)
	}
	if len(uid) > maxActorUIDBytes {
		return fmt.Errorf("%w: actor_uid is %d bytes, more than %d", ErrInvalid, len(uid), maxActorUIDBytes)
	}
	if i := strings.IndexFunc(uid, func(r rune) bool { return r < 0x21 || r > 0x7e }); i >= 0 {
		return fmt.Errorf("%w: actor_uid has a character that is not printable ASCII at byte %d", ErrInvalid, i)
	}
	return nil
}

// Validate checks every field of an identity.
func (id Identity) Validate() error {
	if err := ValidateActorUID(id.ActorUID); err != nil {
		return err
	}
	for _, f := range []struct{ name, value string }{
		{"actor_name", id.ActorName},
		{"actor_namespace", id.ActorNamespace},
		{"template_namespace", id.TemplateNamespace},
		{"template_name", id.TemplateName},
		{"worker_pool", id.WorkerPool},
	} {
		if err := validateText(f.name, f.value, maxNameBytes); err != nil {
			return err
		}
	}
	return nil
}

// validateText allows printable ASCII and spaces (names are for people).
func validateText(name, value string, max int) error {
	if len(value) > max {
		return fmt.Errorf("%w: %s is %d bytes, more than %d", ErrInvalid, name, len(value), max)
	}
	if i := strings.IndexFunc(value, func(r rune) bool { return r < 0x20 || r > 0x7e }); i >= 0 {
		return fmt.Errorf("%w: %s has a character that is not printable ASCII at byte %d", ErrInvalid, name, i)
	}
	return nil
}

// ValidateRef checks a SandboxRef without touching the file system: the
// fields its class needs are there, the others are not, a cgroup path is
// clean, absolute and has no "..", addresses use a known scheme, pids are
// positive. Where a cgroup path leads after symlinks is checked when it is
// read (internal/gvisor opens it through an os.Root), since the cgroup may
// not exist yet.
func ValidateRef(ref source.SandboxRef) error {
	switch ref.Class {
	case source.ClassGVisor:
		if (ref.CgroupPath == "") == (ref.SentryPID == 0) {
			return fmt.Errorf("%w: a gvisor sandbox needs exactly one of cgroup_path and sentry_pid", ErrInvalid)
		}
		if ref.CgroupPath != "" {
			if err := validateCgroupPath(ref.CgroupPath); err != nil {
				return err
			}
		}
		if ref.SentryPID < 0 {
			return fmt.Errorf("%w: sentry_pid %d is not positive", ErrInvalid, ref.SentryPID)
		}
		if ref.SentryStartTicks != 0 && ref.SentryPID == 0 {
			return fmt.Errorf("%w: a sentry start time without a sentry_pid", ErrInvalid)
		}
		if ref.AgentAddress != "" || len(ref.ContainerIDs) > 0 {
			return fmt.Errorf("%w: agent_address and container_ids are for a microvm sandbox", ErrInvalid)
		}
		if err := ValidateContainers(ref.Class, ref.Containers); err != nil {
			return err
		}
	case source.ClassMicroVM:
		if err := validateAgentAddress(ref.AgentAddress); err != nil {
			return err
		}
		if len(ref.Containers) > 0 {
			if err := ValidateContainers(ref.Class, ref.Containers); err != nil {
				return err
			}
			if err := sameContainerIDs(ref.ContainerIDs, ref.Containers); err != nil {
				return err
			}
		} else if n := len(ref.ContainerIDs); n == 0 || n > MaxContainerIDs {
			return fmt.Errorf("%w: a microvm sandbox needs 1 to %d container_ids, got %d", ErrInvalid, MaxContainerIDs, n)
		}
		seen := make(map[string]bool, len(ref.ContainerIDs))
		for _, id := range ref.ContainerIDs {
			if id == "" || len(id) > maxContainerBytes || strings.IndexFunc(id, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
				return fmt.Errorf("%w: container id %q is empty, too long or not printable ASCII", ErrInvalid, id)
			}
			if seen[id] {
				return fmt.Errorf("%w: container id %q is listed twice", ErrInvalid, id)
			}
			seen[id] = true
		}
		if ref.CgroupPath != "" || ref.SentryPID != 0 || ref.SentryStartTicks != 0 {
			return fmt.Errorf("%w: cgroup_path and sentry_pid are for a gvisor sandbox", ErrInvalid)
		}
	default:
		return fmt.Errorf("%w: sandbox_class must be gvisor or microvm", ErrInvalid)
	}
	if ref.VMMPID < 0 {
		return fmt.Errorf("%w: vmm_pid %d is not positive", ErrInvalid, ref.VMMPID)
	}
	if ref.VMMPID != 0 && ref.VMMPIDFile != "" {
		return fmt.Errorf("%w: give at most one of vmm_pid and vmm_pid_file", ErrInvalid)
	}
	for _, f := range []struct{ name, value string }{{"vmm_pid_file", ref.VMMPIDFile}, {"qmp_socket", ref.QMPSocket}} {
		if f.value == "" {
			continue
		}
		if err := validateAbsPath(f.name, f.value); err != nil {
			return err
		}
	}
	return nil
}

// sameContainerIDs checks a micro-VM ref that gives both container_ids and
// containers (a launcher that also speaks to a statsd older than
// containers, which reads container_ids only): both must name the same
// ids in the same order. No container_ids: nothing to compare.
func sameContainerIDs(ids []string, set []source.ContainerRef) error {
	if len(ids) == 0 {
		return nil
	}
	for i := range max(len(ids), len(set)) {
		switch {
		case i >= len(ids):
			return fmt.Errorf("%w: container_ids and containers differ: containers[%d] is %q, container_ids has %d ids", ErrInvalid, i, set[i].ID, len(ids))
		case i >= len(set):
			return fmt.Errorf("%w: container_ids and containers differ: container_ids[%d] is %q, containers has %d", ErrInvalid, i, foreignCut(ids[i]), len(set))
		case ids[i] != set[i].ID:
			return fmt.Errorf("%w: container_ids and containers differ: container_ids[%d] is %q, containers[%d].id is %q", ErrInvalid, i, foreignCut(ids[i]), i, set[i].ID)
		}
	}
	return nil
}

// ValidateContainers checks a container set for a sandbox of class (a
// SandboxRef's containers, an UpdateWorkloadContainers' set): at most
// MaxContainerIDs, each id 1 to 128 bytes of printable ASCII and listed
// once, each name at most 253 bytes of printable ASCII. A micro-VM's set
// has at least one container (the guest agent reads them); a gVisor one
// may be empty (names only: runsc's state files list the containers).
func ValidateContainers(class source.Class, set []source.ContainerRef) error {
	least := 0
	if class == source.ClassMicroVM {
		least = 1
	}
	if n := len(set); n < least || n > MaxContainerIDs {
		return fmt.Errorf("%w: a %s sandbox takes %d to %d containers, got %d", ErrInvalid, class, least, MaxContainerIDs, n)
	}
	seen := make(map[string]bool, len(set))
	for i, c := range set {
		if c.ID == "" || len(c.ID) > maxContainerRefIDBytes || strings.IndexFunc(c.ID, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
			return fmt.Errorf("%w: containers[%d]: id %q is empty, longer than %d bytes or not printable ASCII", ErrInvalid, i, foreignCut(c.ID), maxContainerRefIDBytes)
		}
		if seen[c.ID] {
			return fmt.Errorf("%w: containers[%d]: id %q is listed twice", ErrInvalid, i, c.ID)
		}
		seen[c.ID] = true
		if err := validateText(fmt.Sprintf("containers[%d].name", i), c.Name, maxNameBytes); err != nil {
			return err
		}
	}
	return nil
}

// foreignCut bounds an invalid value quoted in an error.
func foreignCut(v string) string { return foreign.Bound(v, maxContainerRefIDBytes) }

func validateAbsPath(name, p string) error {
	if len(p) > maxPathBytes || strings.ContainsRune(p, 0) {
		return fmt.Errorf("%w: %s is too long or holds a NUL", ErrInvalid, name)
	}
	if i := strings.IndexFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }); i >= 0 {
		return fmt.Errorf("%w: %s %q has a control character", ErrInvalid, name, p)
	}
	if !path.IsAbs(p) || path.Clean(p) != p {
		return fmt.Errorf("%w: %s %q must be absolute and clean", ErrInvalid, name, p)
	}
	return nil
}

func validateCgroupPath(p string) error {
	if err := validateAbsPath("cgroup_path", p); err != nil {
		return err
	}
	if p == "/" {
		return fmt.Errorf("%w: cgroup_path \"/\" is the root cgroup: it would measure the whole host, not a sandbox", ErrInvalid)
	}
	for _, elem := range strings.Split(p, "/") {
		if elem == ".." {
			return fmt.Errorf("%w: cgroup_path %q has a \"..\" element", ErrInvalid, p)
		}
	}
	return nil
}

// validateAgentAddress checks "hvsock://<absolute unix path>:<port>" or
// "vsock://<cid>:<port>" with the parser the micro-VM source dials with, so
// an address accepted here can be dialled: a guest cid (>= 3, not "any"), a
// listening port, canonical decimals, no control characters in the path.
func validateAgentAddress(addr string) error {
	a, err := microvm.ParseAddress(addr)
	if err != nil {
		return fmt.Errorf("%w: agent_address: %w", ErrInvalid, err)
	}
	if a.Scheme == microvm.SchemeHybridVsock {
		return validateAbsPath("agent_address socket path", a.Path)
	}
	return nil
}
