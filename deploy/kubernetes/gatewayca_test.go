package kubernetes_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/sandboxstats/sandboxstats/deploy/kubernetes/cripod"
)

// TestGatewayCAOverlay builds the overlay docs/kubernetes.md ("TLS roots")
// gives for a gateway signed by a private CA, on this base: the otelcol
// container mounts the CA's Secret read-only where OTEL_GATEWAY_CA_FILE
// (its environment's ConfigMap, merged) says, and the gateway's endpoint
// and TLS setting are the base's still.
func TestGatewayCAOverlay(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```yaml\nresources: [github.com/sandboxstats/sandboxstats/deploy/kubernetes]   # or a path\nnamespace:")
	overlayYAML, _, ok2 := strings.Cut(rest, "```\n")
	if !ok || !ok2 {
		t.Fatal("docs/kubernetes.md: no overlay with a secretGenerator")
	}
	base, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	overlay := t.TempDir()
	rel, err := filepath.Rel(overlay, base)
	if err != nil {
		t.Fatal(err)
	}
	kust := "resources: [" + rel + "]\nnamespace:" + overlayYAML
	for name, b := range map[string]string{"kustomization.yaml": kust, "ca.crt": "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"} {
		if err := os.WriteFile(filepath.Join(overlay, name), []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		t.Fatalf("kustomize build of the docs' overlay:\n%s\n%v", kust, err)
	}
	out, err := rm.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	var ds *appsv1.DaemonSet
	configMaps := map[string]*corev1.ConfigMap{}
	secrets := map[string]*corev1.Secret{}
	for _, d := range documents(out) {
		if strings.Contains("\n"+string(d), "\nkind: Secret\n") {
			s := &corev1.Secret{}
			if err := cripod.DecodeStrict(d, s); err != nil {
				t.Fatal(err)
			}
			secrets[s.Name] = s
			continue
		}
		obj, err := decodeStrict(d)
		if err != nil {
			t.Fatal(err)
		}
		switch o := obj.(type) {
		case *appsv1.DaemonSet:
			ds = o
		case *corev1.ConfigMap:
			configMaps[o.Name] = o
		}
	}
	if ds == nil {
		t.Fatal("no DaemonSet")
	}
	var otelcol *corev1.Container
	for i, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == "otelcol" {
			otelcol = &ds.Spec.Template.Spec.Containers[i]
		}
	}
	if otelcol == nil {
		t.Fatal("no otelcol container")
	}
	var env *corev1.ConfigMap
	for _, from := range otelcol.EnvFrom {
		if from.ConfigMapRef != nil {
			env = configMaps[from.ConfigMapRef.Name]
		}
	}
	if env == nil {
		t.Fatalf("otelcol: no environment ConfigMap among %v", otelcol.EnvFrom)
	}
	caFile := env.Data["OTEL_GATEWAY_CA_FILE"]
	if env.Data["OTEL_GATEWAY_ENDPOINT"] == "" || env.Data["OTEL_GATEWAY_INSECURE"] != "false" || caFile == "" {
		t.Errorf("otelcol's environment %s: %v, want the base's endpoint, INSECURE=false and OTEL_GATEWAY_CA_FILE", env.Name, env.Data)
	}
	mounted := false
	for _, m := range otelcol.VolumeMounts {
		if !strings.HasPrefix(caFile, m.MountPath+"/") {
			continue
		}
		for _, v := range ds.Spec.Template.Spec.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			s := secrets[v.Secret.SecretName]
			if s == nil || s.Data[strings.TrimPrefix(caFile, m.MountPath+"/")] == nil && s.StringData[strings.TrimPrefix(caFile, m.MountPath+"/")] == "" {
				t.Errorf("volume %s: secret %s has no key for %s: %v", v.Name, v.Secret.SecretName, caFile, s)
			}
			mounted = m.ReadOnly
		}
	}
	if !mounted {
		t.Errorf("otelcol: %s is on no read-only Secret mount: %+v", caFile, otelcol.VolumeMounts)
	}
}
