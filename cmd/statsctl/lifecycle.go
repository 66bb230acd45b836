package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/sockaddr"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// registerLifecycle registers c's flags for statsd's lifecycle socket:
// --socket and its alias --lifecycle-socket.
func (c *connFlags) registerLifecycle(fs *flag.FlagSet) {
	c.register(fs, defaultLifecycleSocket, "lifecycle")
	fs.Var(sockaddr.Flag{Path: &c.socket}, "lifecycle-socket", "Unix socket of statsd's lifecycle service (same as --socket): a `path`, unix:PATH or unix:///PATH")
}

// stringsFlag is a repeatable string flag.
type stringsFlag []string

func (s *stringsFlag) String() string     { return strings.Join(*s, ",") }
func (s *stringsFlag) Set(v string) error { *s = append(*s, v); return nil }

// containersFlag is a repeatable --container id=name (or id alone: no
// name); statsd validates the set.
type containersFlag []*sandboxstatsv1.ContainerRef

func (c *containersFlag) String() string {
	var parts []string
	for _, r := range *c {
		parts = append(parts, r.GetId()+"="+r.GetName())
	}
	return strings.Join(parts, ",")
}

func (c *containersFlag) Set(v string) error {
	id, name, _ := strings.Cut(v, "=")
	if id == "" {
		return fmt.Errorf("%q has no container id (id=name, or id)", v)
	}
	*c = append(*c, &sandboxstatsv1.ContainerRef{Id: id, Name: name})
	return nil
}

// containerUsage is the --container flag's help.
const containerUsage = "a workload container as `id=name` (or id: no name), repeatable, at most 25; microvm: the ids read, instead of --container-id or beside it (the same ids in order, for a statsd older than names); gvisor: names for the containers runsc lists"

type bindFlags struct {
	conn       connFlags
	identity   sandboxstatsv1.WorkloadIdentity
	class      string
	ref        sandboxstatsv1.SandboxRef
	ids        stringsFlag
	containers containersFlag
	sentry     int
	vmmPID     int
}

func bindFlagSet(e *env, name, summary string) (*bindFlags, func([]string) error) {
	fs := flagSet(e, name, summary)
	b := &bindFlags{}
	b.conn.registerLifecycle(fs)
	fs.StringVar(&b.identity.ActorUid, "actor-uid", "", "actor uid (required)")
	fs.StringVar(&b.identity.ActorName, "actor-name", "", "actor name")
	fs.StringVar(&b.identity.ActorNamespace, "actor-namespace", "", "actor namespace")
	fs.StringVar(&b.identity.TemplateNamespace, "template-namespace", "", "template namespace")
	fs.StringVar(&b.identity.TemplateName, "template-name", "", "template name")
	fs.StringVar(&b.identity.WorkerPool, "worker-pool", "", "worker pool (optional)")
	fs.StringVar(&b.class, "class", "", "sandbox class: gvisor or microvm (implied by --cgroup-path or --sentry-pid: gvisor; --agent-address: microvm)")
	fs.StringVar(&b.ref.CgroupPath, "cgroup-path", "", "gvisor: sandbox cgroup, relative to the cgroup mount")
	fs.IntVar(&b.sentry, "sentry-pid", 0, "gvisor: the sentry's pid (cgroup found through /proc/<pid>/cgroup)")
	fs.StringVar(&b.ref.AgentAddress, "agent-address", "", "microvm: hvsock://<unix path>:<port> or vsock://<cid>:<port>")
	fs.Var(&b.ids, "container-id", "microvm: a workload container id (repeatable, at most 25)")
	fs.Var(&b.containers, "container", containerUsage)
	fs.IntVar(&b.vmmPID, "vmm-pid", 0, "the VMM's pid (host view)")
	fs.StringVar(&b.ref.VmmPidFile, "vmm-pid-file", "", "file holding the VMM's pid (host view)")
	fs.StringVar(&b.ref.QmpSocket, "qmp-socket", "", "QEMU QMP socket (KVM counters)")
	return b, func(args []string) error {
		if err := e.parse(fs, args); err != nil {
			return err
		}
		class, err := b.sandboxClass()
		if err != nil {
			return usageError{err}
		}
		b.ref.SandboxClass = class
		for _, p := range []struct {
			name string
			v    int
		}{{"--sentry-pid", b.sentry}, {"--vmm-pid", b.vmmPID}} {
			if p.v < 0 || p.v > math.MaxInt32 {
				return usageError{fmt.Errorf("%s %d is not a pid", p.name, p.v)}
			}
		}
		b.ref.ContainerIds = b.ids
		b.ref.Containers = b.containers
		b.ref.SentryPid = int32(b.sentry)
		b.ref.VmmPid = int32(b.vmmPID)
		return nil
	}
}

// sandboxClass is --class, or the class the ref flags imply when it is not
// given: --cgroup-path and --sentry-pid name a gVisor sandbox,
// --agent-address a micro-VM. An explicit class must agree with them.
func (b *bindFlags) sandboxClass() (sandboxstatsv1.SandboxClass, error) {
	var gvisorRef, microvmRef string
	switch {
	case b.ref.CgroupPath != "":
		gvisorRef = "--cgroup-path"
	case b.sentry != 0:
		gvisorRef = "--sentry-pid"
	}
	if b.ref.AgentAddress != "" {
		microvmRef = "--agent-address"
	}
	if gvisorRef != "" && microvmRef != "" {
		return 0, fmt.Errorf("%s (a gvisor sandbox) and %s (a microvm) name different classes: give one", gvisorRef, microvmRef)
	}
	class := b.class
	switch {
	case class == "" && gvisorRef != "":
		class = "gvisor"
	case class == "" && microvmRef != "":
		class = "microvm"
	case class == "":
		return 0, errors.New("--class is required when no sandbox flag implies it (--cgroup-path or --sentry-pid: gvisor; --agent-address: microvm)")
	}
	switch {
	case class != "gvisor" && class != "microvm":
		return 0, fmt.Errorf("--class must be gvisor or microvm, not %q", class)
	case class == "microvm" && gvisorRef != "":
		return 0, fmt.Errorf("--class microvm contradicts %s, which names a gvisor sandbox", gvisorRef)
	case class == "gvisor" && microvmRef != "":
		return 0, fmt.Errorf("--class gvisor contradicts %s, which names a microvm", microvmRef)
	case class == "gvisor":
		return sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR, nil
	default:
		return sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM, nil
	}
}

func runRunWorkload(ctx context.Context, e *env, args []string) error {
	return bindWorkload(ctx, e, args, "run-workload", "Bind a workload to statsd (what the launcher does on run)", "",
		func(ctx context.Context, c sandboxstatsv1.WorkloadLifecycleServiceClient, id *sandboxstatsv1.WorkloadIdentity, ref *sandboxstatsv1.SandboxRef) (int64, *sandboxstatsv1.EndedActivation, error) {
			resp, err := c.RunWorkload(ctx, &sandboxstatsv1.RunWorkloadRequest{Identity: id, Sandbox: ref})
			return resp.GetEpochUnixNano(), resp.GetReplaced(), err
		})
}

func runRestoreWorkload(ctx context.Context, e *env, args []string) error {
	return bindWorkload(ctx, e, args, "restore-workload", "Bind a restored workload to statsd (what the launcher does on restore)", " (restored)",
		func(ctx context.Context, c sandboxstatsv1.WorkloadLifecycleServiceClient, id *sandboxstatsv1.WorkloadIdentity, ref *sandboxstatsv1.SandboxRef) (int64, *sandboxstatsv1.EndedActivation, error) {
			resp, err := c.RestoreWorkload(ctx, &sandboxstatsv1.RestoreWorkloadRequest{Identity: id, Sandbox: ref})
			return resp.GetEpochUnixNano(), resp.GetReplaced(), err
		})
}

// bindWorkload parses the identity and sandbox flags and makes one binding
// call, printing the epoch it started.
func bindWorkload(ctx context.Context, e *env, args []string, name, summary, note string,
	call func(context.Context, sandboxstatsv1.WorkloadLifecycleServiceClient, *sandboxstatsv1.WorkloadIdentity, *sandboxstatsv1.SandboxRef) (int64, *sandboxstatsv1.EndedActivation, error)) error {
	b, parse := bindFlagSet(e, name, summary)
	if err := parse(args); err != nil {
		return err
	}
	ctx, cc, done, err := b.conn.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	epoch, replaced, err := call(ctx, sandboxstatsv1.NewWorkloadLifecycleServiceClient(cc), &b.identity, &b.ref)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "bound %s%s, epoch %s\n", b.identity.GetActorUid(), note, formatTime(epoch))
	if replaced != nil {
		fmt.Fprintln(e.stdout, "the previous activation of this actor ended:")
		return writeEnded(e.stdout, replaced)
	}
	return nil
}

func runCheckpointWorkload(ctx context.Context, e *env, args []string) error {
	fs := flagSet(e, "checkpoint-workload", "Make statsd forget the bound workload (what the launcher does on checkpoint or teardown)")
	var (
		conn           connFlags
		actorUID       string
		runtimeStopped bool
	)
	conn.registerLifecycle(fs)
	fs.StringVar(&actorUID, "actor-uid", "", "the bound actor (required)")
	fs.BoolVar(&runtimeStopped, "runtime-stopped", false, "the sandbox's runtime already stopped it as asked: a sandbox found dead is its expected end (checkpointed), not a death, unless OOM-killed or statsd saw it dead before")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	ctx, cc, done, err := conn.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	resp, err := sandboxstatsv1.NewWorkloadLifecycleServiceClient(cc).CheckpointWorkload(ctx,
		&sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: actorUID, RuntimeStopped: runtimeStopped})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "forgot %s\n", actorUID)
	if ended := resp.GetEnded(); ended != nil {
		return writeEnded(e.stdout, ended)
	}
	return nil
}
