// This file is the per-container breakdown of a gVisor sandbox: the
// containers from runsc's state files (statecache.go), the sandbox's own
// processes' CPU from /proc (owncpu.go), and the rest of the sandbox
// cgroup's CPU split among the containers (split.go) in the proportions of
// the sentry's per-container figures (internal/sentryusage: one
// containerManager.Event call a sample).

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
	whyOwnKVM     = "runsc's kvm platform: the application runs on the sentry's own threads, so the sandbox's own CPU cannot be told apart by process (the containers share the whole cgroup's CPU)"
	whyOwnNoCPU   = "the sandbox cgroup's CPU is absent"
	whyMemory     = "runsc 20221219 (and any runsc for a container that does not mount cgroupfs) reports the sandbox's total or an even split of it, not the container's own"
	whyPidsWide   = "runsc reports the whole sandbox's processes (this runsc: one figure for every container)"
	whyPids       = "not read: one sentry call per container would be needed (runsc >= 20230731); statsd makes one call per sample"
	whyUserSystem = "the sentry reports user plus system time only"
)

// containerRead is one look at the sandbox's containers: from the state
// files and one sentry call, not yet scaled.
type containerRead struct {
	sb     runscSandbox
	usage  sentryusage.Usage
	own    ownRead
	ownErr error // a process of the sandbox that could not be read (it kept its last figure)
}

// breakdown is the per-container part of a gVisor source; nil without a
// runsc root.
type breakdown struct {
	roots  []string
	sentry *sentryusage.Session // one kept connection to the sentry, closed by close
	g      *bounded.Group
	pid    int
	cgroup string

	cache *stateCache
	own   *ownTracker
	split splitter

	mu  sync.Mutex
	sid string // the sandbox id once found
	// pause is the pause container's id once seen (its part stays the own
	// share's while its state file does not read); ownShare the last
	// sandbox_own_cpu_usec served (the next is never lower); restoredSID
	// the sandbox of a restored state until the first read finds it.
	pause, restoredSID string
	ownShare           uint64
	// label names the breakdown's bounded call (read), made for labelSID.
	label, labelSID string
}

func newBreakdown(roots []string, timeout, keepFor time.Duration, ref source.SandboxRef, procRoot string) (*breakdown, error) {
	if len(roots) == 0 {
		return nil, nil
	}
	// Abstract too: runsc up to release-20230123 has no socket file, and up
	// to release-20230911 falls back to it.
	c, err := sentryusage.New(sentryusage.Config{RootDirs: roots, Abstract: true, Timeout: timeout, KeepFor: keepFor})
	if err != nil {
		return nil, fmt.Errorf("gvisor: runsc roots: %w", err)
	}
	b := &breakdown{
		roots: roots, sentry: c.Session(), g: bounded.New(timeout), pid: ref.SentryPID, cgroup: ref.CgroupPath,
		cache: newStateCache(), own: newOwnTracker(procRoot),
	}
	b.own.cgroup = ref.CgroupPath
	return b, nil
}

// start starts finding the containers and asking the sentry once, on a
// worker; its Wait returns what they gave, within the breakdown's own bound
// from now (ctx's deadline when sooner); Wait or Abandon is called once. The
// sample reads the cgroup meanwhile, on its own goroutine: no goroutine
// waits for the breakdown. Concurrent samples share one call.
func (b *breakdown) start(ctx context.Context) bounded.Pending[containerRead] {
	// What a timeout names: the sandbox (once found) and how it is bound,
	// as the sentry client's own errors name its socket.
	b.mu.Lock()
	if b.label == "" || b.labelSID != b.sid { // made again only when the sandbox id changes
		b.label, b.labelSID = "containers of the runsc sandbox of this "+b.what(), b.sid
		if b.sid != "" {
			b.label = "containers of runsc sandbox " + foreign.Quote(b.sid) + " (" + b.what() + ")"
		}
	}
	what := b.label
	b.mu.Unlock()
	return bounded.Start(ctx, b.g, what, func() (containerRead, error) {
		b.mu.Lock()
		known := b.sid
		b.mu.Unlock()
		sb, ok, err := b.cache.findSandbox(b.roots, known, b.pid, b.cgroup)
		if !ok && known != "" {
			sb, ok, err = b.cache.findSandbox(b.roots, "", b.pid, b.cgroup) // the id may have changed (a restore)
		}
		if !ok {
			if err != nil {
				return containerRead{}, fmt.Errorf("no runsc sandbox found in %v: %w", b.roots, err)
			}
			return containerRead{}, fmt.Errorf("no runsc sandbox of this %s in %v", b.what(), b.roots)
		}
		b.mu.Lock()
		b.sid = sb.ID
		drop := b.restoredSID != "" && b.restoredSID != sb.ID
		b.restoredSID = ""
		b.mu.Unlock()
		if drop {
			b.dropRestored()
		}
		q := sentryusage.Query{SandboxID: sb.ID, ContainerID: sb.ID}
		for _, u := range sb.Unread {
			q.Containers = append(q.Containers, u.ID) // its part still split (unread.go)
		}
		for _, c := range sb.Containers {
			q.Containers = append(q.Containers, c.ID)
			if c.Name != "" {
				q.Containers = append(q.Containers, c.Name) // the key on runsc >= 20251110 with gVisor's v1 cgroups
			}
		}
		u, err := b.sentry.Read(context.Background(), q) // bounded by the client's Timeout
		// The own processes after the reply, also a failed one (an own
		// process that exits keeps its last figure only if it was read).
		// So they are read after the cgroup, which the sample reads while
		// the sentry answers (bounded.Start runs this call up to its wait
		// for the reply first): the application part (the cgroup less
		// them) is then never larger than at the cgroup's read, and the
		// split never gives back what it gave the containers. Usually, not
		// always: a reply that comes within microseconds can be read
		// before the cgroup's read ends, and the split makes up for it at
		// the next sample. Their clocks cost a few µs
		// (owncpu_clock_linux.go).
		var sentry int
		var gofers []int
		for _, c := range sb.Containers {
			sentry = c.SandboxPID
			gofers = append(gofers, c.GoferPID)
		}
		cr := containerRead{sb: sb}
		cr.own, cr.ownErr = b.own.read(sb.Root, sentry, gofers)
		if err != nil {
			return containerRead{}, err
		}
		cr.usage = u
		return cr, nil
	})
}

// close closes the kept connection to the sentry (the source's Close): one
// file descriptor here, one goroutine in the sentry, and what holds the
// sentry's exit back once its root container has exited.
func (b *breakdown) close() { b.sentry.Close() }

func (b *breakdown) what() string {
	if b.pid != 0 {
		return fmt.Sprintf("sentry pid %d", b.pid)
	}
	return "cgroup " + foreign.Quote(b.cgroup)
}

// addContainers puts the breakdown into r: the sandbox's own share (the
// sentry's and gofers' host CPU plus the pause container's part of the
// rest) and each application container (every container but the CRI
// sandbox one), its CPU its part of the cgroup's CPU minus the own
// processes' (split.go), memory and pids absent with their reasons. Under
// runsc's kvm platform the whole cgroup is split and the own share is
// absent. A failed read leaves the containers and the own share out with
// the reason; the rest of r stands.
func (b *breakdown) addContainers(r *source.Reading, cr containerRead, err error) {
	if err != nil {
		reason := foreign.Text("sentry: " + err.Error())
		r.Absent = append(r.Absent, source.Absent{Field: "containers", Reason: reason},
			source.Absent{Field: "sandbox_own_cpu_usec", Reason: "no containers: " + reason})
		return
	}
	// The sentry's figure of each container (pause included), by id.
	raw := make(map[string]uint64, len(cr.sb.Containers))
	pause := b.addUnread(r, cr, raw)
	for _, st := range cr.sb.Containers {
		if isPause(st, cr.sb.ID) {
			pause = st.ID
		}
		v, ok := cr.usage.CPU[st.ID]
		if !ok && st.Name != "" {
			v = cr.usage.CPU[st.Name]
		}
		raw[st.ID] = v // runsc omits 0
	}
	var attr map[string]uint64
	switch {
	case r.CPUUsageUsec == nil:
		r.Absent = append(r.Absent, source.Absent{Field: "sandbox_own_cpu_usec", Reason: whyOwnNoCPU})
	case cr.own.KVM:
		attr, _ = b.split.advance(splitInput{SandboxID: cr.sb.ID, CgroupUsec: *r.CPUUsageUsec, Raw: raw})
		r.Absent = append(r.Absent, source.Absent{Field: "sandbox_own_cpu_usec", Reason: whyOwnKVM})
	case cr.own.SentryWhy != "":
		attr, _ = b.split.advance(splitInput{SandboxID: cr.sb.ID, CgroupUsec: *r.CPUUsageUsec, OwnUsec: cr.own.Usec, Raw: raw})
		r.Absent = append(r.Absent, source.Absent{Field: "sandbox_own_cpu_usec", Reason: foreign.Text(cr.own.SentryWhy)})
	default:
		var own uint64
		attr, own = b.split.advance(splitInput{SandboxID: cr.sb.ID, CgroupUsec: *r.CPUUsageUsec, OwnUsec: cr.own.Usec, Raw: raw})
		own = b.ownFloor(pause, own+attr[pause])
		r.SandboxOwnCPUUsec = &own
	}
	if r.Containers == nil {
		r.Containers = make([]source.Container, 0, len(cr.sb.Containers))
	}
	for _, st := range cr.sb.Containers {
		if st.ID == pause {
			continue // the pod's, not an application's: in the own share
		}
		// Six absent fields at most: one allocation, not a growing slice.
		c := source.Container{ID: foreign.ASCII(st.ID, maxContainerText), Name: foreign.ASCII(st.Name, maxContainerText), Absent: make([]source.Absent, 0, 6)}
		if v, ok := attr[st.ID]; ok {
			c.CPUUsageUsec = &v
		} else {
			c.Absent = append(c.Absent, source.Absent{Field: "cpu_usage_usec", Reason: "the sandbox cgroup's CPU is absent: nothing to split among the containers"})
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

// isPause reports whether st is the CRI sandbox (pause) container of
// sandbox sid.
func isPause(st runscState, sid string) bool {
	return st.Type == "sandbox" || st.ID == sid && st.Type == ""
}
