package kubernetes_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"
	"sigs.k8s.io/yaml"
)

// shards are the statsd containers, in the order of the bridge's --statsd.
var shards = []string{"nri-0", "nri-1", "nri-2", "nri-3", "nri-4", "nri-5", "nri-6", "nri-7"}

// statsdContainer is the container of a shard.
func statsdContainer(shard string) string { return "statsd-" + shard }

// podVolume is a volume the pod may have: where it comes from, which
// containers may mount it, at which path, and whether they may write it.
type podVolume struct {
	hostPath  string // "" for an emptyDir or a ConfigMap
	emptyDir  bool
	configMap string
	mountPath string
	writers   []string // containers mounting it writable
	readers   []string // containers mounting it read-only
	// recursive: a host directory with submounts, mounted read-only
	// recursively where the runtime can (recursiveReadOnly: IfPossible).
	recursive bool
	// perShard: each statsd shard mounts its own subdirectory (subPath
	// nri-N at mountPath/nri-N); the other containers the whole volume.
	perShard bool
}

// allStatsd is every shard's container.
func allStatsd() []string {
	var out []string
	for _, s := range shards {
		out = append(out, statsdContainer(s))
	}
	return out
}

// volumes: everything the pod may mount. The host's kernel files and the
// runtimes' directories read-only; each state directory writable by its
// owner only; the lifecycle sockets never the agent's.
var volumes = map[string]podVolume{
	"stats-sockets":     {emptyDir: true, mountPath: "/run/statsd", writers: allStatsd(), readers: []string{"statsnri", "statsagent"}, perShard: true},
	"lifecycle-sockets": {emptyDir: true, mountPath: "/run/statsd-lifecycle", writers: allStatsd(), readers: []string{"statsnri"}, perShard: true},
	"statsd-state":      {hostPath: "/var/lib/statsd", mountPath: "/var/lib/statsd", writers: allStatsd()},
	"host-proc":         {hostPath: "/proc", mountPath: "/host/proc", readers: allStatsd(), recursive: true},
	"host-cgroup":       {hostPath: "/sys/fs/cgroup", mountPath: "/sys/fs/cgroup", readers: allStatsd(), recursive: true},
	"host-debugfs":      {hostPath: "/sys/kernel/debug", mountPath: "/sys/kernel/debug", readers: allStatsd(), recursive: true},
	"runsc-root":        {hostPath: "/run/containerd/runsc/k8s.io", mountPath: "/run/containerd/runsc/k8s.io", readers: allStatsd(), recursive: true},
	"kata-run":          {hostPath: "/run/vc", mountPath: "/run/vc", readers: append(allStatsd(), "statsnri"), recursive: true},
	"nri":               {hostPath: "/var/run/nri", mountPath: "/var/run/nri", readers: []string{"statsnri"}},
	"statsnri-state":    {hostPath: "/var/lib/statsnri", mountPath: "/var/lib/statsnri", writers: []string{"statsnri"}},
	"agent-state":       {hostPath: "/var/lib/statsagent", mountPath: "/var/lib/statsagent", writers: []string{"statsagent", "own-dir"}},
	"otelcol-queue":     {hostPath: "/var/lib/otelcol", mountPath: "/var/lib/otelcol", writers: []string{"otelcol", "own-dir"}},
	"otelcol-config":    {configMap: "otelcol-config", mountPath: "/etc/otelcol", readers: []string{"otelcol"}},
}

// container returns the pod's container (or init container) named name.
func container(t *testing.T, pod corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

// flags splits --flag=value arguments (every argument must be one).
func flags(t *testing.T, c corev1.Container) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, a := range c.Args {
		k, v, ok := strings.Cut(a, "=")
		if !ok || !strings.HasPrefix(k, "--") {
			if c.Name == "own-dir" && a == "own-dir" {
				continue // statsctl's command
			}
			t.Errorf("%s: arg %q: want --flag=value", c.Name, a)
			continue
		}
		out[k] = append(out[k], v)
	}
	return out
}

func one(t *testing.T, c corev1.Container, args map[string][]string, flag string) string {
	t.Helper()
	if len(args[flag]) != 1 {
		t.Errorf("%s: %s %q: want it once", c.Name, flag, args[flag])
		return ""
	}
	return args[flag][0]
}

// TestDaemonSet: everything runs in one pod, which shares no host namespace;
// each container mounts only the volumes it needs, read-only unless it
// writes there, and has no privilege but the one the init container's
// chown needs.
func TestDaemonSet(t *testing.T) {
	ds := only[*appsv1.DaemonSet](t, objects(t), "daemonset.yaml")
	pod := ds.Spec.Template.Spec
	if !labelsMatch(ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) {
		t.Errorf("selector %v does not match the pod labels %v", ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels)
	}
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ru == nil ||
		ru.MaxUnavailable == nil || ru.MaxUnavailable.String() != "1" || ru.MaxSurge == nil || ru.MaxSurge.String() != "0" {
		t.Errorf("update strategy %+v: want a rolling update, one pod at a time, no surge (one pod a node owns the state on the node's disk)", ds.Spec.UpdateStrategy)
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC || (pod.ShareProcessNamespace != nil && *pod.ShareProcessNamespace) {
		t.Error("a namespace shared: the host's, or the pod's PID namespace")
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the service account token is mounted; no container calls the Kubernetes API")
	}
	if psc := pod.SecurityContext; psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("no RuntimeDefault seccomp profile")
	}

	var names []string
	for _, c := range pod.InitContainers {
		names = append(names, "init:"+c.Name)
	}
	for _, c := range pod.Containers {
		names = append(names, c.Name)
	}
	want := slices.Concat([]string{"init:own-dir"}, allStatsd(), []string{"statsnri", "statsagent", "otelcol"})
	if !slices.Equal(names, want) {
		t.Fatalf("containers %q, want %q", names, want)
	}

	for _, v := range pod.Volumes {
		want, ok := volumes[v.Name]
		switch {
		case !ok:
			t.Errorf("volume %q not allowed", v.Name)
		case want.hostPath != "" && (v.HostPath == nil || v.HostPath.Path != want.hostPath || v.HostPath.Type == nil):
			t.Errorf("volume %q: %+v, want the hostPath %s with a type", v.Name, v.VolumeSource, want.hostPath)
		case want.emptyDir && (v.EmptyDir == nil || v.EmptyDir.Medium != ""):
			t.Errorf("volume %q: %+v, want an emptyDir on the node's disk", v.Name, v.VolumeSource)
		case want.configMap != "" && (v.ConfigMap == nil || v.ConfigMap.Name != want.configMap):
			t.Errorf("volume %q: %+v, want the ConfigMap %s", v.Name, v.VolumeSource, want.configMap)
		}
	}
	if len(pod.Volumes) != len(volumes) {
		t.Errorf("%d volumes, want %d", len(pod.Volumes), len(volumes))
	}

	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		checkSecurityContext(t, c)
		for _, m := range c.VolumeMounts {
			v, ok := volumes[m.Name]
			wantPath, wantSub := v.mountPath, ""
			if shard, isShard := strings.CutPrefix(c.Name, "statsd-"); isShard && v.perShard {
				wantPath, wantSub = v.mountPath+"/"+shard, shard
			}
			rro := m.RecursiveReadOnly != nil && *m.RecursiveReadOnly == corev1.RecursiveReadOnlyIfPossible
			switch {
			case !ok:
				t.Errorf("%s mounts %q, no such volume", c.Name, m.Name)
			case m.MountPath != wantPath:
				t.Errorf("%s mounts %s at %s, want %s", c.Name, m.Name, m.MountPath, wantPath)
			case v.perShard && m.SubPath != wantSub:
				t.Errorf("%s mounts %s's subPath %q, want %q (a shard its own subdirectory only, the others the whole volume)", c.Name, m.Name, m.SubPath, wantSub)
			case rro != v.recursive:
				t.Errorf("%s mounts %s with recursiveReadOnly %v, want IfPossible: %v (the host's submounts read-only too)", c.Name, m.Name, m.RecursiveReadOnly, v.recursive)
			case m.ReadOnly && !slices.Contains(v.readers, c.Name), !m.ReadOnly && !slices.Contains(v.writers, c.Name):
				t.Errorf("%s mounts %s (read-only %v): want the readers %q and the writers %q only", c.Name, m.Name, m.ReadOnly, v.readers, v.writers)
			case m.MountPropagation != nil && *m.MountPropagation != corev1.MountPropagationNone:
				t.Errorf("%s mounts %s with propagation %s", c.Name, m.Name, *m.MountPropagation)
			}
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: resources %+v: want CPU and memory requests and a memory limit", c.Name, c.Resources)
		}
	}

	agent := container(t, pod, "statsagent")
	for _, m := range agent.VolumeMounts {
		if m.Name == "lifecycle-sockets" || strings.HasPrefix(m.MountPath, volumes["lifecycle-sockets"].mountPath) {
			t.Errorf("the agent mounts %+v: it must not reach the lifecycle sockets", m)
		}
	}
}

// checkSecurityContext: every container says its user, cannot gain a
// privilege, has a read-only root, and keeps no capability; only the init
// container adds one, CAP_CHOWN; only the agent and the Collector are not
// root's, and they say so.
func checkSecurityContext(t *testing.T, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil {
		t.Errorf("%s: no security context", c.Name)
		return
	}
	wantAdd := []corev1.Capability(nil)
	if c.Name == "own-dir" {
		wantAdd = []corev1.Capability{"CHOWN"}
	}
	nonRoot := c.Name == "statsagent" || c.Name == "otelcol"
	switch {
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("%s: privilege escalation allowed", c.Name)
	case sc.Privileged == nil || *sc.Privileged:
		t.Errorf("%s: privileged (or not said)", c.Name)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("%s: writable root file system", c.Name)
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, wantAdd):
		t.Errorf("%s: capabilities %+v: want all dropped, %v added", c.Name, sc.Capabilities, wantAdd)
	case sc.RunAsUser == nil || sc.RunAsGroup == nil:
		t.Errorf("%s: the user or group is the image's: say it", c.Name)
	case nonRoot && (*sc.RunAsUser == 0 || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot):
		t.Errorf("%s runs as uid %d (runAsNonRoot %v): want not root", c.Name, *sc.RunAsUser, sc.RunAsNonRoot)
	case !nonRoot && *sc.RunAsUser != 0:
		t.Errorf("%s runs as uid %d, want root's (the files and sockets it reads are root's)", c.Name, *sc.RunAsUser)
	case sc.ProcMount != nil || sc.SELinuxOptions != nil || sc.SeccompProfile != nil || sc.AppArmorProfile != nil:
		t.Errorf("%s: a security option of its own: %+v", c.Name, sc)
	}
}

// TestStatsdShards: eight statsd containers alike but for the shard's name
// (so the comments on the first hold for all), each with its own sockets and
// its own state directory, reading the host's /proc, cgroups and runsc root
// where they are mounted; the bridge names them in order.
func TestStatsdShards(t *testing.T) {
	pod := only[*appsv1.DaemonSet](t, objects(t), "daemonset.yaml").Spec.Template.Spec
	first := container(t, pod, statsdContainer(shards[0]))
	mountAt := map[string]corev1.VolumeMount{}
	for _, m := range first.VolumeMounts {
		mountAt[m.Name] = m
	}
	args := flags(t, first)
	if got := one(t, first, args, "--proc-root"); got != mountAt["host-proc"].MountPath {
		t.Errorf("--proc-root %q, the host's /proc is at %q", got, mountAt["host-proc"].MountPath)
	}
	if got := one(t, first, args, "--runsc-root"); got != mountAt["runsc-root"].MountPath {
		t.Errorf("--runsc-root %q, runsc's root is at %q", got, mountAt["runsc-root"].MountPath)
	}
	if got := one(t, first, args, "--state-dir"); got != mountAt["statsd-state"].MountPath {
		t.Errorf("--state-dir %q, the shard's state is at %q", got, mountAt["statsd-state"].MountPath)
	}
	if sc := first.SecurityContext; sc == nil || sc.RunAsGroup == nil || *sc.RunAsGroup != socketGID(t) {
		t.Errorf("statsd's group is not the socket group %d (its stats sockets are the group's)", socketGID(t))
	}
	bridge := flags(t, container(t, pod, "statsnri"))
	if len(bridge["--statsd"]) != len(shards) {
		t.Fatalf("the bridge names %d statsd, want %d", len(bridge["--statsd"]), len(shards))
	}
	for i, shard := range shards {
		c := container(t, pod, statsdContainer(shard))
		lc := "/run/statsd-lifecycle/" + shard + "/" + shard + ".sock"
		st := "/run/statsd/" + shard + "/" + shard + ".sock"
		want := first.DeepCopy()
		want.Name = c.Name
		want.Args = slices.Clone(first.Args)
		for j, a := range want.Args {
			want.Args[j] = strings.ReplaceAll(a, shards[0], shard)
		}
		for j, m := range want.VolumeMounts {
			if m.SubPath != "" {
				want.VolumeMounts[j].SubPath = shard
				want.VolumeMounts[j].MountPath = strings.ReplaceAll(m.MountPath, shards[0], shard)
			}
		}
		gotJSON, _ := yaml.Marshal(c)
		wantJSON, _ := yaml.Marshal(want)
		if string(gotJSON) != string(wantJSON) {
			t.Errorf("%s differs from %s other than by the shard's name:\n%s\nwant\n%s", c.Name, first.Name, gotJSON, wantJSON)
		}
		a := flags(t, c)
		if one(t, c, a, "--listen") != st || one(t, c, a, "--lifecycle-listen") != lc || mountAt["statsd-state"].SubPath != shards[0] {
			t.Errorf("%s: sockets %q %q: want %s and %s", c.Name, a["--listen"], a["--lifecycle-listen"], st, lc)
		}
		mounted := map[string]string{}
		for _, m := range c.VolumeMounts {
			mounted[m.Name] = m.MountPath
		}
		if filepath.Dir(st) != mounted["stats-sockets"] || filepath.Dir(lc) != mounted["lifecycle-sockets"] {
			t.Errorf("%s: sockets %s %s not in its own subdirectories %v", c.Name, st, lc, mounted)
		}
		if bridge["--statsd"][i] != lc+","+st {
			t.Errorf("the bridge's statsd %d is %q, want %s,%s", i, bridge["--statsd"][i], lc, st)
		}
	}
}

// TestAgentAndCollector: the agent polls the stats sockets as the socket
// group, keeps its state where its volume is, and exports OTLP to the
// Collector's loopback receiver; the Collector runs deploy/otel/collector.yaml
// from its ConfigMap with its queue on the node's disk; the init container
// gives both state directories to their uid.
func TestAgentAndCollector(t *testing.T) {
	pod := only[*appsv1.DaemonSet](t, objects(t), "daemonset.yaml").Spec.Template.Spec
	agent := container(t, pod, "statsagent")
	a := flags(t, agent)
	if sc := agent.SecurityContext; *sc.RunAsGroup != socketGID(t) {
		t.Errorf("the agent's group %d is not the socket group %d (statsd admits it by its primary group: the pod's containers do not share a PID namespace, so statsd cannot read a peer's supplementary groups)", *sc.RunAsGroup, socketGID(t))
	}
	if one(t, agent, a, "--sockets") != "/run/statsd/*/*.sock" || one(t, agent, a, "--state-dir") != "/var/lib/statsagent" {
		t.Errorf("agent args %q: want --sockets=/run/statsd/*/*.sock and --state-dir=/var/lib/statsagent", agent.Args)
	}
	if len(agent.Ports) != 1 || agent.Ports[0].Name != "metrics" || agent.Ports[0].ContainerPort != 9477 || one(t, agent, a, "--metrics-listen") != "0.0.0.0:9477" {
		t.Errorf("ports %+v, args %q: want metrics on 9477", agent.Ports, agent.Args)
	}
	for name, p := range map[string]*corev1.Probe{"liveness": agent.LivenessProbe, "readiness": agent.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s probe %+v: want GET /healthz on metrics", name, p)
		}
	}

	var cfg struct {
		Receivers struct {
			OTLP struct {
				Protocols struct {
					GRPC struct {
						Endpoint string `json:"endpoint"`
					} `json:"grpc"`
				} `json:"protocols"`
			} `json:"otlp"`
		} `json:"receivers"`
		Extensions struct {
			FileStorage struct {
				Directory string `json:"directory"`
			} `json:"file_storage"`
		} `json:"extensions"`
		Processors struct {
			MemoryLimiter struct {
				LimitMiB int64 `json:"limit_mib"`
			} `json:"memory_limiter"`
		} `json:"processors"`
	}
	b, err := os.ReadFile("../otel/collector.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if got, want := one(t, agent, a, "--otlp-endpoint"), "http://"+cfg.Receivers.OTLP.Protocols.GRPC.Endpoint; got != want {
		t.Errorf("the agent exports to %q, the Collector receives OTLP/gRPC on %q", got, want)
	}

	col := container(t, pod, "otelcol")
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range col.VolumeMounts {
		mounts[m.Name] = m
	}
	if c := flags(t, col); one(t, col, c, "--config") != filepath.Join(mounts["otelcol-config"].MountPath, "collector.yaml") {
		t.Errorf("otelcol --config %q: want collector.yaml of the ConfigMap mounted at %s", c["--config"], mounts["otelcol-config"].MountPath)
	}
	if q := mounts["otelcol-queue"]; q.ReadOnly || !strings.HasPrefix(cfg.Extensions.FileStorage.Directory, q.MountPath+"/") {
		t.Errorf("the Collector's queue %s is not in its writable volume %+v", cfg.Extensions.FileStorage.Directory, q)
	}
	if len(col.EnvFrom) != 1 || col.EnvFrom[0].ConfigMapRef == nil || col.EnvFrom[0].ConfigMapRef.Name != "otelcol-gateway" || len(col.Env) != 0 {
		t.Errorf("otelcol env %+v %+v: want all of it from the ConfigMap otelcol-gateway", col.EnvFrom, col.Env)
	}
	if lim := col.Resources.Limits.Memory().Value(); lim <= cfg.Processors.MemoryLimiter.LimitMiB<<20 {
		t.Errorf("otelcol's memory limit %d is not above its memory_limiter's %d MiB", lim, cfg.Processors.MemoryLimiter.LimitMiB)
	}
	if len(col.Ports) != 0 {
		t.Errorf("otelcol ports %+v: it receives on loopback only", col.Ports)
	}

	own := container(t, pod, "own-dir")
	o := flags(t, own)
	if !slices.Equal(own.Command, []string{"/usr/local/bin/statsctl"}) || own.Args[0] != "own-dir" {
		t.Errorf("init container %q %q: want statsctl own-dir", own.Command, own.Args)
	}
	if want := fmt.Sprintf("%d:%d", *agent.SecurityContext.RunAsUser, *col.SecurityContext.RunAsGroup); one(t, own, o, "--owner") != want ||
		*agent.SecurityContext.RunAsUser != *col.SecurityContext.RunAsUser {
		t.Errorf("own-dir --owner %q: want the agent's and the Collector's uid, %s", o["--owner"], want)
	}
	if want := []string{"/var/lib/statsagent", "/var/lib/otelcol"}; !slices.Equal(o["--dir"], want) {
		t.Errorf("own-dir --dir %q, want %q", o["--dir"], want)
	}
}

// TestEveryPrivilegeCommented: in daemonset.yaml each volume mount of the
// first statsd and of the other containers, and each capability added, has
// a comment saying what needs it (the other shards are the first's copies:
// TestStatsdShards).
func TestEveryPrivilegeCommented(t *testing.T) {
	b, err := os.ReadFile("daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	root, err := kyaml.Parse(string(b))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := root.Pipe(kyaml.Lookup("spec", "template", "spec"))
	if err != nil || spec == nil {
		t.Fatalf("no pod spec: %v", err)
	}
	commented := func(n *kyaml.RNode) bool {
		y := n.YNode()
		if y.HeadComment != "" {
			return true
		}
		return len(y.Content) > 0 && y.Content[0].HeadComment != ""
	}
	for _, list := range []string{"initContainers", "containers"} {
		cs, err := spec.Pipe(kyaml.Lookup(list))
		if err != nil || cs == nil {
			t.Fatalf("no %s: %v", list, err)
		}
		elems, _ := cs.Elements()
		for _, c := range elems {
			name := kyaml.GetValue(c.Field("name").Value)
			if strings.HasPrefix(name, "statsd-") && name != statsdContainer(shards[0]) {
				continue
			}
			if mounts := c.Field("volumeMounts"); mounts != nil {
				ms, _ := mounts.Value.Elements()
				for _, m := range ms {
					v := volumes[kyaml.GetValue(m.Field("name").Value)]
					if v.hostPath != "" && !commented(m) {
						t.Errorf("%s: the mount of %s has no comment saying which read needs it", name, v.hostPath)
					}
				}
			}
			if add, _ := c.Pipe(kyaml.Lookup("securityContext", "capabilities", "add")); add != nil {
				if !commented(add) && add.YNode().HeadComment == "" {
					caps, _ := c.Pipe(kyaml.Lookup("securityContext", "capabilities"))
					if f := caps.Field("add"); f == nil || f.Key.YNode().HeadComment == "" {
						t.Errorf("%s: a capability added without a comment saying what needs it", name)
					}
				}
			}
		}
	}
}
