package hoststat

// This file is the KVM debugfs view: the VMM's per-VM directories under
// <debugfs>/kvm, each counter tagged with its kind, scope and unit.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

const legendKVM = "KVM counters of this VM only (debugfs per-VM files sum the VM's vCPUs; QMP gives one " +
	"vCPU or the VM), never the top-level debugfs sums over all VMs; only cumulative counters may be " +
	"differenced (a decrease is a reset or a new VM); gauges and peaks are never differenced; histograms are " +
	"omitted; a source that cannot be read is unavailable with its reason, never zero"

// kvmStatKind classifies the KVM statistic names whose type is not
// cumulative (from include/linux/kvm_host.h and arch/x86/kvm/x86.c, with
// pre-5.14 names). Unknown names fall back to the file mode: 0444 is an
// INSTANT gauge, writable files are cumulative.
var kvmStatKind = map[string]source.KVMCounterKind{
	"blocking":                     source.KVMCounterKindGauge,
	"guest_mode":                   source.KVMCounterKindGauge,
	"mmu_unsync":                   source.KVMCounterKindGauge,
	"pages_4k":                     source.KVMCounterKindGauge,
	"pages_2m":                     source.KVMCounterKindGauge,
	"pages_1g":                     source.KVMCounterKindGauge,
	"nx_lpage_splits":              source.KVMCounterKindGauge,
	"lpages":                       source.KVMCounterKindGauge,
	"largepages":                   source.KVMCounterKindGauge,
	"nx_largepages_splitted":       source.KVMCounterKindGauge,
	"max_mmu_rmap_size":            source.KVMCounterKindPeak,
	"max_mmu_page_hash_collisions": source.KVMCounterKindPeak,
}

// kvmVMStats are the per-VM (not per-vCPU) statistic names; every other
// per-VM debugfs file is a sum over the VM's vCPUs.
var kvmVMStats = map[string]bool{
	"remote_tlb_flush": true, "remote_tlb_flush_requests": true,
	"mmu_shadow_zapped": true, "mmu_pte_write": true, "mmu_pte_updated": true, "mmu_pde_zapped": true,
	"mmu_flooded": true, "mmu_recycled": true, "mmu_cache_miss": true, "mmu_unsync": true,
	"pages_4k": true, "pages_2m": true, "pages_1g": true, "nx_lpage_splits": true, "lpages": true,
	"largepages": true, "nx_largepages_splitted": true, "max_mmu_rmap_size": true,
	"max_mmu_page_hash_collisions": true,
}

func kvmKind(name string, mode fs.FileMode) source.KVMCounterKind {
	if k, ok := kvmStatKind[name]; ok {
		return k
	}
	if mode != 0 && mode.Perm()&0o222 == 0 {
		return source.KVMCounterKindGauge
	}
	return source.KVMCounterKindCumulative
}

func kvmScope(name string) string {
	if kvmVMStats[name] {
		return "vm"
	}
	return "vcpu-sum"
}

func kvmUnit(name string) string {
	if strings.HasSuffix(name, "_ns") {
		return "ns"
	}
	if name == "guest_mode" {
		return "boolean"
	}
	return "count"
}

// parseVMDirName matches a debugfs per-VM directory, anchored "<pid>-<fd>":
// pid is the thread that created the VM, fd the VM fd number.
func parseVMDirName(name string) (pid, fd int32, ok bool) {
	a, b, found := strings.Cut(name, "-")
	if !found || !allDigits(a) || !allDigits(b) {
		return 0, 0, false
	}
	p, err1 := strconv.ParseInt(a, 10, 32)
	f, err2 := strconv.ParseInt(b, 10, 32)
	if err1 != nil || err2 != nil || p <= 0 {
		return 0, 0, false
	}
	return int32(p), int32(f), true
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// parseDebugfsValue parses a KVM debugfs stat file: "%llu\n".
func parseDebugfsValue(b []byte) (uint64, error) {
	t := strings.TrimSuffix(string(b), "\n")
	v, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: kvm debugfs value %s: %w", source.ErrMalformed, foreign.QuoteBytes(b), err)
	}
	return v, nil
}

// debugfsView reads the VMM's per-VM KVM debugfs directory under the bound.
func (s *sampler) debugfsView(ctx context.Context, vmmPID int32) *source.KVMSourceView {
	key := fmt.Sprintf("hoststat:debugfs:%s:%d", s.cfg.DebugfsRoot, vmmPID)
	v, err := bounded.Do(ctx, s.g, key, func() (*source.KVMSourceView, error) {
		return s.readDebugfs(vmmPID), nil
	})
	if err != nil {
		return unavailableView(source.KVMSourceDebugfs, s.cfg.DebugfsRoot+"/kvm", err.Error())
	}
	return v
}

// readDebugfs reads the per-VM directory directly when debugfs is mounted at
// DebugfsRoot (or DebugfsRoot holds a kvm tree), else inside a private mount
// namespace on a discarded thread.
func (s *sampler) readDebugfs(vmmPID int32) *source.KVMSourceView {
	root := s.cfg.DebugfsRoot
	r := debugfsReader{root: root, procRoot: s.cfg.ProcRoot, read: readProcFile}
	mounted, err := isDebugfs(root)
	if err != nil {
		return unavailableView(source.KVMSourceDebugfs, root, fmt.Sprintf("debugfs root: %v", err))
	}
	if _, err := os.Stat(filepath.Join(root, "kvm")); mounted || err == nil {
		return r.readVM(vmmPID)
	}
	if s.cfg.DisableDebugfsMount {
		return unavailableView(source.KVMSourceDebugfs, root,
			"debugfs is not mounted at "+root+" and mounting it is disabled")
	}
	var v *source.KVMSourceView
	if err := inPrivateDebugfs(root, func() { v = r.readVM(vmmPID) }); err != nil {
		return unavailableView(source.KVMSourceDebugfs, root,
			fmt.Sprintf("debugfs is not mounted at %s and a private mount failed: %v", root, err))
	}
	// The note goes in Reason, not Origin: Origin names the VM directory
	// only, so a host mounting or unmounting debugfs between two samples is
	// not "a new VM" to Window.
	note := "read through a private debugfs mount (debugfs is not mounted at " + root + ")"
	if v.Reason == "" {
		v.Reason = note
	} else {
		v.Reason += "; " + note
	}
	return v
}

// readProcFile reads one small debugfs or /proc file whole, bounded in size.
func readProcFile(path string) ([]byte, error) { return bounded.ReadFile(path, bounded.MaxFileBytes) }

// debugfsReader reads KVM debugfs files; read is replaceable in tests
// (a fixture tree cannot reproduce lockdown's EPERM). procRoot maps a
// thread to its process.
type debugfsReader struct {
	root     string
	procRoot string
	read     func(path string) ([]byte, error)
}

// threadOf reports whether tid is a thread of process pid: whether
// <procRoot>/<pid>/task/<tid> exists. The kernel's own listing, nothing
// parsed (procfs's status parser expanded a Cpus_allowed_list range cell by
// cell, and indexed past an array on a Uid: line of five ids).
func (r debugfsReader) threadOf(tid, pid int32) bool {
	if tid <= 0 || pid <= 0 {
		return false
	}
	_, err := os.Stat(filepath.Join(r.procRoot, strconv.Itoa(int(pid)), "task", strconv.Itoa(int(tid))))
	return err == nil
}

// readVM finds the VM directories created by vmmPID's threads and reads
// every stat file in them, opening and closing each (an open file pins the
// VM).
func (r debugfsReader) readVM(vmmPID int32) *source.KVMSourceView {
	kvmDir := filepath.Join(r.root, "kvm")
	ents, err := os.ReadDir(kvmDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return unavailableView(source.KVMSourceDebugfs, kvmDir,
				"no kvm directory in debugfs: KVM is not in this kernel or /dev/kvm was never opened")
		}
		return unavailableView(source.KVMSourceDebugfs, kvmDir, explainErr(err))
	}
	var dirs []string
	for _, e := range ents {
		pid, _, ok := parseVMDirName(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		if pid == vmmPID {
			dirs = append(dirs, e.Name())
			continue
		}
		// Cloud Hypervisor creates the VM on its vmm thread: map the tid
		// to its process.
		if r.threadOf(pid, vmmPID) {
			dirs = append(dirs, e.Name())
		}
	}
	if len(dirs) == 0 {
		return unavailableView(source.KVMSourceDebugfs, kvmDir,
			fmt.Sprintf("no KVM VM directory of process %d under %s (the VMM runs no KVM VM, or its directory was lost to a duplicate name)", vmmPID, kvmDir))
	}
	v := &source.KVMSourceView{Source: source.KVMSourceDebugfs}
	var origins []string
	var cumulative int
	var firstErr error
	for _, d := range dirs {
		origins = append(origins, "kvm/"+d)
		files, err := os.ReadDir(filepath.Join(kvmDir, d))
		if err != nil {
			v.Absent = append(v.Absent, fmt.Sprintf("kvm/%s: %s", d, explainErr(err)))
			firstErr = cmpFirst(firstErr, err)
			continue
		}
		for _, f := range files {
			name := f.Name()
			if f.IsDir() || strings.HasSuffix(name, "_hist") || name == "mmu_rmaps_stat" {
				continue
			}
			var mode fs.FileMode
			if info, err := f.Info(); err == nil {
				mode = info.Mode()
			}
			kind := kvmKind(name, mode)
			b, err := r.read(filepath.Join(kvmDir, d, name))
			if err != nil {
				v.Absent = append(v.Absent, fmt.Sprintf("%s: %s", name, explainErr(err)))
				firstErr = cmpFirst(firstErr, fmt.Errorf("kvm/%s/%s: %w", d, name, err))
				continue
			}
			val, err := parseDebugfsValue(b)
			if err != nil {
				v.Absent = append(v.Absent, fmt.Sprintf("%s: %v", name, err))
				firstErr = cmpFirst(firstErr, err)
				continue
			}
			if kind == source.KVMCounterKindCumulative {
				cumulative++
			}
			scope := kvmScope(name)
			if len(dirs) > 1 {
				scope = d + "/" + scope
			}
			v.Counters = append(v.Counters, source.KVMCounter{
				Name: name, Kind: kind, Scope: scope, Value: val, Unit: kvmUnit(name),
			})
		}
	}
	v.Origin = strings.Join(origins, ", ")
	slices.SortStableFunc(v.Counters, func(a, b source.KVMCounter) int {
		return strings.Compare(a.Scope+"\x00"+a.Name, b.Scope+"\x00"+b.Name)
	})
	switch {
	case cumulative == 0:
		v.State = source.KVMSourceStateUnavailable
		if firstErr != nil {
			v.Reason = fmt.Sprintf("no cumulative counter readable (%d files refused), first: %s", len(v.Absent), explainErr(firstErr))
		} else {
			v.Reason = "no cumulative counter file in the VM directory"
		}
	case len(v.Absent) > 0:
		v.State = source.KVMSourceStatePartial
		v.Reason = fmt.Sprintf("%d files could not be read, first: %s", len(v.Absent), explainErr(firstErr))
	default:
		v.State = source.KVMSourceStateAvailable
	}
	return v
}

func cmpFirst(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// explainErr names kernel lockdown for EPERM on debugfs, which is what it
// means there: lockdown refuses every debugfs file whose mode exceeds 0444.
func explainErr(err error) string {
	if errors.Is(err, syscall.EPERM) {
		return err.Error() + " (kernel lockdown: debugfs allows only 0444 files, KVM counters are 0644)"
	}
	return err.Error()
}
