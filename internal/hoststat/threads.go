package hoststat

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// userHZ is USER_HZ, the unit of the tick fields of /proc/<pid>/stat. It is
// 100 on every Linux architecture (sysconf(_SC_CLK_TCK)); the kernel's HZ may
// differ but is converted before it reaches userspace.
const userHZ = 100

// usecPerTick converts USER_HZ ticks to usec.
const usecPerTick = 1_000_000 / userHZ

const legendThreads = "VMM threads as the host scheduler accounted them: utime/stime/guest in usec at " +
	"USER_HZ tick resolution (utime includes guest), run/run_delay in ns from schedstat; run_delay of a " +
	"vCPU thread is the host-side analogue of the guest's steal; 'other' threads are VMM overhead no guest " +
	"counter sees; guest time stays 0 where the host accounts guest execution as system time (PVM); " +
	"per thread all are counters; the class totals are sums over the threads present at this sample, not " +
	"counters (a thread exiting makes them drop: difference per thread), run/run_delay over the threads with schedstat"

// taskStat is what the VMM view takes from /proc/<pid>/task/<tid>/stat.
type taskStat struct {
	Comm          string
	State         byte
	PPID          int32
	UtimeTicks    uint64
	StimeTicks    uint64
	StartTicks    uint64
	GuestTicks    uint64
	HasGuestField bool
}

// parseTaskStat parses a stat line. The comm field is taken between the
// first '(' and the LAST ')', because thread names may contain spaces,
// slashes and parentheses ("CPU 0/KVM", "a) (b").
func parseTaskStat(b []byte) (taskStat, error) {
	var st taskStat
	open := bytes.IndexByte(b, '(')
	end := bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return st, fmt.Errorf("%w: stat has no (comm): %q", source.ErrMalformed, truncate(b))
	}
	st.Comm = string(b[open+1 : end])
	rest := strings.Fields(string(b[end+1:]))
	// rest[0] is field 3 (state); field N is rest[N-3].
	if len(rest) < 20 {
		return st, fmt.Errorf("%w: stat has %d fields after comm, want at least 20: %q", source.ErrMalformed, len(rest), truncate(b))
	}
	if len(rest[0]) != 1 {
		return st, fmt.Errorf("%w: stat state %q", source.ErrMalformed, rest[0])
	}
	st.State = rest[0][0]
	ppid, err := strconv.ParseInt(rest[1], 10, 32)
	if err != nil {
		return st, fmt.Errorf("%w: stat ppid %q: %w", source.ErrMalformed, rest[1], err)
	}
	st.PPID = int32(ppid)
	for _, f := range []struct {
		dst *uint64
		n   int
	}{{&st.UtimeTicks, 14}, {&st.StimeTicks, 15}, {&st.StartTicks, 22}} {
		v, err := strconv.ParseUint(rest[f.n-3], 10, 64)
		if err != nil {
			return st, fmt.Errorf("%w: stat field %d %q: %w", source.ErrMalformed, f.n, rest[f.n-3], err)
		}
		*f.dst = v
	}
	if len(rest) > 43-3 {
		v, err := strconv.ParseUint(rest[43-3], 10, 64)
		if err != nil {
			return st, fmt.Errorf("%w: stat field 43 (guest_time) %q: %w", source.ErrMalformed, rest[40], err)
		}
		st.GuestTicks, st.HasGuestField = v, true
	}
	return st, nil
}

// schedstat is /proc/<pid>/task/<tid>/schedstat.
type schedstat struct {
	RunNs      uint64
	RunDelayNs uint64
	Count      uint64
}

// parseSchedstat parses "<run ns> <run delay ns> <timeslices>\n".
func parseSchedstat(b []byte) (schedstat, error) {
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return schedstat{}, fmt.Errorf("%w: schedstat %q: want 3 fields", source.ErrMalformed, truncate(b))
	}
	var v [3]uint64
	for i := range f {
		n, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return schedstat{}, fmt.Errorf("%w: schedstat field %d %q: %w", source.ErrMalformed, i+1, f[i], err)
		}
		v[i] = n
	}
	return schedstat{RunNs: v[0], RunDelayNs: v[1], Count: v[2]}, nil
}

// classifyThread names a VMM thread's class from its comm: QEMU "CPU <n>/KVM"
// (and "CPU <n>/TCG" without KVM; both need -name ...,debug-threads=on before
// QEMU 11), Cloud Hypervisor "vcpu<n>" and Firecracker "fc_vcpu <n>" are vCPUs
// (index n); everything else is VMM overhead.
func classifyThread(name string) (sandboxstatsv1.VmmThreadClass, int32, bool) {
	var num string
	switch {
	case strings.HasPrefix(name, "CPU ") && (strings.HasSuffix(name, "/KVM") || strings.HasSuffix(name, "/TCG")):
		num = name[len("CPU ") : len(name)-len("/KVM")]
	case strings.HasPrefix(name, "fc_vcpu "):
		num = name[len("fc_vcpu "):]
	case strings.HasPrefix(name, "vcpu"):
		num = name[len("vcpu"):]
	}
	if num != "" && num[0] != '+' && num[0] != '-' {
		if n, err := strconv.ParseInt(num, 10, 32); err == nil {
			return sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_VCPU, int32(n), true
		}
	}
	return sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_OTHER, 0, false
}

// parseQEMUGuestName returns the guest name from a NUL-separated
// /proc/<pid>/cmdline holding QEMU's "-name guest=<x>,..." (or the legacy
// "-name <x>,..."), or "" when there is none. QEMU escapes a comma in a value
// as ",,".
func parseQEMUGuestName(cmdline []byte) string {
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	for i, a := range args {
		var val string
		switch {
		case (a == "-name" || a == "--name") && i+1 < len(args):
			val = args[i+1]
		case strings.HasPrefix(a, "-name="):
			val = a[len("-name="):]
		case strings.HasPrefix(a, "--name="):
			val = a[len("--name="):]
		default:
			continue
		}
		for j, opt := range splitQEMUOpts(val) {
			if g, ok := strings.CutPrefix(opt, "guest="); ok {
				return usableName(g)
			}
			if j == 0 && !strings.Contains(opt, "=") {
				return usableName(opt)
			}
		}
	}
	return ""
}

// splitQEMUOpts splits a QEMU option string at single commas; ",," is a
// literal comma.
func splitQEMUOpts(s string) []string {
	var out []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == ',' {
			if i+1 < len(s) && s[i+1] == ',' {
				cur.WriteByte(',')
				i++
				continue
			}
			out = append(out, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteByte(s[i])
	}
	return append(out, cur.String())
}

// usableName rejects empty names and names with control characters.
func usableName(s string) string {
	if strings.TrimSpace(s) == "" || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return ""
	}
	return s
}

func truncate(b []byte) []byte {
	if len(b) > 80 {
		return b[:80]
	}
	return b
}

// procThreads is one process's threads as read in one bounded batch.
type procThreads struct {
	pid     int32
	cmdline []byte
	threads []*sandboxstatsv1.VmmThread
	errs    []string
}

// readProcThreads reads, per thread, task/<tid>/stat (required), schedstat
// and comm, and <proc>/<pid>/cmdline when withCmdline (only the VMM's is
// needed, for the guest name). It blocks; callers run it bounded. A thread
// that vanishes mid-read is reported in errs, not as an error.
func readProcThreads(procRoot string, pid int32, withCmdline bool) (*procThreads, error) {
	base := filepath.Join(procRoot, strconv.Itoa(int(pid)))
	ents, err := os.ReadDir(filepath.Join(base, "task"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: process %d is gone: %w", source.ErrNotMeasurable, pid, err)
		}
		return nil, err
	}
	pt := &procThreads{pid: pid}
	if withCmdline {
		pt.cmdline, _ = readProcFile(filepath.Join(base, "cmdline")) // optional: only for the guest name
	}
	for _, e := range ents {
		tid, err := strconv.ParseInt(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		dir := filepath.Join(base, "task", e.Name())
		b, err := readProcFile(filepath.Join(dir, "stat"))
		if err != nil {
			pt.errs = append(pt.errs, fmt.Sprintf("%d: %v", tid, err))
			continue
		}
		st, err := parseTaskStat(b)
		if err != nil {
			pt.errs = append(pt.errs, fmt.Sprintf("%d: %s/stat: %v", tid, dir, err))
			continue
		}
		name := st.Comm
		if c, err := readProcFile(filepath.Join(dir, "comm")); err == nil {
			name = strings.TrimSuffix(string(c), "\n")
		}
		class, idx, isVCPU := classifyThread(name)
		th := &sandboxstatsv1.VmmThread{
			Pid:            pid,
			Tid:            int32(tid),
			Name:           name,
			StartTimeTicks: st.StartTicks,
			Class:          class,
			UtimeUsec:      st.UtimeTicks * usecPerTick,
			StimeUsec:      st.StimeTicks * usecPerTick,
			GuestTimeUsec:  st.GuestTicks * usecPerTick,
		}
		if isVCPU {
			th.VcpuIndex = &idx
		}
		if b, err := readProcFile(filepath.Join(dir, "schedstat")); err != nil {
			pt.errs = append(pt.errs, fmt.Sprintf("%d: schedstat absent: %v", tid, err))
		} else if ss, err := parseSchedstat(b); err != nil {
			pt.errs = append(pt.errs, fmt.Sprintf("%d: %s/schedstat: %v", tid, dir, err))
		} else {
			th.RunNs, th.RunDelayNs, th.RunCount = &ss.RunNs, &ss.RunDelayNs, &ss.Count
		}
		pt.threads = append(pt.threads, th)
	}
	slices.SortFunc(pt.threads, func(a, b *sandboxstatsv1.VmmThread) int { return int(a.Tid) - int(b.Tid) })
	return pt, nil
}

// threadsView reads every process's threads and names the guest.
func (s *Sampler) threadsView(ctx context.Context, procs []int32, how string, perr error) (*sandboxstatsv1.VmmThreadsView, string, string) {
	v := &sandboxstatsv1.VmmThreadsView{Legend: legendThreads, ProcessSource: how, UserHz: userHZ}
	name, nameSrc := guestNameFromPIDFile(s.ref.VMMPIDFile), "pid-file-dir"
	if perr != nil {
		v.Error = perr.Error()
		if name == "" {
			return v, "anonymous", "none"
		}
		return v, name, nameSrc
	}
	// One bound for the whole view, not one per process: N stuck processes
	// must not make a host sample take N times the read timeout.
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReadTimeout)
	defer cancel()
	var firstErr error
	for i, pid := range procs {
		if err := ctx.Err(); err != nil {
			// Start no more reads once the bound is spent.
			if firstErr == nil {
				firstErr = fmt.Errorf("%w: threads of %d of %d processes not read: %w", source.ErrTimeout, len(procs)-i, len(procs), err)
			} else {
				v.ThreadErrors = append(v.ThreadErrors, fmt.Sprintf("threads of %d of %d processes not read: %v", len(procs)-i, len(procs), err))
			}
			break
		}
		first := i == 0
		key := fmt.Sprintf("hoststat:threads:%s/%d:cmdline=%t", s.cfg.ProcRoot, pid, first)
		pt, err := bounded.Do(ctx, s.g, key, func() (*procThreads, error) { return readProcThreads(s.cfg.ProcRoot, pid, first) })
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("%s/%d/task: %w", s.cfg.ProcRoot, pid, err)
			}
			continue
		}
		v.Pids = append(v.Pids, pid)
		v.Threads = append(v.Threads, pt.threads...)
		v.ThreadErrors = append(v.ThreadErrors, pt.errs...)
		if name == "" && first {
			if n := parseQEMUGuestName(pt.cmdline); n != "" {
				name, nameSrc = n, "qemu-cmdline"
			}
		}
	}
	if len(v.Pids) == 0 && firstErr != nil {
		v.Error = firstErr.Error()
	} else if firstErr != nil {
		v.ThreadErrors = append(v.ThreadErrors, firstErr.Error())
	}
	var notes []string
	v.VcpuTotals, v.OtherTotals, notes = threadTotals(v.Threads)
	v.ThreadErrors = append(v.ThreadErrors, notes...)
	v.ReusedTids = s.noteThreads(v.Threads)
	if name == "" {
		name, nameSrc = "anonymous", "none"
	}
	return v, name, nameSrc
}

// threadTotals sums each class over the threads present in this sample
// (sums, not counters: a thread exiting makes them drop). Run and run delay
// sum only the threads whose schedstat was read; each class with threads
// lacking it gets a note "k of n threads without schedstat", and a class
// where no thread has it says its run totals are unknown, not 0.
func threadTotals(ths []*sandboxstatsv1.VmmThread) (vcpu, other *sandboxstatsv1.VmmThreadTotals, notes []string) {
	vcpu = &sandboxstatsv1.VmmThreadTotals{Class: sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_VCPU}
	other = &sandboxstatsv1.VmmThreadTotals{Class: sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_OTHER}
	var noSchedVCPU, noSchedOther uint32
	for _, th := range ths {
		t, noSched := other, &noSchedOther
		if th.Class == sandboxstatsv1.VmmThreadClass_VMM_THREAD_CLASS_VCPU {
			t, noSched = vcpu, &noSchedVCPU
		}
		t.Threads++
		t.UtimeUsec += th.UtimeUsec
		t.StimeUsec += th.StimeUsec
		t.GuestTimeUsec += th.GuestTimeUsec
		if th.RunNs == nil || th.RunDelayNs == nil {
			*noSched++ // unknown, not 0: left out of the run sums
			continue
		}
		t.RunNs += *th.RunNs
		t.RunDelayNs += *th.RunDelayNs
	}
	for _, c := range []struct {
		name    string
		t       *sandboxstatsv1.VmmThreadTotals
		noSched uint32
	}{{"vcpu", vcpu, noSchedVCPU}, {"other", other, noSchedOther}} {
		switch {
		case c.noSched == 0:
		case c.noSched == c.t.Threads:
			notes = append(notes, fmt.Sprintf("%s totals: run_ns and run_delay_ns unknown: %d of %d threads without schedstat (the 0 is not a measurement)",
				c.name, c.noSched, c.t.Threads))
		default:
			notes = append(notes, fmt.Sprintf("%s totals: run_ns and run_delay_ns sum %d threads only: %d of %d threads without schedstat",
				c.name, c.t.Threads-c.noSched, c.noSched, c.t.Threads))
		}
	}
	return vcpu, other, notes
}

// noteThreads records this sample's (tid, start time) pairs and returns the
// tids that the previous sample saw with another start time.
func (s *Sampler) noteThreads(ths []*sandboxstatsv1.VmmThread) []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var reused []int32
	next := make(map[int32]uint64, len(ths))
	for _, th := range ths {
		if start, ok := s.prevTids[th.Tid]; ok && start != th.StartTimeTicks {
			reused = append(reused, th.Tid)
		}
		next[th.Tid] = th.StartTimeTicks
	}
	s.prevTids = next
	return reused
}

// sandboxProcesses returns a gVisor sandbox's processes: the sentry first,
// then its descendants (ptrace stubs, the sandbox's own processes) that are,
// when the sentry is not in the root cgroup, also in the sentry's cgroups.
// Descent is required in every case: with runsc --ignore-cgroups the sentry
// inherits its parent's cgroup (a session scope, say) and sharing it says
// nothing. A gofer, a sibling of the sentry (both children of runsc), is
// therefore not listed.
func (s *Sampler) sandboxProcesses(ctx context.Context, sentry int32) ([]int32, error) {
	key := fmt.Sprintf("hoststat:sandbox:%s/%d", s.cfg.ProcRoot, sentry)
	return bounded.Do(ctx, s.g, key, func() ([]int32, error) { return scanSandboxProcesses(s.cfg.ProcRoot, sentry) })
}

func scanSandboxProcesses(procRoot string, sentry int32) ([]int32, error) {
	cg, err := readProcFile(filepath.Join(procRoot, strconv.Itoa(int(sentry)), "cgroup"))
	if err != nil {
		return nil, fmt.Errorf("%w: sentry %d: %w", source.ErrNotMeasurable, sentry, err)
	}
	rootOnly := true
	for line := range strings.Lines(string(cg)) {
		if _, p, ok := strings.Cut(strings.TrimSpace(line), "::"); ok && p != "/" {
			rootOnly = false
		} else if parts := strings.SplitN(strings.TrimSpace(line), ":", 3); len(parts) == 3 && parts[2] != "/" {
			rootOnly = false
		}
	}
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	parent := map[int32]int32{}
	for _, e := range ents {
		n, err := strconv.ParseInt(e.Name(), 10, 32)
		if err != nil || int32(n) == sentry {
			continue
		}
		if b, err := readProcFile(filepath.Join(procRoot, e.Name(), "stat")); err == nil {
			if st, err := parseTaskStat(b); err == nil {
				parent[int32(n)] = st.PPID
			}
		}
	}
	// The gofer is the sentry's sibling, not its child (runsc starts both,
	// and both end up children of init), so it is recognised by its argv[0]
	// and the runsc --root it shares with the sentry, in the sentry's own
	// (non-root) cgroup.
	sentryRoot := runscRoot(procRoot, sentry)
	var same []int32
	for pid := range parent {
		descends := false
		for p, hops := parent[pid], 0; p != 0 && hops < 64; p, hops = parent[p], hops+1 {
			if p == sentry {
				descends = true
				break
			}
		}
		if !descends && (rootOnly || sentryRoot == "") {
			continue
		}
		if !rootOnly {
			b, err := readProcFile(filepath.Join(procRoot, strconv.Itoa(int(pid)), "cgroup"))
			if err != nil || !bytes.Equal(b, cg) {
				continue
			}
			if !descends && !isGoferOf(procRoot, pid, sentryRoot) {
				continue
			}
		}
		same = append(same, pid)
	}
	slices.Sort(same)
	return append([]int32{sentry}, same...), nil
}

// runscRoot returns the --root a runsc process (sentry or gofer) was started
// with, from its command line, or "".
func runscRoot(procRoot string, pid int32) string {
	b, err := readProcFile(filepath.Join(procRoot, strconv.Itoa(int(pid)), "cmdline"))
	if err != nil {
		return ""
	}
	return runscRootOf(strings.Split(string(b), "\x00"))
}

// isGoferOf reports whether pid is a runsc gofer started with the given
// runsc --root.
func isGoferOf(procRoot string, pid int32, root string) bool {
	b, err := readProcFile(filepath.Join(procRoot, strconv.Itoa(int(pid)), "cmdline"))
	if err != nil {
		return false
	}
	args := strings.Split(string(b), "\x00")
	return len(args) > 0 && filepath.Base(args[0]) == "runsc-gofer" && runscRootOf(args) == root
}

func runscRootOf(args []string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--root="); ok {
			return v
		}
	}
	return ""
}
