// This file finds a sandbox's containers in runsc's state files: which
// runsc sandbox a binding measures (by its sentry pid or cgroup path) and
// the containers joined to it, with their CRI names.

package gvisor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/foreign"
)

// ErrRunscState marks a runsc state file that does not parse.
var ErrRunscState = errors.New("gvisor: runsc state file")

// Annotations runsc's state files carry from the OCI spec under
// containerd's CRI.
const (
	annContainerName = "io.kubernetes.cri.container-name"
	annContainerType = "io.kubernetes.cri.container-type"
)

// Bounds of reading a runsc root.
const (
	// maxStateBytes caps one state file: runsc writes the whole OCI spec
	// (about 2 KiB for a small container, tens of KiB for a big one).
	maxStateBytes = 1 << 20
	// maxRootEntries caps the names read from one runsc root: a node's
	// sandboxes times their containers, twice (.state and .lock).
	maxRootEntries = 1 << 16
	// maxContainerText cuts a container id or name kept from a state file.
	maxContainerText = 253
)

// runscState is what statsd keeps of one runsc state file
// (<root>/<cid>_sandbox:<sid>.state, runsc's container.Container as JSON).
type runscState struct {
	ID        string // the container id ("id")
	SandboxID string // the sandbox's id ("sandbox.id"), the root container's
	// SandboxPID is the sentry's pid ("sandbox.pid"): runsc-sandbox, the
	// process a launcher binds by sentry pid.
	SandboxPID int
	// CgroupPath is the sandbox's cgroup ("sandbox.cgroup": cgroupv1's
	// name, cgroupv2's path), as given in the spec's cgroupsPath.
	CgroupPath string
	// GoferPID is the container's gofer ("goferPid", runsc-gofer): a
	// process of the sandbox whose host CPU is the sandbox's own; 0 when
	// absent.
	GoferPID int
	Name     string    // the CRI container-name annotation, "" when absent
	Type     string    // the CRI container-type annotation ("sandbox", "container"), "" when absent
	Created  time.Time // "createdAt"; zero when absent
}

// stateFileName splits a runsc state file's name, <cid>_sandbox:<sid>.state
// (runsc's StateFile: the container id, then the sandbox id). ok is false
// for any other name (the .lock beside it, a temp file).
func stateFileName(name string) (cid, sid string, ok bool) {
	base, ok := strings.CutSuffix(name, ".state")
	if !ok {
		return "", "", false
	}
	cid, sid, ok = strings.Cut(base, "_sandbox:")
	if !ok || cid == "" || sid == "" || strings.Contains(sid, "_sandbox:") {
		return "", "", false
	}
	return cid, sid, true
}

// parseRunscState parses one state file. Only the fields above are read; an
// unknown layout of them is an error wrapping ErrRunscState.
func parseRunscState(b []byte) (runscState, error) {
	var raw struct {
		ID        string `json:"id"`
		CreatedAt string `json:"createdAt"`
		GoferPID  int    `json:"goferPid"`
		Spec      struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"spec"`
		Sandbox *struct {
			ID     string `json:"id"`
			PID    int    `json:"pid"`
			Cgroup struct {
				V1 *struct {
					Name string `json:"name"`
				} `json:"cgroupv1"`
				V2 *struct {
					Path string `json:"path"`
				} `json:"cgroupv2"`
			} `json:"cgroup"`
		} `json:"sandbox"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&raw); err != nil {
		return runscState{}, fmt.Errorf("%w: %w", ErrRunscState, err)
	}
	if raw.ID == "" || raw.Sandbox == nil || raw.Sandbox.ID == "" {
		return runscState{}, fmt.Errorf("%w: no container id or sandbox id", ErrRunscState)
	}
	if raw.Sandbox.PID < 0 || raw.GoferPID < 0 {
		return runscState{}, fmt.Errorf("%w: sandbox pid %d, gofer pid %d", ErrRunscState, raw.Sandbox.PID, raw.GoferPID)
	}
	st := runscState{
		ID:         raw.ID,
		SandboxID:  raw.Sandbox.ID,
		SandboxPID: raw.Sandbox.PID,
		GoferPID:   raw.GoferPID,
		Name:       raw.Spec.Annotations[annContainerName],
		Type:       raw.Spec.Annotations[annContainerType],
	}
	switch c := raw.Sandbox.Cgroup; {
	case c.V1 != nil:
		st.CgroupPath = c.V1.Name
	case c.V2 != nil:
		st.CgroupPath = c.V2.Path
	}
	if raw.CreatedAt != "" {
		if t, err := time.Parse(time.RFC3339Nano, raw.CreatedAt); err == nil {
			st.Created = t
		}
	}
	return st, nil
}

// sameCgroup reports whether a state file's cgroup path names the cgroup a
// binding measures (both as the launcher spelt them: absolute, clean).
func sameCgroup(statePath, bound string) bool {
	if statePath == "" || bound == "" {
		return false
	}
	return path.Clean("/"+statePath) == path.Clean("/"+bound)
}

// listStates lists the state files of root: the names of at most
// maxRootEntries entries, read without a stat.
func listStates(root string) ([]string, error) {
	d, err := os.Open(root)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(maxRootEntries)
	if err != nil && len(names) == 0 {
		return nil, err
	}
	out := names[:0]
	for _, n := range names {
		if _, _, ok := stateFileName(n); ok {
			out = append(out, n)
		}
	}
	return out, nil
}

// readState reads and parses one state file (bounded), checking that it
// is about the container and sandbox its name says.
func readState(root, name string) (runscState, error) {
	p := filepath.Join(root, name)
	b, err := bounded.ReadFile(p, maxStateBytes)
	if err != nil {
		return runscState{}, err
	}
	st, err := parseRunscState(b)
	if err != nil {
		return runscState{}, fmt.Errorf("%s: %w", foreign.Quote(p), err)
	}
	if cid, sid, _ := stateFileName(name); st.ID != cid || st.SandboxID != sid {
		return runscState{}, fmt.Errorf("%w: %s: names container %s of sandbox %s", ErrRunscState, foreign.Quote(p), foreign.Quote(st.ID), foreign.Quote(st.SandboxID))
	}
	return st, nil
}

// runscSandbox is a sandbox found in a runsc root and its containers.
type runscSandbox struct {
	Root       string
	ID         string
	Containers []runscState // every container of the sandbox, oldest first, the root (pause) one included
	// Unread are the sandbox's state files there but not read (unread.go).
	Unread []unreadState
}

// findSandbox finds, in roots, the runsc sandbox whose sentry is pid (when
// pid is not 0) or whose cgroup is cgroupPath, and its containers. knownID,
// when not "", is the sandbox id a previous call found: only its files are
// read. A sandbox not found is ok false with no error. Listings and files
// come through c: unchanged ones are not read again.
func (c *stateCache) findSandbox(roots []string, knownID string, pid int, cgroupPath string) (sb runscSandbox, ok bool, err error) {
	var errs []error
	for _, root := range roots {
		names, unchanged, lerr := c.list(root)
		if lerr != nil {
			errs = append(errs, lerr)
			continue
		}
		sid := knownID
		if sid == "" {
			// Only the root containers' files (<sid>_sandbox:<sid>) say
			// which sandbox is which: one read per sandbox of the root.
			for _, n := range names {
				cid, s, _ := stateFileName(n)
				if cid != s {
					continue
				}
				st, rerr := c.read(root, n, unchanged)
				if rerr != nil {
					errs = append(errs, rerr)
					continue
				}
				if pid != 0 && st.SandboxPID == pid || pid == 0 && sameCgroup(st.CgroupPath, cgroupPath) {
					sid = s
					break
				}
			}
			if sid == "" {
				continue
			}
		}
		sb = runscSandbox{Root: root, ID: sid}
		for _, n := range names {
			if _, s, _ := stateFileName(n); s == sid && sb.Containers == nil {
				sb.Containers = make([]runscState, 0, 4) // a pod's handful, grown past that
			}
			if _, s, _ := stateFileName(n); s != sid {
				continue
			}
			st, rerr := c.read(root, n, unchanged)
			if rerr != nil {
				// A container deleted between the listing and the read
				// is simply gone.
				if !errors.Is(rerr, os.ErrNotExist) {
					errs = append(errs, rerr)
					cid, _, _ := stateFileName(n)
					sb.Unread = append(sb.Unread, unreadState{ID: cid, Err: rerr})
				}
				continue
			}
			if pid != 0 && st.SandboxPID != pid {
				continue // another sentry now has this sandbox id
			}
			sb.Containers = append(sb.Containers, st)
		}
		if len(sb.Containers) == 0 {
			continue
		}
		slices.SortStableFunc(sb.Containers, func(a, b runscState) int {
			if c := a.Created.Compare(b.Created); c != 0 {
				return c
			}
			return strings.Compare(a.ID, b.ID)
		})
		return sb, true, nil
	}
	return runscSandbox{}, false, errors.Join(errs...)
}
