package testenv

import (
	"os"
	"strings"
)

// VMLaneMarker is the kernel command-line word of the guest the VM lane
// boots (see VMLane): a test that may only run inside that guest (an
// AF_VSOCK socket, which on the host would leave the machine) checks
// InVMLane.
const VMLaneMarker = "sandboxstats.vmlane=1"

// InVMLane reports whether this process runs inside the VM lane's guest: its
// kernel was booted with VMLaneMarker. The host's kernel never is, so a test
// guarded by it cannot run on the host by an environment variable's mistake.
func InVMLane() bool {
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return false
	}
	for f := range strings.FieldsSeq(string(b)) {
		if f == VMLaneMarker {
			return true
		}
	}
	return false
}
