package hoststat

// This file names things from their text: a VMM thread's class from its comm,
// and the guest from QEMU's command line or the pid file's directory.

import (
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// classifyThread names a VMM thread's class from its comm: QEMU "CPU <n>/KVM"
// (and "CPU <n>/TCG" without KVM; both need -name ...,debug-threads=on before
// QEMU 11), Cloud Hypervisor "vcpu<n>" and Firecracker "fc_vcpu <n>" are vCPUs
// (index n); everything else is VMM overhead.
func classifyThread(name string) (source.VMMThreadClass, int32, bool) {
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
			return source.VMMThreadClassVCPU, int32(n), true
		}
	}
	return source.VMMThreadClassOther, 0, false
}

// QEMUGuestName returns the guest name a VMM command line (NUL-separated, as
// in /proc/<pid>/cmdline) gives with QEMU's "-name guest=<x>,..." (or the
// legacy "-name <x>"), or "" when it gives none.
func QEMUGuestName(cmdline []byte) string { return parseQEMUGuestName(cmdline) }

// GuestNameFromPIDFile returns the guest name a pid file's directory gives
// (".../srv1/qemu.pid" gives "srv1"), or "" when the directory is generic.
func GuestNameFromPIDFile(path string) string { return guestNameFromPIDFile(path) }

// parseQEMUGuestName returns the guest name from a NUL-separated
// /proc/<pid>/cmdline holding QEMU's "-name guest=<x>,..." (or the legacy
// "-name <x>,..."), or "" when there is none.
func parseQEMUGuestName(cmdline []byte) string {
	return qemuGuestName(strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00"))
}

// qemuGuestName is parseQEMUGuestName on the split arguments (as
// process.ReadCmdline gives them). QEMU escapes a comma in a value as ",,".
func qemuGuestName(args []string) string {
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

// guestNameFromPIDFile returns the pid file's directory name
// (".../srv1/qemu.pid" gives "srv1"), or "" when that directory says nothing
// about the guest (the root, a runtime or temp directory).
func guestNameFromPIDFile(path string) string {
	if path == "" {
		return ""
	}
	dir := filepath.Base(filepath.Dir(filepath.Clean(path)))
	switch dir {
	case "", ".", "/", "..", "run", "var", "tmp", "pids", "pid", "qemu", "firecracker", "cloud-hypervisor", "vm", "vms":
		return ""
	}
	return dir
}
