// Package cripod turns the pod template of a DaemonSet into what a kubelet
// gives the container runtime over the CRI: the pod sandbox's config and
// each container's (init containers first), as crictl reads them
// (runp, create: encoding/json of k8s.io/cri-api's runtime/v1 types), and
// the volumes the kubelet makes on the node before it starts the pod
// (hostPath directories by their type, emptyDirs, ConfigMap files, subPath
// directories).
//
// It is the part of a kubelet an end-to-end test needs to run the DaemonSet
// of deploy/kubernetes through a real containerd without a cluster
// (e2e/k8s_daemonset_linux_test.go, through the cripod command): what the
// pod gets (mounts, namespaces, users, capabilities, seccomp, no_new_privs,
// a read-only root, resources) is the manifest's, so a mount or a privilege
// the manifest lacks fails there as on a node. Options may move host paths
// (a node whose /var/lib is elsewhere: the test's temporary directory) and
// put the pod in the node's network namespace (a runtime without CNI); both
// are named by the caller, never implied.
//
// What a kubelet does and this does not: probes, restarts (the caller
// restarts a container with Container.Restarted), DNS (the pod gets the
// node's resolv.conf), /etc/hosts (the kubelet mounts one only for a pod
// with an IP of its own), Secrets, projected and downward-API volumes,
// the service account token, AppArmor, SELinux labels, pod-level cgroups
// (the runtime's default parent unless Options.CgroupParent), device
// plugins. An unsupported field is an error, not ignored.
//
//	objs, err := cripod.Build("deploy/kubernetes") // kustomize, as kubectl apply -k
//	pod, err := cripod.FromDaemonSet(objs.DaemonSet, objs.ConfigMaps, cripod.Options{...})
//	err = pod.Materialize() // the volumes on the node
//	sandboxJSON, err := json.Marshal(pod.Sandbox)
package cripod
