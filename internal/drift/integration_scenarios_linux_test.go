package drift_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sandboxstats/sandboxstats/internal/drift"
	"github.com/sandboxstats/sandboxstats/internal/gvisor"
	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/microvm"
	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// countingSource counts the reads the drift check makes through a source.
type countingSource struct {
	source.Source
	reads *atomic.Int64
}

func (c countingSource) Sample(ctx context.Context) (source.Reading, error) {
	c.reads.Add(1)
	return c.Source.Sample(ctx)
}

// scenario is one workload bound through the real sources, checked by the
// real observer against the real /proc, one Cycle at a time.
type scenario struct {
	t       *testing.T
	store   *identity.Store
	checker *drift.Checker
	logs    bytes.Buffer
	reads   atomic.Int64
}

func newScenario(t *testing.T, ref source.SandboxRef, agentGrace time.Duration) *scenario {
	t.Helper()
	s := &scenario{t: t}
	store, err := identity.NewStore(identity.Config{Open: func(ref source.SandboxRef) (source.Source, source.HostSampler, error) {
		var src source.Source
		var err error
		if ref.Class == source.ClassGVisor {
			src, err = gvisor.Open(ref, gvisor.Config{CgroupRoot: "/sys/fs/cgroup", ProcRoot: "/proc", ReadTimeout: 2 * time.Second})
		} else {
			src, err = microvm.Open(ref, microvm.Config{CallTimeout: time.Second})
		}
		if err != nil {
			return nil, nil, err
		}
		return countingSource{Source: src, reads: &s.reads}, nil, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if _, _, err := store.Bind(context.Background(), identity.OpRun, identity.Identity{ActorUID: "actor-" + t.Name()[strings.LastIndex(t.Name(), "/")+1:]}, ref); err != nil {
		t.Fatal(err)
	}
	s.store = store
	s.checker, err = drift.New(drift.Config{
		Store: store, Observer: drift.NewSystemObserver("/proc", 500*time.Millisecond, agentGrace, nil),
		Interval: time.Second, Grace: 0, Logger: slog.New(slog.NewTextHandler(&s.logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *scenario) cycle() { s.checker.Cycle(context.Background()) }

// events returns the events so far as "TYPE KIND subject".
func (s *scenario) events() []string {
	var out []string
	for _, e := range s.checker.Events() {
		out = append(out, fmt.Sprintf("%s %s %s", strings.TrimPrefix(e.Type.String(), "DRIFT_EVENT_TYPE_"),
			strings.TrimPrefix(e.Finding.Kind.String(), "DRIFT_KIND_"), e.Finding.Subject))
	}
	return out
}

func (s *scenario) wantEvents(step string, want ...string) {
	s.t.Helper()
	got := s.events()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		s.t.Fatalf("%s: events\n  got  %q\n  want %q\nlog:\n%s", step, got, want, s.logs.String())
	}
	warn, info := strings.Count(s.logs.String(), "level=WARN"), strings.Count(s.logs.String(), "matches again")
	opened, cleared := 0, 0
	for _, e := range got {
		opened += boolInt(strings.HasPrefix(e, "OPENED"))
		cleared += boolInt(strings.HasPrefix(e, "CLEARED"))
	}
	if warn != opened || info != cleared {
		s.t.Fatalf("%s: %d WARN and %d 'matches again' log lines for %d opened and %d cleared events:\n%s", step, warn, info, opened, cleared, s.logs.String())
	}
	s.t.Logf("observed after %s: %q", step, got)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// cgroupMtimes snapshots the modification times of the sandbox cgroup's
// files (but the membership files the test itself changes by starting a
// sandbox there): a write by the check would change them.
func cgroupMtimes(t *testing.T, dirs ...string) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	for _, d := range dirs {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if e.Name() == "cgroup.procs" || e.Name() == "tasks" {
				continue // written by runsc when the test starts a sandbox in the cgroup
			}
			if fi, err := e.Info(); err == nil {
				out[filepath.Join(d, e.Name())] = fi.ModTime()
			}
		}
	}
	return out
}

func TestIntegrationScenarioBaselineAndDeadSandbox(t *testing.T) {
	sb := testenv.StartSandbox(t, "", "/bin/sh", "-c", "while true; do sleep 1; done")
	dirs := []string{filepath.Join("/sys/fs/cgroup/memory", sb.CgroupPath), filepath.Join("/sys/fs/cgroup/cpuacct", sb.CgroupPath)}
	before := cgroupMtimes(t, dirs...)
	s := newScenario(t, source.SandboxRef{Class: source.ClassGVisor, CgroupPath: sb.CgroupPath}, time.Minute)

	for range 3 {
		s.cycle()
	}
	s.wantEvents("baseline: healthy sandbox, 3 cycles")

	sb.KillProcesses(t)
	s.cycle()
	s.wantEvents("dead sandbox: processes killed, cgroup kept", "OPENED SANDBOX_DEAD "+sb.CgroupPath)
	s.cycle()
	s.wantEvents("dead sandbox: next cycle", "OPENED SANDBOX_DEAD "+sb.CgroupPath)

	testenv.StartSandbox(t, sb.CgroupPath, "/bin/sh", "-c", "while true; do sleep 1; done")
	s.cycle()
	s.wantEvents("a new sandbox started in that cgroup",
		"OPENED SANDBOX_DEAD "+sb.CgroupPath, "CLEARED SANDBOX_DEAD "+sb.CgroupPath)

	// Changes nothing: the check only read the cgroup.
	after := cgroupMtimes(t, dirs...)
	for p, m := range before {
		if a, ok := after[p]; ok && !a.Equal(m) {
			t.Errorf("%s was modified during the scenario (%v -> %v)", p, m, a)
		}
	}
	t.Logf("the check read the source %d times; %d cgroup files unmodified", s.reads.Load(), len(before))
}

func TestIntegrationScenarioAgentGoneAndUnknownContainer(t *testing.T) {
	reply := kataagentfake.V2(kataagentfake.Container{UsageBytes: 100 << 20, MaxUsageBytes: 120 << 20, CPUTotal: 1e9})
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("web", reply), kataagentfake.WithContainer("sidecar", reply))
	const grace = time.Second
	s := newScenario(t, source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: agent.Address(), ContainerIDs: []string{"web", "sidecar"}}, grace)

	s.cycle()
	s.wantEvents("agent answering")

	t.Run("unknown container", func(t *testing.T) {
		agent.SetContainerError("sidecar", status.Error(codes.InvalidArgument, "invalid container id"))
		s.cycle()
		s.cycle()
		s.wantEvents("agent no longer knows sidecar (2 cycles)", "OPENED CONTAINER_UNKNOWN sidecar")
		agent.SetContainer("sidecar", reply)
		s.cycle()
		s.wantEvents("agent knows sidecar again", "OPENED CONTAINER_UNKNOWN sidecar", "CLEARED CONTAINER_UNKNOWN sidecar")
	})

	t.Run("agent gone", func(t *testing.T) {
		base := len(s.events())
		agent.Stop()
		s.cycle() // within the grace: nothing yet
		time.Sleep(grace + 200*time.Millisecond)
		s.cycle()
		s.cycle()
		got := s.events()[base:]
		if len(got) != 1 || got[0] != "OPENED AGENT_SILENT "+agent.Address() {
			t.Fatalf("agent stopped past the grace: events %q", got)
		}
		agent.Restart()
		deadline := time.Now().Add(10 * time.Second)
		for len(s.events()) == base+1 && time.Now().Before(deadline) {
			s.cycle() // the source reconnects with backoff
			time.Sleep(100 * time.Millisecond)
		}
		got = s.events()[base:]
		if len(got) != 2 || got[1] != "CLEARED AGENT_SILENT "+agent.Address() {
			t.Fatalf("agent back: events %q", got)
		}
		t.Logf("observed: %q", got)
	})

	// Changes nothing: the agent saw only the read-only calls.
	_, _, stats, versions := agent.Counts()
	t.Logf("the fake agent received %d StatsContainer and %d Version calls, nothing else", stats, versions)
}

func TestIntegrationScenarioVMM(t *testing.T) {
	dir := t.TempDir()
	// A guest name of its own: other packages' tests run QEMU guests named
	// srv1 at the same time, and each would be a stray here.
	guest := fmt.Sprintf("drift-%d", os.Getpid())
	vm := testenv.StartQEMU(t, dir, guest, testenv.Accel())
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("web", kataagentfake.V2(kataagentfake.Container{UsageBytes: 1 << 20})))
	s := newScenario(t, source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: agent.Address(), ContainerIDs: []string{"web"}, VMMPIDFile: vm.PIDFile}, time.Minute)

	s.cycle()
	s.wantEvents("VMM running")

	stray := testenv.StartQEMU(t, t.TempDir(), guest, testenv.Accel())
	s.cycle()
	s.cycle()
	strayFinding := fmt.Sprintf("OPENED STRAY_VMM pid %d", stray.PID)
	s.wantEvents("a second QEMU of the same guest name (2 cycles)", strayFinding)
	stray.Stop()
	s.cycle()
	s.wantEvents("the stray stopped", strayFinding, fmt.Sprintf("CLEARED STRAY_VMM pid %d", stray.PID))

	vm.Stop() // QEMU removes its pid file on exit; either way the subject is the pid file
	gone := "OPENED VMM_GONE " + vm.PIDFile
	s.cycle()
	s.cycle()
	s.wantEvents("the bound QEMU killed (2 cycles)", strayFinding, fmt.Sprintf("CLEARED STRAY_VMM pid %d", stray.PID), gone)
}

// TestScenarioSourceUnreadable opens a VMM finding, then makes the pid file a
// FIFO that never yields: the finding is kept, neither cleared nor repeated,
// and the check says it skipped that comparison; readable again (naming a
// live process), it clears.
func TestIntegrationScenarioSourceUnreadable(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("web", kataagentfake.V2(kataagentfake.Container{UsageBytes: 1 << 20})))
	pidFile := filepath.Join(t.TempDir(), "srv9", "vmm.pid")
	os.MkdirAll(filepath.Dir(pidFile), 0o755)
	dead := deadPID(t)
	os.WriteFile(pidFile, []byte(fmt.Sprint(dead)), 0o644)
	s := newScenario(t, source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: agent.Address(), ContainerIDs: []string{"web"}, VMMPIDFile: pidFile}, time.Minute)

	s.cycle()
	opened := "OPENED VMM_GONE " + pidFile
	s.wantEvents("pid file names an exited process", opened)

	os.Remove(pidFile)
	if err := syscall.Mkfifo(pidFile, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // release the hung read
		if f, err := os.OpenFile(pidFile, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	start := time.Now()
	s.cycle()
	s.cycle()
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("two cycles against a hung pid file took %v", took)
	}
	s.wantEvents("pid file is a FIFO that never yields (2 cycles)", opened)
	if st := s.checker.Status(); len(st.Skipped) == 0 || !strings.Contains(strings.Join(st.Skipped, ";"), "vmm process") {
		t.Fatalf("status does not say the VMM comparison was skipped: %+v", st)
	}
	if len(s.checker.Open()) != 1 {
		t.Fatal("the finding was not kept while its side was unreadable")
	}

	// Readable again, naming a live process.
	if f, err := os.OpenFile(pidFile, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
		f.Close() // let the hung read finish
	}
	os.Remove(pidFile)
	os.WriteFile(pidFile, []byte(fmt.Sprint(os.Getpid())), 0o644)
	time.Sleep(100 * time.Millisecond)
	s.cycle()
	s.wantEvents("pid file readable again", opened, "CLEARED VMM_GONE "+pidFile)
}

// deadPID returns the pid of a process that has exited.
func deadPID(t *testing.T) int {
	t.Helper()
	p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	p.Wait()
	return p.Pid
}

func TestIntegrationScenarioMidOperation(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("web", kataagentfake.V2(kataagentfake.Container{UsageBytes: 1 << 20})))
	s := newScenario(t, source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: agent.Address(), ContainerIDs: []string{"web"}}, time.Minute)
	release := s.store.HoldLifecycle(s.store.Bindings()[0].Identity.ActorUID) // a Restore in progress
	s.cycle()
	release()
	if n := s.reads.Load(); n != 0 {
		t.Fatalf("the cycle read the source %d times during a lifecycle call", n)
	}
	if st := s.checker.Status(); !strings.Contains(st.Outcome, "lifecycle") {
		t.Fatalf("outcome %q", st.Outcome)
	}
	t.Logf("observed: cycle outcome %q, %d reads", s.checker.Status().Outcome, s.reads.Load())
}
