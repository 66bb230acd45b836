// Package nribridge keeps statsd's bindings equal to the node's pods: it
// takes containerd's (or CRI-O's) pod lifecycle as NRI delivers it
// (RunPodSandbox, StopPodSandbox, RemovePodSandbox, the containers' events
// and Synchronize at every connect) and turns it into RunWorkload and
// CheckpointWorkload calls on the statsd daemons it is given, without a
// launcher.
//
// Three parts:
//   - the mapping (mapping.go, kata.go): a pod of a watched runtime handler
//     to a RunWorkloadRequest: the identity from the pod (actor uid = pod
//     uid), the sandbox from the handler's kind (gVisor: the sentry pid;
//     Kata: the agent's address and the VMM pid from Kata's per-sandbox
//     layout; any other watched handler: the pod's cgroup). Pure, apart
//     from Kata's layout, which is read from an injectable root;
//   - the Bridge (bridge.go, shard.go): the desired state (the running pods
//     of watched handlers) beside what each statsd holds, and per statsd a
//     bounded queue with workers that make the two equal, every call under
//     a deadline, retried with backoff; a pod's latest desired state wins.
//     Its event methods never block and never fail: NRI waits for a plugin's
//     answer, and a pod must never wait for statsd;
//   - the NRI plugin (plugin.go): the stub's handlers, each answering at
//     once, and the connection loop that reconnects with backoff.
//
// Pods are spread over the statsd daemons by a hash of the pod uid, so a
// restarted bridge finds every pod where it bound it. Every binding on
// those daemons is the bridge's: a binding whose pod is gone is
// checkpointed, with runtime_stopped when the runtime stopped the pod (NRI
// says so only after the sandbox's processes exited, so statsd is told a
// sandbox found dead is the stop's end, not a crash). See docs/nri.md.
package nribridge
