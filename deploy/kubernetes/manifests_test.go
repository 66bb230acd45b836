package kubernetes_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	kustypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/sandboxstats/sandboxstats/deploy/kubernetes/cripod"
)

// decodeStrict decodes one YAML document into its API type by apiVersion
// and kind as the API server does (cripod.DecodeStrict).
func decodeStrict(doc []byte) (any, error) {
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return nil, err
	}
	var obj any
	switch meta.APIVersion + " " + meta.Kind {
	case "v1 Namespace":
		obj = &corev1.Namespace{}
	case "v1 Service":
		obj = &corev1.Service{}
	case "v1 ConfigMap":
		obj = &corev1.ConfigMap{}
	case "apps/v1 DaemonSet":
		obj = &appsv1.DaemonSet{}
	case "monitoring.coreos.com/v1 PodMonitor":
		obj = &monitoringv1.PodMonitor{}
	case "networking.k8s.io/v1 NetworkPolicy":
		obj = &networkingv1.NetworkPolicy{}
	case "kustomize.config.k8s.io/v1beta1 Kustomization":
		obj = &kustypes.Kustomization{}
	default:
		return nil, fmt.Errorf("no API type for apiVersion %q kind %q", meta.APIVersion, meta.Kind)
	}
	if err := cripod.DecodeStrict(doc, obj); err != nil {
		return nil, fmt.Errorf("%s %s: %w", meta.APIVersion, meta.Kind, err)
	}
	return obj, nil
}

// documents splits a YAML stream on "---" lines, dropping empty documents.
func documents(b []byte) [][]byte {
	var out [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(d, "")) != "" {
			out = append(out, []byte(d))
		}
	}
	return out
}

// objects decodes every manifest in this directory, by file name.
func objects(t *testing.T) map[string][]any {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	out := map[string][]any{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range documents(b) {
			obj, err := decodeStrict(doc)
			if err != nil {
				t.Errorf("%s: %v", f, err)
				continue
			}
			out[f] = append(out[f], obj)
		}
	}
	return out
}

func only[T any](t *testing.T, objs map[string][]any, file string) T {
	t.Helper()
	if len(objs[file]) != 1 {
		t.Fatalf("%s: %d objects, want 1", file, len(objs[file]))
	}
	o, ok := objs[file][0].(T)
	if !ok {
		t.Fatalf("%s holds a %T", file, objs[file][0])
	}
	return o
}

// TestManifestsDecodeStrictly: every manifest is one of the API types and
// has no field those types lack.
func TestManifestsDecodeStrictly(t *testing.T) {
	objs := objects(t)
	for _, f := range []string{"namespace.yaml", "daemonset.yaml", "service.yaml", "podmonitor.yaml", "networkpolicy.yaml", "kustomization.yaml"} {
		if len(objs[f]) == 0 {
			t.Errorf("%s missing or empty", f)
		}
	}
}

// TestStrictDecodingRejectsUnknownFields: the decoding above would notice a
// misspelt or misplaced field.
func TestStrictDecodingRejectsUnknownFields(t *testing.T) {
	b, err := os.ReadFile("daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string][2]string{
		"misspelt field":  {"readOnly: true", "readonly: true"},
		"misplaced field": {"      automountServiceAccountToken: false", "      automountServiceAccountToken: false\n      readOnlyRootFilesystem: true"},
		"duplicate field": {"      enableServiceLinks: false", "      enableServiceLinks: false\n      enableServiceLinks: true"},
	} {
		bad := strings.Replace(string(b), edit[0], edit[1], 1)
		if bad == string(b) {
			t.Fatalf("%s: the edit did not apply", name)
		}
		if _, err := decodeStrict([]byte(bad)); err == nil {
			t.Errorf("%s: decoded without an error", name)
		}
	}
	pm := "apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nspec:\n  podMetricsEndpoints:\n    - port: metrics\n      scrapeInterval: 60s\n"
	if _, err := decodeStrict([]byte(pm)); err == nil {
		t.Error("a PodMonitor with an unknown endpoint field decoded without an error")
	}
}

// socketGID is the sandboxstats group of deploy/systemd/sandboxstats.sysusers.conf.
func socketGID(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("../systemd/sandboxstats.sysusers.conf")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^g\s+sandboxstats\s+(\d+)\s*$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no fixed GID for the sandboxstats group in sandboxstats.sysusers.conf:\n%s", b)
	}
	gid, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return gid
}

// TestNRIBridge: statsnri reaches NRI's socket through its directory, binds
// pods on statsd daemons whose stats sockets the agent polls, reads Kata's
// layout where it mounts it, and runs as root's uid with no capability
// (NRI's socket and the lifecycle sockets are root's).
func TestNRIBridge(t *testing.T) {
	ds := only[*appsv1.DaemonSet](t, objects(t), "daemonset.yaml")
	c := container(t, ds.Spec.Template.Spec, "statsnri")
	args := map[string][]string{}
	for _, a := range c.Args {
		k, v, ok := strings.Cut(a, "=")
		if !ok || !strings.HasPrefix(k, "--") {
			t.Errorf("arg %q: want --flag=value", a)
			continue
		}
		args[k] = append(args[k], v)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	if s := args["--nri-socket"]; len(s) != 1 || filepath.Dir(s[0]) != mounts["nri"] {
		t.Errorf("--nri-socket %q is not in the mounted NRI directory %q (mount the directory: containerd makes a new socket when it restarts)", s, mounts["nri"])
	}
	agentGlob := "/run/statsd/*/*.sock"
	seen := map[string]bool{}
	if len(args["--statsd"]) == 0 {
		t.Error("no --statsd")
	}
	for _, sd := range args["--statsd"] {
		lc, st, ok := strings.Cut(sd, ",")
		if m, _ := filepath.Match(agentGlob, st); !ok || !m || !strings.HasPrefix(lc, mounts["lifecycle-sockets"]+"/") || seen[lc] || seen[st] {
			t.Errorf("--statsd %q: want a lifecycle socket under %s/ and a stats socket the agent's glob %s finds, each once", sd, mounts["lifecycle-sockets"], agentGlob)
		}
		if filepath.Base(lc) != filepath.Base(st) {
			t.Errorf("--statsd %q: the two sockets are not one statsd@ instance's", sd)
		}
		seen[lc], seen[st] = true, true
	}
	if k := args["--placement-key-file"]; len(k) != 1 || filepath.Dir(k[0]) != mounts["statsnri-state"] {
		t.Errorf("--placement-key-file %q is not in the host directory mounted at %q: the key must survive the pod's restarts", k, mounts["statsnri-state"])
	}
	if k := args["--kata-root"]; len(k) != 1 || k[0] != mounts["kata-run"] {
		t.Errorf("--kata-root %q, Kata's directory mounted at %q", k, mounts["kata-run"])
	}
	if len(args["--handlers"]) != 1 || !slices.Contains(strings.Split(args["--handlers"][0], ","), "runsc") {
		t.Errorf("--handlers %q: want gVisor's runsc watched", args["--handlers"])
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "nri-metrics" || !slices.Equal(args["--metrics-listen"], []string{fmt.Sprintf("0.0.0.0:%d", c.Ports[0].ContainerPort)}) {
		t.Errorf("ports %+v, --metrics-listen %q: want one port nri-metrics served", c.Ports, args["--metrics-listen"])
	}
	if sc := c.SecurityContext; sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		t.Errorf("statsnri runs as %v: NRI's socket and the lifecycle sockets are root's", sc.RunAsUser)
	}
	if c.LivenessProbe != nil || c.ReadinessProbe != nil {
		t.Error("statsnri is probed: a bridge without NRI retries by itself, and would make the agent's pod unready")
	}
}

func labelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return len(selector) > 0
}

// TestServiceAndPodMonitor: both select the agent pods and scrape the
// port they serve on; the PodMonitor names the job "statsagent".
func TestServiceAndPodMonitor(t *testing.T) {
	objs := objects(t)
	ds := only[*appsv1.DaemonSet](t, objs, "daemonset.yaml")
	podLabels := ds.Spec.Template.Labels
	svc := only[*corev1.Service](t, objs, "service.yaml")
	if !labelsMatch(svc.Spec.Selector, podLabels) {
		t.Errorf("service selector %v does not match the pods %v", svc.Spec.Selector, podLabels)
	}
	a := svc.Annotations
	if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != "9477" || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("scrape annotations %v", a)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9477 || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("service ports %+v", svc.Spec.Ports)
	}
	pm := only[*monitoringv1.PodMonitor](t, objs, "podmonitor.yaml")
	if !labelsMatch(pm.Spec.Selector.MatchLabels, podLabels) {
		t.Errorf("PodMonitor selector %v does not match the pods %v", pm.Spec.Selector.MatchLabels, podLabels)
	}
	if podLabels[pm.Spec.JobLabel] != "statsagent" {
		t.Errorf("PodMonitor jobLabel %q gives job %q, want statsagent (the alerting rules select up{job=\"statsagent\"})", pm.Spec.JobLabel, podLabels[pm.Spec.JobLabel])
	}
	eps := pm.Spec.PodMetricsEndpoints
	if len(eps) != 2 || eps[0].Port == nil || *eps[0].Port != "metrics" || eps[1].Port == nil || *eps[1].Port != "nri-metrics" {
		t.Fatalf("PodMonitor endpoints %+v: want the metrics and nri-metrics ports", eps)
	}
	var job string
	for _, r := range eps[1].RelabelConfigs {
		if r.TargetLabel == "job" && r.Replacement != nil {
			job = *r.Replacement
		}
	}
	if job != "statsnri" {
		t.Errorf("the bridge's endpoint is job %q, want statsnri (not statsagent: the agent's alerts select job=\"statsagent\")", job)
	}
}

// TestKustomizationBuilds: the kustomization lists every manifest, and
// kustomize (its library, as kubectl apply -k uses it) builds it into
// objects that again decode strictly, in the namespace, with the image set.
func TestKustomizationBuilds(t *testing.T) {
	objs := objects(t)
	k := only[*kustypes.Kustomization](t, objs, "kustomization.yaml")
	manifests := []string{"../otel"} // collector.yaml's ConfigMap (deploy/otel/kustomization.yaml)
	for f := range objs {
		if f != "kustomization.yaml" {
			manifests = append(manifests, f)
		}
	}
	slices.Sort(manifests)
	listed := slices.Sorted(slices.Values(k.Resources))
	if !slices.Equal(listed, manifests) {
		t.Errorf("kustomization resources %v, want %v", listed, manifests)
	}
	collectorYAML, err := os.ReadFile("../otel/collector.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	out, err := rm.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	configMaps := map[string]*corev1.ConfigMap{} // by the name before kustomize's hash suffix
	var ds *appsv1.DaemonSet
	for _, doc := range documents(out) {
		obj, err := decodeStrict(doc)
		if err != nil {
			t.Errorf("built: %v", err)
			continue
		}
		switch o := obj.(type) {
		case *corev1.Namespace:
			kinds["Namespace"]++
		case *appsv1.DaemonSet:
			kinds["DaemonSet"]++
			if o.Namespace != k.Namespace {
				t.Errorf("DaemonSet in namespace %q", o.Namespace)
			}
			ds = o
			// Every image named by the kustomization, by digest (make images).
			byDigest := map[string]bool{}
			for _, img := range k.Images {
				byDigest[img.NewName+"@"+img.Digest] = img.Digest != ""
			}
			for _, c := range slices.Concat(o.Spec.Template.Spec.InitContainers, o.Spec.Template.Spec.Containers) {
				if !byDigest[c.Image] {
					t.Errorf("%s: image %q not set by the kustomization's digests", c.Name, c.Image)
				}
			}
		case *corev1.ConfigMap:
			kinds["ConfigMap"]++
			name := o.Name[:max(0, strings.LastIndex(o.Name, "-"))] // kustomize's suffix: a hash of the content
			configMaps[name] = o
		case *corev1.Service:
			kinds["Service"]++
		case *monitoringv1.PodMonitor:
			kinds["PodMonitor"]++
		case *networkingv1.NetworkPolicy:
			kinds["NetworkPolicy"]++
		}
	}
	if cm := configMaps["otelcol-config"]; cm == nil || cm.Data["collector.yaml"] != string(collectorYAML) || len(cm.Data) != 1 {
		t.Errorf("the ConfigMap otelcol-config %+v does not hold deploy/otel/collector.yaml alone", cm)
	}
	if cm := configMaps["otelcol-gateway"]; cm == nil || cm.Data["OTEL_GATEWAY_ENDPOINT"] == "" || cm.Data["OTEL_GATEWAY_INSECURE"] != "false" {
		t.Errorf("the ConfigMap otelcol-gateway %+v: want the gateway's endpoint, TLS on", cm)
	}
	if ds != nil {
		// The pod names the ConfigMaps by their built (hashed) names.
		refs := map[string]bool{}
		for _, v := range ds.Spec.Template.Spec.Volumes {
			if v.ConfigMap != nil {
				refs[v.ConfigMap.Name] = true
			}
		}
		for _, c := range ds.Spec.Template.Spec.Containers {
			for _, e := range c.EnvFrom {
				if e.ConfigMapRef != nil {
					refs[e.ConfigMapRef.Name] = true
				}
			}
		}
		for name, cm := range configMaps {
			if cm != nil && !refs[cm.Name] {
				t.Errorf("the ConfigMap %s (%s) is not what the DaemonSet names (%v)", name, cm.Name, refs)
			}
		}
	}
	if want := map[string]int{"ConfigMap": 2, "Namespace": 1, "DaemonSet": 1, "Service": 1, "PodMonitor": 1, "NetworkPolicy": 1}; fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Errorf("built %v, want %v", kinds, want)
	}
	if !bytes.Contains(out, []byte("namespace: sandboxstats")) {
		t.Error("built objects are not in the sandboxstats namespace")
	}
}

// scraperLabel is the namespace label the NetworkPolicy admits, as
// deploy/README.md documents it.
const scraperLabel = "sandboxstats.dev/scraper"
