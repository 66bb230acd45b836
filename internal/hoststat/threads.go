package hoststat

// This file is the VMM thread view: each listed process's threads read
// from <proc>/<pid>/task (internal/process; all processes under one read
// bound), the per-class totals, and tid-reuse detection across samples.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/process"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// usecPerTick converts USER_HZ ticks to usec.
const usecPerTick = 1_000_000 / process.UserHZ

const legendThreads = "VMM threads as the host scheduler accounted them: utime/stime/guest in usec at " +
	"USER_HZ tick resolution (utime includes guest), run/run_delay in ns from schedstat; run_delay of a " +
	"vCPU thread is the host-side analogue of the guest's steal; 'other' threads are VMM overhead no guest " +
	"counter sees; guest time stays 0 where the host accounts guest execution as system time (PVM); " +
	"per thread all are counters; the class totals are sums over the threads present at this sample, not " +
	"counters (a thread exiting makes them drop: difference per thread), run/run_delay over the threads with schedstat"

// procThreads is one process's threads as read in one bounded batch.
type procThreads struct {
	pid     int32
	cmdline []string
	threads []source.VMMThread
	errs    []string
}

// readProcThreads reads, per thread, task/<tid>/stat (required), schedstat
// and comm (a thread's directory has a process's layout), and, when withCmdline,
// the process's cmdline (only the VMM's is needed, for the guest name). It
// blocks; callers run it bounded. A thread that vanishes mid-read is
// reported in errs, not as an error.
func readProcThreads(procRoot string, pid int32, withCmdline bool) (*procThreads, error) {
	taskDir := filepath.Join(procRoot, strconv.Itoa(int(pid)), "task")
	gone := func(err error) error {
		if process.IsGone(err) {
			return fmt.Errorf("%w: process %d is gone: %w", source.ErrNotMeasurable, pid, err)
		}
		return err
	}
	pt := &procThreads{pid: pid}
	if withCmdline {
		pt.cmdline, _ = process.ReadCmdline(filepath.Dir(taskDir)) // optional: only for the guest name
	}
	tids, err := process.PIDs(taskDir)
	if err != nil {
		return nil, gone(err)
	}
	for _, tid := range tids {
		dir := filepath.Join(taskDir, strconv.Itoa(tid))
		st, err := process.ReadStat(dir)
		if err != nil {
			pt.errs = append(pt.errs, threadErr(tid, taskDir, "stat", "", err))
			continue
		}
		name := st.Comm
		if c, err := process.ReadComm(dir); err == nil {
			name = c
		}
		name = foreign.Bound(name, 64) // comm is 16 bytes, any of them a process chose
		class, idx, isVCPU := classifyThread(name)
		th := source.VMMThread{
			PID:            pid,
			TID:            int32(tid),
			Name:           name,
			StartTimeTicks: st.Starttime,
			Class:          class,
			UtimeUsec:      uint64(st.UTime) * usecPerTick,
			StimeUsec:      uint64(st.STime) * usecPerTick,
			GuestTimeUsec:  uint64(max(st.GuestTime, 0)) * usecPerTick,
		}
		if isVCPU {
			th.VCPUIndex = &idx
		}
		if ss, err := process.ReadSchedstat(dir); err != nil {
			pt.errs = append(pt.errs, threadErr(tid, taskDir, "schedstat", "schedstat absent: ", err))
		} else {
			th.RunNs, th.RunDelayNs, th.RunCount = &ss.RunningNanoseconds, &ss.WaitingNanoseconds, &ss.RunTimeslices
		}
		pt.threads = append(pt.threads, th)
	}
	slices.SortFunc(pt.threads, func(a, b source.VMMThread) int { return int(a.TID) - int(b.TID) })
	return pt, nil
}

// threadErr is one thread_errors entry: "tid: [what]<err>" for a read error
// (which names its path), "tid: <dir>/<tid>/<file>: <err>" for a parse error.
func threadErr(tid int, taskDir, file, what string, err error) string {
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		return fmt.Sprintf("%d: %s%v", tid, what, err)
	}
	return fmt.Sprintf("%d: %s/%d/%s: %v", tid, taskDir, tid, file, err)
}

// threadsView reads every process's threads and names the guest. reused is
// set when the first process's threads turned out not to be the pinned
// process's (the other views of that pid are then refused too).
func (s *sampler) threadsView(ctx context.Context, procs []int32, how string, perr error) (v *source.VMMThreadsView, name, nameSrc string, reused error) {
	v = &source.VMMThreadsView{Legend: legendThreads, ProcessSource: how, UserHZ: process.UserHZ}
	name, nameSrc = guestNameFromPIDFile(s.ref.VMMPIDFile), "pid-file-dir"
	if perr != nil {
		v.Error = perr.Error()
		if name == "" {
			return v, "anonymous", "none", nil
		}
		return v, name, nameSrc, nil
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
		if err == nil && first {
			err = s.samePinned(pid, pt.threads)
			reused = err
		}
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("%s/%d/task: %w", s.cfg.ProcRoot, pid, err)
			}
			continue
		}
		v.PIDs = append(v.PIDs, pid)
		v.Threads = append(v.Threads, pt.threads...)
		v.ThreadErrors = append(v.ThreadErrors, pt.errs...)
		if name == "" && first {
			if n := qemuGuestName(pt.cmdline); n != "" {
				name, nameSrc = n, "qemu-cmdline"
			}
		}
	}
	if len(v.PIDs) == 0 && firstErr != nil {
		v.Error = firstErr.Error()
	} else if firstErr != nil {
		v.ThreadErrors = append(v.ThreadErrors, firstErr.Error())
	}
	var notes []string
	v.VCPUTotals, v.OtherTotals, notes = threadTotals(v.Threads)
	v.ThreadErrors = append(v.ThreadErrors, notes...)
	v.ReusedTIDs = s.noteThreads(v.Threads)
	if name == "" {
		name, nameSrc = "anonymous", "none"
	}
	return v, name, nameSrc, reused
}

// samePinned checks, after the read, that the threads read are the pinned
// process's: its main thread (tid = pid) started when the process did. A
// pid reused between the pin check and the read is refused.
func (s *sampler) samePinned(pid int32, ths []source.VMMThread) error {
	pin, ok := s.pin.Pinned()
	if !ok || pin.PID != int(pid) {
		return nil
	}
	for _, th := range ths {
		if th.TID == pid && th.StartTimeTicks != pin.StartTicks {
			return fmt.Errorf("%w: %w: %w: its main thread started at tick %d, the pinned process at %d",
				source.ErrNotMeasurable, source.ErrSandboxGone, process.ErrReused, th.StartTimeTicks, pin.StartTicks)
		}
	}
	return nil
}

// threadTotals sums each class over the threads present in this sample
// (sums, not counters: a thread exiting makes them drop). Run and run delay
// sum only the threads whose schedstat was read; each class with threads
// lacking it gets a note "k of n threads without schedstat", and a class
// where no thread has it says its run totals are unknown, not 0.
func threadTotals(ths []source.VMMThread) (vcpu, other *source.VMMThreadTotals, notes []string) {
	vcpu = &source.VMMThreadTotals{Class: source.VMMThreadClassVCPU}
	other = &source.VMMThreadTotals{Class: source.VMMThreadClassOther}
	var noSchedVCPU, noSchedOther uint32
	for _, th := range ths {
		t, noSched := other, &noSchedOther
		if th.Class == source.VMMThreadClassVCPU {
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
		t       *source.VMMThreadTotals
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
func (s *sampler) noteThreads(ths []source.VMMThread) []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var reused []int32
	next := make(map[int32]uint64, len(ths))
	for _, th := range ths {
		if start, ok := s.prevTids[th.TID]; ok && start != th.StartTimeTicks {
			reused = append(reused, th.TID)
		}
		next[th.TID] = th.StartTimeTicks
	}
	s.prevTids = next
	return reused
}
