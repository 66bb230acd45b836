package nribridge

import (
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/containerd/nri/pkg/api"
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

// ContainerCreated adds a container to a Kata pod's set.
func (b *Bridge) ContainerCreated(p *api.PodSandbox, c *api.Container) {
	b.m.event("post-create-container")
	b.container(p, c, true)
}

// ContainerStopped removes a container from a Kata pod's set (stopped,
// its usage is no longer the guest's).
func (b *Bridge) ContainerStopped(p *api.PodSandbox, c *api.Container) {
	b.m.event("stop-container")
	b.container(p, c, false)
}

// ContainerRemoved removes a container from a Kata pod's set.
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
	return &pod{uid: p.GetUid(), identity: id, sandbox: SandboxOf(kind, p), containers: map[string]bool{}}
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

func (b *Bridge) container(p *api.PodSandbox, c *api.Container, live bool) {
	uid := p.GetUid()
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := b.pods[uid]
	if cur == nil || cur.sandbox.Kind != KindKata || cur.sandbox.ID != c.GetPodSandboxId() {
		return
	}
	if cur.containers[c.GetId()] == live {
		return
	}
	np := *cur
	np.containers = maps.Clone(cur.containers)
	if live {
		np.containers[c.GetId()] = true
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
	live := map[string][]string{}
	for _, c := range containers {
		switch c.GetState() {
		case api.ContainerState_CONTAINER_CREATED, api.ContainerState_CONTAINER_RUNNING, api.ContainerState_CONTAINER_PAUSED:
			live[c.GetPodSandboxId()] = append(live[c.GetPodSandboxId()], c.GetId())
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
		if np.sandbox.Kind == KindKata {
			for _, id := range live[np.sandbox.ID] {
				np.containers[id] = true
			}
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
		if o := old[uid]; o != nil && o.sandbox.ID == np.sandbox.ID && maps.Equal(o.containers, np.containers) {
			np.changed = o.changed
		} else if np.sandbox.Kind == KindKata {
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
