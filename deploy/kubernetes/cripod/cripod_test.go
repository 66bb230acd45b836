package cripod

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"
)

// testDaemonSet is a DaemonSet holding one of each thing translated.
const testDaemonSet = `
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: ops}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata:
      labels: {app: agent}
      annotations: {note: kept}
    spec:
      automountServiceAccountToken: false
      enableServiceLinks: false
      terminationGracePeriodSeconds: 7
      hostPID: true
      securityContext:
        runAsUser: 1000
        runAsGroup: 1000
        supplementalGroups: [2375]
        seccompProfile: {type: RuntimeDefault}
      initContainers:
        - name: init
          image: reg/init@sha256:aa
          command: [/bin/init]
          args: [--dir=$(STATE)/x, $$(STATE), $(UNSET)]
          env: [{name: STATE, value: /var/lib/agent}]
          securityContext:
            runAsUser: 0
            capabilities: {drop: [ALL], add: [CHOWN]}
          volumeMounts: [{name: state, mountPath: /var/lib/agent}]
      containers:
        - name: main
          image: reg/main:1
          args: [--node=$(NODE), --gw=$(GATEWAY)]
          envFrom: [{configMapRef: {name: gw}}]
          env:
            - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
            - {name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
            - {name: GATEWAY, value: "override:$(NODE)"}
            - {name: API, value: "$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"}
            - {name: KUBERNETES_SERVICE_PORT, value: "6443"}
          ports: [{name: metrics, containerPort: 9477, protocol: TCP}]
          resources:
            requests: {cpu: 250m, memory: 512Mi}
            limits: {cpu: 500m, memory: 1Gi}
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {drop: [ALL]}
          volumeMounts:
            - {name: proc, mountPath: /host/proc, readOnly: true}
            - {name: state, mountPath: /var/lib/agent, subPath: main}
            - {name: sockets, mountPath: /run/s}
            - {name: config, mountPath: /etc/main}
            - {name: runtime, mountPath: /run/rt, readOnly: true, mountPropagation: HostToContainer}
        - name: priv
          image: reg/priv:1
          securityContext: {privileged: true, runAsUser: 0}
      volumes:
        - {name: proc, hostPath: {path: /proc, type: Directory}}
        - {name: state, hostPath: {path: /var/lib/agent, type: DirectoryOrCreate}}
        - {name: runtime, hostPath: {path: /run/rt/k8s.io, type: DirectoryOrCreate}}
        - {name: sockets, emptyDir: {}}
        - {name: config, configMap: {name: main-config}}
`

func testObjects(t *testing.T) (*appsv1.DaemonSet, map[string]*corev1.ConfigMap) {
	t.Helper()
	ds := &appsv1.DaemonSet{}
	if err := DecodeStrict([]byte(testDaemonSet), ds); err != nil {
		t.Fatal(err)
	}
	return ds, map[string]*corev1.ConfigMap{
		"gw":          {Data: map[string]string{"GATEWAY": "gw:4317", "INSECURE": "true"}},
		"main-config": {Data: map[string]string{"main.yaml": "a: 1\n"}},
	}
}

func testOptions(dir string) Options {
	return Options{Name: "agent-x1y2z", UID: "uid-1", NodeName: "node-1", PodDir: filepath.Join(dir, "pod"),
		HostPaths: map[string]string{"/var/lib": filepath.Join(dir, "var-lib"), "/run/rt": filepath.Join(dir, "rt"),
			"/run/rt/k8s.io": filepath.Join(dir, "rt-k8s")},
		NodeMemoryBytes: 8 << 30}
}

func find(cs []*Container, name string) *runtimeapi.ContainerConfig {
	for _, c := range cs {
		if c.Name == name {
			return c.Config
		}
	}
	return nil
}

func env(cfg *runtimeapi.ContainerConfig) map[string]string {
	out := map[string]string{}
	for _, kv := range cfg.Envs {
		out[kv.Key] = string(kv.Value)
	}
	return out
}

// TestFromDaemonSet: each part of the pod as the kubelet hands it over.
func TestFromDaemonSet(t *testing.T) {
	dir := t.TempDir()
	ds, cms := testObjects(t)
	p, err := FromDaemonSet(ds, cms, testOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	sb := p.Sandbox
	t.Run("sandbox", func(t *testing.T) {
		md := sb.Metadata
		if md.Name != "agent-x1y2z" || md.Namespace != "ops" || md.Uid != "uid-1" || md.Attempt != 0 || sb.Hostname != "agent-x1y2z" {
			t.Errorf("metadata %v, hostname %q", md, sb.Hostname)
		}
		if sb.Labels["app"] != "agent" || sb.Labels["io.kubernetes.pod.uid"] != "uid-1" || sb.Annotations["note"] != "kept" {
			t.Errorf("labels %v, annotations %v", sb.Labels, sb.Annotations)
		}
		sc := sb.Linux.SecurityContext
		ns := sc.NamespaceOptions
		if ns.Network != runtimeapi.NamespaceMode_POD || ns.Pid != runtimeapi.NamespaceMode_NODE || ns.Ipc != runtimeapi.NamespaceMode_POD {
			t.Errorf("namespaces %v: want the pod's network and IPC, the node's PID (hostPID)", ns)
		}
		if sc.RunAsUser.GetValue() != 1000 || sc.RunAsGroup.GetValue() != 1000 || !slices.Equal(sc.SupplementalGroups, []int64{2375}) ||
			!sc.Privileged || sc.Seccomp.GetProfileType() != runtimeapi.SecurityProfile_RuntimeDefault {
			t.Errorf("sandbox security %v", sc)
		}
		if len(sb.PortMappings) != 1 || sb.PortMappings[0].ContainerPort != 9477 || sb.PortMappings[0].Protocol != runtimeapi.Protocol_TCP {
			t.Errorf("ports %v", sb.PortMappings)
		}
	})
	t.Run("init container", func(t *testing.T) {
		if len(p.InitContainers) != 1 || len(p.Containers) != 2 {
			t.Fatalf("%d init containers, %d containers", len(p.InitContainers), len(p.Containers))
		}
		c := p.InitContainers[0].Config
		if want := []string{"--dir=/var/lib/agent/x", "$(STATE)", "$(UNSET)"}; !slices.Equal(c.Args, want) || !slices.Equal(c.Command, []string{"/bin/init"}) {
			t.Errorf("command %q args %q, want args %q ($(VAR) expanded, $$ escaped, an unknown reference kept)", c.Command, c.Args, want)
		}
		sc := c.Linux.SecurityContext
		if sc.RunAsUser.GetValue() != 0 || sc.RunAsUser == nil || sc.RunAsGroup.GetValue() != 1000 || sc.NoNewPrivs ||
			!slices.Equal(sc.Capabilities.AddCapabilities, []string{"CHOWN"}) || !slices.Equal(sc.Capabilities.DropCapabilities, []string{"ALL"}) {
			t.Errorf("init security %v: want uid 0 (its own), the pod's group, no_new_privs unset (allowPrivilegeEscalation unset), CHOWN added", sc)
		}
		if len(c.Mounts) != 2 || c.Mounts[0].HostPath != filepath.Join(dir, "var-lib", "agent") || c.Mounts[0].Readonly {
			t.Errorf("mounts %v", c.Mounts)
		}
	})
	t.Run("container", func(t *testing.T) {
		c := find(p.Containers, "main")
		e := env(c)
		if e["GATEWAY"] != "override:node-1" || e["INSECURE"] != "true" || e["NODE"] != "node-1" || e["POD"] != "agent-x1y2z" {
			t.Errorf("env %v: want envFrom's, env over it, fieldRefs, $(VAR) expanded", e)
		}
		// The Service kubernetes's variables, as the kubelet adds them
		// without service links; one the container sets is its own.
		for k, v := range map[string]string{
			"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "6443", "KUBERNETES_SERVICE_PORT_HTTPS": "443",
			"KUBERNETES_PORT": "tcp://10.96.0.1:443", "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443", "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
			"KUBERNETES_PORT_443_TCP_PORT": "443", "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1", "API": "10.96.0.1:443",
		} {
			if e[k] != v {
				t.Errorf("env %s=%q, want %q", k, e[k], v)
			}
		}
		if !slices.IsSortedFunc(c.Envs, func(a, b *runtimeapi.KeyValue) int { return strings.Compare(a.Key, b.Key) }) {
			t.Error("env not sorted by name")
		}
		if want := []string{"--node=node-1", "--gw=override:node-1"}; !slices.Equal(c.Args, want) {
			t.Errorf("args %q, want %q", c.Args, want)
		}
		if c.Image.Image != "reg/main:1" || c.Metadata.Name != "main" || c.LogPath != "main/0.log" || c.Labels["io.kubernetes.container.name"] != "main" ||
			c.Annotations["io.kubernetes.pod.terminationGracePeriod"] != "7" {
			t.Errorf("image %v metadata %v log %q labels %v annotations %v", c.Image, c.Metadata, c.LogPath, c.Labels, c.Annotations)
		}
		want := []*runtimeapi.Mount{
			{ContainerPath: "/host/proc", HostPath: "/proc", Readonly: true},
			{ContainerPath: "/var/lib/agent", HostPath: filepath.Join(dir, "var-lib", "agent", "main")},
			{ContainerPath: "/run/s", HostPath: filepath.Join(dir, "pod", "volumes", "kubernetes.io~empty-dir", "sockets")},
			{ContainerPath: "/etc/main", HostPath: filepath.Join(dir, "pod", "volumes", "kubernetes.io~configmap", "config"), Readonly: true},
			{ContainerPath: "/run/rt", HostPath: filepath.Join(dir, "rt-k8s"), Readonly: true, Propagation: runtimeapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER},
			{ContainerPath: "/dev/termination-log", HostPath: filepath.Join(dir, "pod", "containers", "main", "termination-log")},
		}
		if len(c.Mounts) != len(want) {
			t.Fatalf("%d mounts, want %d: %v", len(c.Mounts), len(want), c.Mounts)
		}
		for i := range want {
			if got := c.Mounts[i]; got.ContainerPath != want[i].ContainerPath || got.HostPath != want[i].HostPath || got.Readonly != want[i].Readonly || got.Propagation != want[i].Propagation {
				t.Errorf("mount %d: %v, want %v (a host path moved by its longest prefix; a ConfigMap read-only)", i, got, want[i])
			}
		}
		sc := c.Linux.SecurityContext
		if !sc.NoNewPrivs || !sc.ReadonlyRootfs || sc.Privileged || sc.RunAsUser.GetValue() != 1000 || len(sc.MaskedPaths) == 0 || len(sc.ReadonlyPaths) == 0 ||
			sc.NamespaceOptions.Pid != runtimeapi.NamespaceMode_NODE {
			t.Errorf("security %v", sc)
		}
		r := c.Linux.Resources
		// Burstable: 1000 - 1000 * 512Mi / 8Gi = 938.
		if r.CpuShares != 256 || r.CpuQuota != 50000 || r.CpuPeriod != 100000 || r.MemoryLimitInBytes != 1<<30 || r.OomScoreAdj != 938 {
			t.Errorf("resources %v", r)
		}
	})
	t.Run("privileged container", func(t *testing.T) {
		c := find(p.Containers, "priv")
		sc := c.Linux.SecurityContext
		if !sc.Privileged || len(sc.MaskedPaths) != 0 || len(sc.ReadonlyPaths) != 0 || sc.RunAsUser.GetValue() != 0 || sc.RunAsUser == nil {
			t.Errorf("security %v: a privileged container masks nothing", sc)
		}
		if r := c.Linux.Resources; r.CpuShares != 2 || r.MemoryLimitInBytes != 0 || r.CpuQuota != 0 {
			t.Errorf("resources %v: no request, no limit", r)
		}
	})
	t.Run("restarted", func(t *testing.T) {
		c := p.Containers[0]
		r := c.Restarted(2)
		if r.Metadata.Attempt != 2 || r.Annotations["io.kubernetes.container.restartCount"] != "2" || r.LogPath != "main/2.log" {
			t.Errorf("restart 2: %v %v %q", r.Metadata, r.Annotations, r.LogPath)
		}
		if c.Config.Metadata.Attempt != 0 || c.Config.LogPath != "main/0.log" {
			t.Error("Restarted changed the first attempt's config")
		}
	})
}

// TestNodeNetworkAndSeccomp: the options that depart from the manifest do
// what they say and nothing else.
func TestNodeNetworkAndSeccomp(t *testing.T) {
	ds, cms := testObjects(t)
	o := testOptions(t.TempDir())
	o.NodeNetwork, o.WithoutSeccomp = true, true
	p, err := FromDaemonSet(ds, cms, o)
	if err != nil {
		t.Fatal(err)
	}
	if ns := p.Sandbox.Linux.SecurityContext.NamespaceOptions; ns.Network != runtimeapi.NamespaceMode_NODE || p.Sandbox.Hostname != "" {
		t.Errorf("namespaces %v, hostname %q: want the node's network and no hostname", ns, p.Sandbox.Hostname)
	}
	for _, c := range slices.Concat(p.InitContainers, p.Containers) {
		sc := c.Config.Linux.SecurityContext
		if sc.Seccomp != nil || sc.NamespaceOptions.Network != runtimeapi.NamespaceMode_NODE {
			t.Errorf("%s: seccomp %v, namespaces %v", c.Name, sc.Seccomp, sc.NamespaceOptions)
		}
	}
	o.NodeNetwork, o.WithoutSeccomp = false, false
	ds.Spec.Template.Spec.SecurityContext.SeccompProfile = nil
	p, err = FromDaemonSet(ds, cms, o)
	if err != nil {
		t.Fatal(err)
	}
	if s := find(p.Containers, "main").Linux.SecurityContext.Seccomp; s.GetProfileType() != runtimeapi.SecurityProfile_Unconfined {
		t.Errorf("no profile asked: seccomp %v, want Unconfined (the kubelet without SeccompDefault)", s)
	}
}

// TestUnsupported: a field this package does not translate is an error.
func TestUnsupported(t *testing.T) {
	for name, edit := range map[string]func(*corev1.PodSpec){
		"service account token": func(s *corev1.PodSpec) { s.AutomountServiceAccountToken = nil },
		"runtime class":         func(s *corev1.PodSpec) { rc := "runsc"; s.RuntimeClassName = &rc },
		"secret volume": func(s *corev1.PodSpec) {
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "x"}}})
		},
		"memory emptyDir": func(s *corev1.PodSpec) { s.Volumes[3].EmptyDir.Medium = corev1.StorageMediumMemory },
		"fsGroup":         func(s *corev1.PodSpec) { g := int64(3000); s.SecurityContext.FSGroup = &g },
		"fsGroupChangePolicy": func(s *corev1.PodSpec) {
			p := corev1.FSGroupChangeOnRootMismatch
			s.SecurityContext.FSGroupChangePolicy = &p
		},
		"resource field env": func(s *corev1.PodSpec) {
			s.Containers[0].Env = append(s.Containers[0].Env, corev1.EnvVar{Name: "M", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory"}}})
		},
		"pod IP env": func(s *corev1.PodSpec) {
			s.Containers[0].Env = append(s.Containers[0].Env, corev1.EnvVar{Name: "IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}})
		},
		"sidecar": func(s *corev1.PodSpec) {
			always := corev1.ContainerRestartPolicyAlways
			s.InitContainers[0].RestartPolicy = &always
		},
	} {
		t.Run(name, func(t *testing.T) {
			ds, cms := testObjects(t)
			edit(&ds.Spec.Template.Spec)
			if _, err := FromDaemonSet(ds, cms, testOptions(t.TempDir())); !errors.Is(err, ErrUnsupported) {
				t.Errorf("err %v, want ErrUnsupported", err)
			}
		})
	}
	ds, _ := testObjects(t)
	if _, err := FromDaemonSet(ds, nil, testOptions(t.TempDir())); err == nil || !strings.Contains(err.Error(), "no ConfigMap") {
		t.Errorf("a missing ConfigMap: %v", err)
	}
}

// TestMaterialize: the volumes are made on the node as the kubelet makes
// them, and a hostPath of the wrong type is refused.
func TestMaterialize(t *testing.T) {
	dir := t.TempDir()
	ds, cms := testObjects(t)
	p, err := FromDaemonSet(ds, cms, testOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Materialize(); err != nil {
		t.Fatal(err)
	}
	for path, mode := range map[string]os.FileMode{
		filepath.Join(dir, "var-lib", "agent"):                                                 os.ModeDir | 0o755, // DirectoryOrCreate
		filepath.Join(dir, "var-lib", "agent", "main"):                                         os.ModeDir | 0o755, // the subPath, its volume's mode
		filepath.Join(dir, "rt-k8s"):                                                           os.ModeDir | 0o755,
		filepath.Join(dir, "pod", "volumes", "kubernetes.io~empty-dir", "sockets"):             os.ModeDir | 0o777,
		filepath.Join(dir, "pod", "volumes", "kubernetes.io~configmap", "config", "main.yaml"): 0o644,
		filepath.Join(dir, "pod", "containers", "main", "termination-log"):                     0,
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if mode != 0 && fi.Mode() != mode {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode(), mode)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "pod", "volumes", "kubernetes.io~configmap", "config", "main.yaml")); string(b) != "a: 1\n" {
		t.Errorf("the ConfigMap's file holds %q", b)
	}

	ds, cms = testObjects(t)
	ds.Spec.Template.Spec.Volumes[0].HostPath.Path = filepath.Join(dir, "missing")
	p, err = FromDaemonSet(ds, cms, testOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Materialize(); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a Directory that does not exist: %v", err)
	}
}

// TestExpand: the kubelet's $(VAR) expansion.
func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "x", "B": "$(A)"}
	for in, want := range map[string]string{
		"$(A)":     "x",
		"a$(A)b":   "axb",
		"$$(A)":    "$(A)",
		"$(C)":     "$(C)",
		"$(B)":     "$(A)", // not expanded twice
		"$(A":      "$(A",
		"$":        "$",
		"cost: $5": "cost: $5",
		"$(A)$(A)": "xx",
		"$$":       "$",
		"a$$$(A)b": "a$xb",
	} {
		if got := expand(in, vars); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestTheProjectsDaemonSet: deploy/kubernetes translates, and every
// container of it runs with no_new_privs, a read-only root, every
// capability dropped, and not privileged.
func TestTheProjectsDaemonSet(t *testing.T) {
	objs, err := Build("..")
	if err != nil {
		t.Fatal(err)
	}
	p, err := FromDaemonSet(objs.DaemonSet, objs.ConfigMaps, testOptions(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Containers) != 11 || len(p.InitContainers) != 1 {
		t.Errorf("%d containers, %d init containers", len(p.Containers), len(p.InitContainers))
	}
	for _, c := range slices.Concat(p.InitContainers, p.Containers) {
		sc := c.Config.Linux.SecurityContext
		if !sc.NoNewPrivs || !sc.ReadonlyRootfs || sc.Privileged || !slices.Equal(sc.Capabilities.GetDropCapabilities(), []string{"ALL"}) ||
			sc.Seccomp.GetProfileType() != runtimeapi.SecurityProfile_RuntimeDefault || sc.RunAsUser == nil {
			b, _ := yaml.Marshal(sc)
			t.Errorf("%s:\n%s", c.Name, b)
		}
	}
}

// TestRecursiveReadOnly: a volume mount's recursiveReadOnly resolved as the
// kubelet does, and the project's host mounts made recursive read-only
// where the runtime handler supports it.
func TestRecursiveReadOnly(t *testing.T) {
	mode := func(m corev1.RecursiveReadOnlyMode) *corev1.RecursiveReadOnlyMode { return &m }
	hostToContainer := corev1.MountPropagationHostToContainer
	for _, tc := range []struct {
		name      string
		mount     corev1.VolumeMount
		supported bool
		want      bool
		err       string
	}{
		{name: "unset", mount: corev1.VolumeMount{Name: "v", ReadOnly: true}, supported: true},
		{name: "disabled", mount: corev1.VolumeMount{Name: "v", ReadOnly: true, RecursiveReadOnly: mode(corev1.RecursiveReadOnlyDisabled)}, supported: true},
		{name: "if possible, supported", mount: corev1.VolumeMount{Name: "v", ReadOnly: true, RecursiveReadOnly: mode(corev1.RecursiveReadOnlyIfPossible)}, supported: true, want: true},
		{name: "if possible, unsupported", mount: corev1.VolumeMount{Name: "v", ReadOnly: true, RecursiveReadOnly: mode(corev1.RecursiveReadOnlyIfPossible)}},
		{name: "enabled, supported", mount: corev1.VolumeMount{Name: "v", ReadOnly: true, RecursiveReadOnly: mode(corev1.RecursiveReadOnlyEnabled)}, supported: true, want: true},
		{name: "enabled, unsupported", mount: corev1.VolumeMount{Name: "v", ReadOnly: true, RecursiveReadOnly: mode(corev1.RecursiveReadOnlyEnabled)}, err: "does not support"},
		{name: "writable", mount: corev1.VolumeMount{Name: "v", RecursiveReadOnly: mode(corev1.RecursiveReadOnlyIfPossible)}, supported: true, err: "readOnly: true"},
		{name: "propagation", mount: corev1.VolumeMount{Name: "v", ReadOnly: true, MountPropagation: &hostToContainer, RecursiveReadOnly: mode(corev1.RecursiveReadOnlyIfPossible)}, supported: true, err: "mountPropagation None"},
		{name: "unknown", mount: corev1.VolumeMount{Name: "v", ReadOnly: true, RecursiveReadOnly: mode("Sometimes")}, supported: true, err: "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := recursiveReadOnly(tc.mount, tc.supported)
			if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("got %v, %v; want %v and an error with %q", got, err, tc.want, tc.err)
			}
		})
	}

	objs, err := Build("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, supported := range []bool{true, false} {
		o := testOptions(t.TempDir())
		o.RecursiveReadOnlyMounts = supported
		p, err := FromDaemonSet(objs.DaemonSet, objs.ConfigMaps, o)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range p.Containers {
			for _, m := range c.Config.Mounts {
				if m.RecursiveReadOnly {
					n++
					if !m.Readonly || m.Propagation != runtimeapi.MountPropagation_PROPAGATION_PRIVATE {
						t.Errorf("%s: %s recursive read-only but %v", c.Name, m.ContainerPath, m)
					}
				}
			}
		}
		// 5 host mounts in each of the 8 shards, Kata's in the bridge.
		if want := map[bool]int{true: 41, false: 0}[supported]; n != want {
			t.Errorf("runtime support %v: %d recursive read-only mounts, want %d", supported, n, want)
		}
	}
}
