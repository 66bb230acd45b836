// Package kubernetes holds the statsagent manifests (deploy/kubernetes/*.yaml)
// and their test: every manifest decoded strictly, unknown fields rejected,
// into the real Kubernetes API types (k8s.io/api) and, for the PodMonitor,
// prometheus-operator's (monitoring/v1); the kustomization built with
// kustomize's own library and its output decoded the same way. It is a module
// of its own (deploy/go.mod) so that the main module links none of it.
package kubernetes
