// Package kubernetes holds the manifests (deploy/kubernetes/*.yaml: the
// DaemonSet whose pod runs statsd, the NRI bridge, the agent and the node
// Collector; a Service, a PodMonitor, a NetworkPolicy) and their tests: every
// manifest decoded strictly, unknown fields rejected, into the real Kubernetes
// API types (k8s.io/api) and, for the PodMonitor, prometheus-operator's
// (monitoring/v1); each container's privileges and mounts; the kustomization
// built with kustomize's own library and its output decoded the same way.
// Package cripod below turns the pod into what a kubelet hands the CRI, for
// the end-to-end test. It is a module of its own (deploy/go.mod) so that the
// main module links none of it.
package kubernetes
