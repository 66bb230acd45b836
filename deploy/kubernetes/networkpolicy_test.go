package kubernetes_test

import (
	"bytes"
	"os"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	appsv1 "k8s.io/api/apps/v1"
)

// TestNetworkPolicy: the agent's pods take ingress only on the ports the
// PodMonitor scrapes, and only from namespaces labelled as the scraper's
// (deploy/README.md says which label).
func TestNetworkPolicy(t *testing.T) {
	objs := objects(t)
	ds := only[*appsv1.DaemonSet](t, objs, "daemonset.yaml")
	np := only[*networkingv1.NetworkPolicy](t, objs, "networkpolicy.yaml")
	if !labelsMatch(np.Spec.PodSelector.MatchLabels, ds.Spec.Template.Labels) {
		t.Errorf("podSelector %v does not select the agent pods %v", np.Spec.PodSelector.MatchLabels, ds.Spec.Template.Labels)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policyTypes %v, want [Ingress]", np.Spec.PolicyTypes)
	}
	var ports []string
	for _, c := range ds.Spec.Template.Spec.Containers {
		for _, p := range c.Ports {
			ports = append(ports, p.Name)
		}
	}
	slices.Sort(ports)
	if len(np.Spec.Ingress) != 1 {
		t.Fatalf("%d ingress rules, want 1", len(np.Spec.Ingress))
	}
	rule := np.Spec.Ingress[0]
	var admitted []string
	for _, p := range rule.Ports {
		if p.Port == nil || p.Protocol == nil || *p.Protocol != corev1.ProtocolTCP {
			t.Errorf("port %+v: want a named TCP port", p)
			continue
		}
		admitted = append(admitted, p.Port.String())
	}
	slices.Sort(admitted)
	if !slices.Equal(admitted, ports) {
		t.Errorf("ports admitted %v, the pod's %v", admitted, ports)
	}
	if len(rule.From) != 1 || rule.From[0].NamespaceSelector == nil || rule.From[0].IPBlock != nil ||
		rule.From[0].NamespaceSelector.MatchLabels[scraperLabel] != "true" || len(rule.From[0].NamespaceSelector.MatchLabels) != 1 {
		t.Errorf("from %+v: want only namespaces labelled %s=true", rule.From, scraperLabel)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(readme, []byte(scraperLabel+"=true")) {
		t.Errorf("deploy/README.md does not say to label the scraper's namespace %s=true", scraperLabel)
	}
}
