package drift

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/hoststat"
	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/process"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// SystemObserver observes a sandbox through its bound source (one read-only
// sample, shared with polls in flight) and /proc.
type SystemObserver struct {
	procRoot   string
	reads      *bounded.Group
	agentGrace time.Duration
	now        func() time.Time

	mu sync.Mutex
	// states holds what each bound actor's current epoch was first seen
	// with, by actor uid: one workload's never stands for another's.
	states map[string]*epochState
}

// epochState is what the looks at one actor's epoch remember: when the
// agent last answered, the sentry's cgroup file at the first look, to
// notice it moving, and the OOM kill count at the first look that had one,
// to notice it rising. Guarded by SystemObserver.mu.
type epochState struct {
	epoch        int64
	lastAnswer   time.Time
	sentryCgroup []byte
	oomBase      *uint64
	// vmm pins the VMM at the epoch's first look (start time, executable):
	// a pid another process has since is a VMM gone, never a VMM running.
	vmm *process.Tracker
}

// NewSystemObserver reads /proc under procRoot with every read bounded by
// readTimeout. agentGrace is how long an agent may stay silent before that is
// a finding.
func NewSystemObserver(procRoot string, readTimeout, agentGrace time.Duration, now func() time.Time) *SystemObserver {
	if now == nil {
		now = time.Now
	}
	return &SystemObserver{procRoot: procRoot, reads: bounded.New(readTimeout), agentGrace: agentGrace, now: now, states: map[string]*epochState{}}
}

// Prune forgets what it remembers of actors no longer bound, or bound anew
// (bound: each bound actor's epoch).
func (o *SystemObserver) Prune(bound map[string]int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for actor, st := range o.states {
		if epoch, ok := bound[actor]; !ok || epoch != st.epoch {
			delete(o.states, actor)
		}
	}
}

// stateOf returns b's epoch state, new at the first look at its epoch.
func (o *SystemObserver) stateOf(b *identity.Binding) *epochState {
	o.mu.Lock()
	defer o.mu.Unlock()
	st := o.states[b.Identity.ActorUID]
	if st == nil || st.epoch != b.EpochUnixNano {
		st = &epochState{epoch: b.EpochUnixNano, vmm: process.NewTracker(o.procRoot)}
		o.states[b.Identity.ActorUID] = st
	}
	return st
}

// Observe implements Observer.
func (o *SystemObserver) Observe(ctx context.Context, b *identity.Binding) Observation {
	obs := newObservation()
	st := o.stateOf(b)

	var (
		reading source.Reading
		err     = fmt.Errorf("no source could be opened: %w", source.ErrNotMeasurable)
	)
	if b.Source != nil {
		reading, err = b.Source.Sample(ctx)
	}
	switch b.Ref.Class {
	case source.ClassGVisor:
		o.observeCgroup(&obs, st, b, reading, err)
		if b.Ref.SentryPID > 0 {
			o.observeSentry(ctx, &obs, st, b.Ref.SentryPID)
		}
	case source.ClassMicroVM:
		o.observeAgent(&obs, st, b, reading, err)
	}
	vmmPID, guest, known := o.observeVMM(ctx, &obs, st, b)
	if known {
		o.observeStrays(ctx, &obs, vmmPID, guest)
	} else if guest != "" {
		// Without the bound VMM's pid the bound VMM itself would look like a
		// stray claiming the guest.
		obs.skip(cmpStray, "the bound VMM's pid is unknown this cycle")
	}
	return obs
}

func (o *SystemObserver) observeCgroup(obs *Observation, st *epochState, b *identity.Binding, r source.Reading, err error) {
	subject := b.Ref.CgroupPath
	if subject == "" {
		subject = fmt.Sprintf("cgroup of sentry pid %d", b.Ref.SentryPID)
	}
	base, kills, rose := o.oomKills(st, r, err)
	switch {
	case err == nil && r.NoProcessLeft() && rose:
		// Dead by OOM: this finding says more than SANDBOX_DEAD and
		// replaces it.
		obs.find(cmpCgroup, KindOOMKilled, subject, fmt.Sprintf(
			"the cgroup has no processes left and the kernel's OOM killer killed %d process(es) in it this epoch (oom_kill %d, first seen %d)",
			kills-base, kills, base))
	case err == nil && r.NoProcessLeft():
		obs.find(cmpCgroup, KindSandboxDead, subject,
			"the cgroup has no processes left: its numbers are a dead sandbox's, not an idle workload's")
	case err == nil:
		obs.ran(cmpCgroup)
	case errors.Is(err, source.ErrSandboxGone):
		obs.find(cmpCgroup, KindCgroupGone, subject, err.Error())
	default:
		obs.skip(cmpCgroup, err.Error())
	}
}

// oomKills returns the epoch's first seen OOM kill count, the count now,
// and whether it rose. The first reading of an epoch that has a count is
// its baseline, so a kill before that look (within the grace) does not
// count: a reused cgroup may carry kills from an earlier epoch.
func (o *SystemObserver) oomKills(st *epochState, r source.Reading, err error) (base, now uint64, rose bool) {
	if err != nil || r.Memory == nil || r.Memory.OOMKills == nil {
		return 0, 0, false
	}
	now = *r.Memory.OOMKills
	o.mu.Lock()
	defer o.mu.Unlock()
	if st.oomBase == nil {
		first := now
		st.oomBase = &first
	}
	return *st.oomBase, now, now > *st.oomBase
}

func (o *SystemObserver) observeSentry(ctx context.Context, obs *Observation, st *epochState, pid int) {
	subject := fmt.Sprintf("pid %d", pid)
	cg, err := o.reads.ReadFile(ctx, filepath.Join(o.procRoot, strconv.Itoa(pid), "cgroup"))
	switch {
	case process.IsGone(err):
		obs.find(cmpSentry, KindSentryGone, subject, "the sentry process it was bound by no longer exists")
		return
	case err != nil:
		obs.skip(cmpSentry, err.Error())
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if st.sentryCgroup == nil {
		st.sentryCgroup = cg
	}
	if !bytes.Equal(st.sentryCgroup, cg) {
		obs.find(cmpSentry, KindSentryMoved, subject,
			fmt.Sprintf("the sentry's cgroups changed from %q to %q", oneLine(st.sentryCgroup), oneLine(cg)))
		return
	}
	obs.ran(cmpSentry)
}

func (o *SystemObserver) observeAgent(obs *Observation, st *epochState, b *identity.Binding, r source.Reading, err error) {
	now := o.now()
	// A garbled reply is still an answer, and so is "unknown container" for
	// every id (the reading then fails as a whole but lists why).
	var unread *source.UnreadError
	if errors.As(err, &unread) && slices.ContainsFunc(unread.Containers, func(c source.ContainerError) bool { return c.Reason == source.ReasonUnknownContainer }) {
		r, err = source.Reading{UnreadContainers: unread.Containers}, nil
	}
	o.mu.Lock()
	// An agent that answers with errors answered too: silence is no answer.
	answered := err == nil || errors.Is(err, source.ErrMalformed) || errors.Is(err, source.ErrAnswered)
	if answered {
		st.lastAnswer = now
	}
	last := st.lastAnswer
	o.mu.Unlock()

	if last.IsZero() {
		last = time.Unix(0, b.EpochUnixNano)
	}
	if silent := now.Sub(last); !answered && silent > o.agentGrace {
		obs.find(cmpAgentAnswer, KindAgentSilent, b.Ref.AgentAddress,
			fmt.Sprintf("no answer for %s (grace %s): %v", silent.Round(time.Second), o.agentGrace, err))
	} else {
		obs.ran(cmpAgentAnswer)
	}

	if err != nil {
		obs.skip(cmpAgentContainers, "agent unreadable: "+err.Error())
		return
	}
	obs.ran(cmpAgentContainers)
	for _, c := range r.UnreadContainers {
		if c.Reason == source.ReasonUnknownContainer {
			obs.find(cmpAgentContainers, KindContainerUnknown, c.ID,
				"the guest agent does not know this container id")
		}
	}
}

// observeVMM checks that the VMM named by the ref still runs, and returns its
// pid, the guest name it serves ("" if none), and whether the pid is known
// (false when a pid file names none this cycle). A VMM_GONE finding has one
// subject however it is seen: the pid file if the ref names one, else the pid.
func (o *SystemObserver) observeVMM(ctx context.Context, obs *Observation, st *epochState, b *identity.Binding) (int, string, bool) {
	ref := b.Ref
	pid := ref.VMMPID
	guest := ""
	subject := fmt.Sprintf("pid %d", pid)
	if ref.VMMPIDFile != "" {
		guest, subject = hoststat.GuestNameFromPIDFile(ref.VMMPIDFile), ref.VMMPIDFile
		// A regular file only, never its content in an error (the launcher
		// may name any file).
		n, err := bounded.Do(ctx, o.reads, "pidfile\x00"+ref.VMMPIDFile, func() (int, error) { return process.ReadPIDFile(ref.VMMPIDFile) })
		switch {
		case errors.Is(err, os.ErrNotExist):
			obs.find(cmpVMM, KindVMMGone, subject, "the VMM pid file is gone (the VMM removes it on exit)")
			return 0, guest, false
		case err != nil:
			obs.skip(cmpVMM, err.Error())
			return 0, guest, false
		}
		pid = n
	}
	if pid == 0 {
		return 0, guest, true // no VMM named: nothing is bound, any claimant is a stray
	}
	_, err := bounded.Do(ctx, o.reads, "pin\x00"+b.Identity.ActorUID+"\x00"+strconv.Itoa(pid), func() (process.Pin, error) { return st.vmm.Check(pid) })
	switch {
	case errors.Is(err, process.ErrReused):
		obs.find(cmpVMM, KindVMMGone, subject, fmt.Sprintf("the VMM process (pid %d) exited and its pid now names another process: %v", pid, err))
		return pid, guest, true
	case process.IsGone(err):
		obs.find(cmpVMM, KindVMMGone, subject, fmt.Sprintf("the VMM process (pid %d) no longer exists", pid))
		return pid, guest, true
	case err != nil:
		obs.skip(cmpVMM, err.Error())
		return pid, guest, false
	}
	cmdline, err := o.reads.ReadFile(ctx, filepath.Join(o.procRoot, strconv.Itoa(pid), "cmdline"))
	switch {
	case process.IsGone(err) || (err == nil && len(cmdline) == 0):
		// An exited process that is not yet reaped has an empty cmdline.
		obs.find(cmpVMM, KindVMMGone, subject, fmt.Sprintf("the VMM process (pid %d) no longer exists", pid))
		return pid, guest, true
	case err != nil:
		obs.skip(cmpVMM, err.Error())
		return pid, guest, false
	}
	obs.ran(cmpVMM)
	if name := hoststat.QEMUGuestName(cmdline); name != "" {
		guest = name
	}
	return pid, guest, true
}

// observeStrays looks for another VMM process claiming the bound guest's name.
func (o *SystemObserver) observeStrays(ctx context.Context, obs *Observation, boundPID int, guest string) {
	if guest == "" {
		return // nothing to compare: the ref names no guest
	}
	entries, err := os.ReadDir(o.procRoot)
	if err != nil {
		obs.skip(cmpStray, err.Error())
		return
	}
	obs.ran(cmpStray)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == boundPID {
			continue
		}
		cmdline, err := o.reads.ReadFile(ctx, filepath.Join(o.procRoot, e.Name(), "cmdline"))
		if errors.Is(err, source.ErrTimeout) {
			obs.skip(cmpStray, err.Error())
			return
		}
		if err == nil && hoststat.QEMUGuestName(cmdline) == guest {
			obs.find(cmpStray, KindStrayVMM, fmt.Sprintf("pid %d", pid),
				fmt.Sprintf("a VMM process other than the bound one (pid %d) claims guest %q", boundPID, guest))
		}
	}
}

func oneLine(b []byte) string {
	return strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", "; ")
}
