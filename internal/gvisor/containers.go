// This file is the per-container breakdown of a gVisor sandbox: the
// containers from runsc's state files, their CPU from the sentry's control
// server (internal/sentryusage: one containerManager.Event call a sample),
// rescaled to the sandbox cgroup's CPU read in the same sample.

package gvisor

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/sentryusage"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// DefaultSentryTimeout bounds the sentry call of one sample (capped by
// ReadTimeout): a Read takes about 0.25 ms here, runsc events 30 ms.
const DefaultSentryTimeout = 500 * time.Millisecond

// The absent reasons of the breakdown.
const (
	whyOwnCPU     = "not measured: runsc's per-container CPU is a share of the sandbox cgroup's CPU (rescaled as runsc events does), so there is no separate measurement of the sandbox's own cost yet"
	whyMemory     = "runsc 20221219 (and any runsc for a container that does not mount cgroupfs) reports the sandbox's total or an even split of it, not the container's own"
	whyPidsWide   = "runsc reports the whole sandbox's processes (this runsc: one figure for every container)"
	whyPids       = "not read: one sentry call per container would be needed (runsc >= 20230731); statsd makes one call per sample"
	whyUserSystem = "the sentry reports user plus system time only"
)

// containerRead is one look at the sandbox's containers: from the state
// files and one sentry call, not yet scaled.
type containerRead struct {
	sb    runscSandbox
	usage sentryusage.Usage
}

// breakdown is the per-container part of a gVisor source; nil without a
// runsc root.
type breakdown struct {
	roots  []string
	client *sentryusage.Client
	g      *bounded.Group
	pid    int
	cgroup string

	mu  sync.Mutex
	sid string // the sandbox id once found
}

func newBreakdown(roots []string, timeout time.Duration, ref source.SandboxRef) (*breakdown, error) {
	if len(roots) == 0 {
		return nil, nil
	}
	// Abstract too: runsc up to release-20230123 has no socket file, and up
	// to release-20230911 falls back to it.
	c, err := sentryusage.New(sentryusage.Config{RootDirs: roots, Abstract: true, Timeout: timeout})
	if err != nil {
		return nil, fmt.Errorf("gvisor: runsc roots: %w", err)
	}
	return &breakdown{roots: roots, client: c, g: bounded.New(timeout), pid: ref.SentryPID, cgroup: ref.CgroupPath}, nil
}

// read finds the containers and asks the sentry once, within the
// breakdown's own bound (ctx's deadline when sooner). Concurrent samples
// share one call.
func (b *breakdown) read(ctx context.Context) (containerRead, error) {
	return bounded.Do(ctx, b.g, "containers", func() (containerRead, error) {
		b.mu.Lock()
		known := b.sid
		b.mu.Unlock()
		sb, ok, err := findSandbox(b.roots, known, b.pid, b.cgroup)
		if !ok && known != "" {
			sb, ok, err = findSandbox(b.roots, "", b.pid, b.cgroup) // the id may have changed (a restore)
		}
		if !ok {
			if err != nil {
				return containerRead{}, fmt.Errorf("no runsc sandbox found in %v: %w", b.roots, err)
			}
			return containerRead{}, fmt.Errorf("no runsc sandbox of this %s in %v", b.what(), b.roots)
		}
		b.mu.Lock()
		b.sid = sb.ID
		b.mu.Unlock()
		q := sentryusage.Query{SandboxID: sb.ID, ContainerID: sb.ID}
		for _, c := range sb.Containers {
			q.Containers = append(q.Containers, c.ID)
			if c.Name != "" {
				q.Containers = append(q.Containers, c.Name) // the key on runsc >= 20251110 with gVisor's v1 cgroups
			}
		}
		u, err := b.client.Read(context.Background(), q) // bounded by the client's Timeout
		if err != nil {
			return containerRead{}, err
		}
		return containerRead{sb: sb, usage: u}, nil
	})
}

func (b *breakdown) what() string {
	if b.pid != 0 {
		return fmt.Sprintf("sentry pid %d", b.pid)
	}
	return "cgroup " + foreign.Quote(b.cgroup)
}

// addContainers puts the breakdown into r: each application container
// (every container but the CRI sandbox one), its CPU the sentry's
// containerUsage rescaled to r's CPU (sentryusage.ScaleToHost, what runsc
// events --stats reports), memory and pids absent with their reasons, and
// the sandbox's own share absent. A failed read leaves the containers out
// with the reason; the rest of r stands.
func addContainers(r *source.Reading, cr containerRead, err error) {
	r.Absent = append(r.Absent, source.Absent{Field: "sandbox_own_cpu_usec", Reason: whyOwnCPU})
	if err != nil {
		r.Absent = append(r.Absent, source.Absent{Field: "containers", Reason: foreign.Text("sentry: " + err.Error())})
		return
	}
	var scaled map[string]uint64
	if r.CPUUsageUsec != nil {
		scaled = sentryusage.ScaleToHost(cr.usage.CPU, *r.CPUUsageUsec*1000)
	}
	for _, st := range cr.sb.Containers {
		if st.Type == "sandbox" || st.ID == cr.sb.ID && st.Type == "" {
			continue // the pause container: the pod's, not an application's
		}
		c := source.Container{ID: foreign.ASCII(st.ID, maxContainerText), Name: foreign.ASCII(st.Name, maxContainerText)}
		key := st.ID
		if _, ok := cr.usage.CPU[key]; !ok && st.Name != "" {
			key = st.Name
		}
		switch v, ok := scaled[key]; {
		case r.CPUUsageUsec == nil:
			c.Absent = append(c.Absent, source.Absent{Field: "cpu_usage_usec", Reason: "the sandbox cgroup's CPU is absent: nothing to rescale the sentry's figures to"})
		case !ok:
			c.Absent = append(c.Absent, source.Absent{Field: "cpu_usage_usec", Reason: "the sentry's reply names no CPU for this container (runsc omits 0)"})
		default:
			us := v / 1000
			c.CPUUsageUsec = &us
		}
		c.Absent = append(c.Absent,
			source.Absent{Field: "cpu_user_usec", Reason: whyUserSystem},
			source.Absent{Field: "cpu_system_usec", Reason: whyUserSystem},
			source.Absent{Field: "memory_current_bytes", Reason: whyMemory},
			source.Absent{Field: "memory_working_set_bytes", Reason: whyMemory},
		)
		if cr.usage.PidsSandboxWide {
			c.Absent = append(c.Absent, source.Absent{Field: "pids_current", Reason: whyPidsWide})
		} else {
			c.Absent = append(c.Absent, source.Absent{Field: "pids_current", Reason: whyPids})
		}
		r.Containers = append(r.Containers, c)
	}
}
