package nribridge

import (
	"cmp"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
)

// The NRI events (split from bridge.go): each records the pods' desired
// state and queues the work, never blocking on statsd.

// PodSandbox events. Each returns at once: it records the pod's desired
// state and queues the work.

// RunPodSandbox binds the pod (if its handler is watched).
func (b *Bridge) RunPodSandbox(p *api.PodSandbox) {
	b.m.event("run-pod-sandbox")
	if b.opt.Mapping.KindOf(p.GetRuntimeHandler()) != 0 && ValidUID(p.GetUid()) == nil {
		b.mu.Lock()
		b.running[p.GetUid()] = p.GetId()
		b.mu.Unlock()
	}
	b.upsert(p)
}

// StopPodSandbox checkpoints the pod, saying its runtime stopped it
// (runtime_stopped). Containerd and CRI-O relay it once the sandbox is
// stopped (its task killed and deleted): there is no NRI event before the
// teardown to read a final in (docs/nri.md).
func (b *Bridge) StopPodSandbox(p *api.PodSandbox) {
	b.m.event("stop-pod-sandbox")
	b.gone(p)
}

// RemovePodSandbox checkpoints the pod if StopPodSandbox did not.
func (b *Bridge) RemovePodSandbox(p *api.PodSandbox) {
	b.m.event("remove-pod-sandbox")
	b.gone(p)
}

// ContainerCreated adds a container to its pod's set (PostCreateContainer:
// created, so runsc's state file of it exists).
func (b *Bridge) ContainerCreated(p *api.PodSandbox, c *api.Container) {
	b.m.event("post-create-container")
	b.container(p, c, true)
}

// ContainerStopped drops a container from its pod's set: it exited (the
// runtime relays StopContainer once its task is gone), so statsd keeps its
// last figures in the activation (ContainerStats.exited) and reads it no
// more. The stop, not the removal, ends it: a stopped container burns
// nothing, and the kubelet may keep it unremoved for long.
func (b *Bridge) ContainerStopped(p *api.PodSandbox, c *api.Container) {
	b.m.event("stop-container")
	b.container(p, c, false)
}

// ContainerRemoved drops a container from its pod's set if its stop did
// not (a container removed without a StopContainer relayed: the bridge
// was away, or it never started).
func (b *Bridge) ContainerRemoved(p *api.PodSandbox, c *api.Container) {
	b.m.event("remove-container")
	b.container(p, c, false)
}

// newPod maps p, or counts and notes why it cannot (nil).
func (b *Bridge) newPod(p *api.PodSandbox) *pod {
	kind := b.opt.Mapping.KindOf(p.GetRuntimeHandler())
	if kind == 0 {
		b.m.ignored.WithLabelValues("handler").Inc()
		return nil
	}
	id, err := b.opt.Mapping.IdentityOf(p)
	if err != nil {
		b.unactionable(err, "pod", p.GetNamespace()+"/"+p.GetName(), "sandbox", p.GetId())
		return nil
	}
	return &pod{uid: p.GetUid(), identity: id, sandbox: SandboxOf(kind, p), containers: map[string]ctr{}}
}

// unactionable counts and notes (bounded) an event the bridge cannot act on.
func (b *Bridge) unactionable(err error, attrs ...any) {
	reason := ReasonOf(err)
	if reason == "" {
		reason = "other"
	}
	b.m.unactionable.WithLabelValues(reason).Inc()
	b.notes.add(slog.LevelWarn, "nri: cannot bind a pod", reason, append(attrs, "reason", reason, "err", err)...)
}

func (b *Bridge) upsert(p *api.PodSandbox) {
	np := b.newPod(p)
	if np == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	old := b.pods[np.uid]
	if old == nil && len(b.pods) >= b.opt.MaxPods {
		b.m.unactionable.WithLabelValues("too-many-pods").Inc()
		b.notes.add(slog.LevelWarn, "nri: cannot bind a pod", "too-many-pods", "uid", np.uid, "max_pods", b.opt.MaxPods)
		return
	}
	if old != nil && old.sandbox.ID == np.sandbox.ID {
		np.containers, np.changed = old.containers, old.changed
	}
	// The runtime relayed this sandbox's start: it relays its end too.
	delete(b.unannounced, np.uid)
	b.pods[np.uid] = np
	b.touch(np.uid)
}

// gone forgets the pod's desired binding.
func (b *Bridge) gone(p *api.PodSandbox) {
	if b.opt.Mapping.KindOf(p.GetRuntimeHandler()) == 0 {
		b.m.ignored.WithLabelValues("handler").Inc()
		return
	}
	uid := p.GetUid()
	if ValidUID(uid) != nil {
		b.m.ignored.WithLabelValues("invalid-pod-uid").Inc()
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if id, ok := b.running[uid]; ok && id == p.GetId() {
		delete(b.running, uid)
	}
	if old := b.pods[uid]; old != nil && old.sandbox.ID != p.GetId() {
		// An older sandbox of the same pod (the kubelet made a new one):
		// the running one stays bound.
		b.m.ignored.WithLabelValues("stale-sandbox").Inc()
		return
	}
	delete(b.pods, uid)
	delete(b.unannounced, uid)
	b.touch(uid)
}

// container adds (live) or drops a container of a tracked pod; any change
// has the pod's statsd look at it again (an UpdateWorkloadContainers).
func (b *Bridge) container(p *api.PodSandbox, c *api.Container, live bool) {
	uid := p.GetUid()
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := b.pods[uid]
	if cur == nil || cur.sandbox.ID != c.GetPodSandboxId() || c.GetId() == cur.sandbox.ID {
		return
	}
	name := foreign.ASCII(c.GetName(), maxIdentityBytes)
	if old, ok := cur.containers[c.GetId()]; ok == live && (!live || old.name == name) {
		return
	}
	np := *cur
	np.containers = maps.Clone(cur.containers)
	if live {
		b.seq++
		np.containers[c.GetId()] = ctr{name: name, seq: b.seq}
	} else {
		delete(np.containers, c.GetId())
	}
	np.changed = time.Now()
	b.pods[uid] = &np
	b.touch(uid)
}

// Synchronize replaces the desired state with the pods that exist (those
// with a task, pid not 0; a pod without one is stopped, not yet removed),
// then has every statsd listed: the pods not bound are bound, the bindings
// whose pod is gone are checkpointed.
func (b *Bridge) Synchronize(pods []*api.PodSandbox, containers []*api.Container) {
	b.m.event("synchronize")
	live := map[string][]*api.Container{}
	for _, c := range containers {
		switch c.GetState() {
		case api.ContainerState_CONTAINER_CREATED, api.ContainerState_CONTAINER_RUNNING, api.ContainerState_CONTAINER_PAUSED:
			live[c.GetPodSandboxId()] = append(live[c.GetPodSandboxId()], c)
		}
	}
	want := map[string]*pod{}
	running := map[string]string{}
	for _, p := range pods {
		if p.GetPid() == 0 {
			continue
		}
		if b.opt.Mapping.KindOf(p.GetRuntimeHandler()) != 0 && ValidUID(p.GetUid()) == nil {
			running[p.GetUid()] = p.GetId()
		}
		np := b.newPod(p)
		if np == nil {
			continue
		}
		want[np.uid] = np
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(want) > b.opt.MaxPods {
		uids := slices.Sorted(maps.Keys(want))
		for _, uid := range uids[b.opt.MaxPods:] {
			delete(want, uid)
			b.m.unactionable.WithLabelValues("too-many-pods").Inc()
		}
		b.notes.add(slog.LevelWarn, "nri: cannot bind a pod", "too-many-pods", "pods", len(uids), "max_pods", b.opt.MaxPods)
	}
	old := b.pods
	for uid, np := range want {
		o := old[uid]
		if o != nil && o.sandbox.ID != np.sandbox.ID {
			o = nil
		}
		b.liveContainers(np, o, live[np.sandbox.ID])
		if o != nil && maps.Equal(o.containers, np.containers) {
			np.changed = o.changed
		} else {
			np.changed = time.Now()
		}
	}
	b.pods, b.running = want, running
	// After a refresh the runtime is the one that announced the pods it
	// did (a pod started meanwhile too: only the bridge was away); after
	// any other connect it may have restarted, forgetting every pod.
	was := b.unannounced
	b.unannounced = map[string]string{}
	for uid, np := range want {
		if !b.refreshing || was[uid] == np.sandbox.ID {
			b.unannounced[uid] = np.sandbox.ID
		}
	}
	b.refreshing = false
	for uid := range old {
		if want[uid] == nil {
			b.touch(uid)
		}
	}
	for uid := range want {
		b.touch(uid)
	}
	b.synced, b.everSynced = true, true
	for _, s := range b.shards {
		s.requestList()
	}
	b.notes.add(slog.LevelInfo, "nri: synchronized", "", "pods", len(pods), "containers", len(containers), "watched_running", len(want))
}

// liveContainers fills np's containers from a Synchronize's live ones:
// those the bridge knew (in old, the same sandbox) keep their place, the
// others follow in the order they were created. b.mu is held.
func (b *Bridge) liveContainers(np, old *pod, cs []*api.Container) {
	slices.SortFunc(cs, func(x, y *api.Container) int {
		if c := cmp.Compare(x.GetCreatedAt(), y.GetCreatedAt()); c != 0 {
			return c
		}
		return strings.Compare(x.GetId(), y.GetId())
	})
	for _, c := range cs {
		if c.GetId() == np.sandbox.ID {
			continue
		}
		name := foreign.ASCII(c.GetName(), maxIdentityBytes)
		if o, ok := old.knownContainer(c.GetId()); ok {
			np.containers[c.GetId()] = ctr{name: name, seq: o.seq}
			continue
		}
		b.seq++
		np.containers[c.GetId()] = ctr{name: name, seq: b.seq}
	}
}

// knownContainer is p's container id (p may be nil).
func (p *pod) knownContainer(id string) (ctr, bool) {
	if p == nil {
		return ctr{}, false
	}
	c, ok := p.containers[id]
	return c, ok
}
