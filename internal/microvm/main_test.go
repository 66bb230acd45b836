package microvm

import (
	"os"
	"testing"

	"github.com/containerd/log"
)

// TestMain silences ttrpc's own logging (logrus via containerd/log): the
// fault tests close connections under it on purpose, and what matters is
// asserted through the source's errors.
func TestMain(m *testing.M) {
	if os.Getenv("MICROVM_TTRPC_LOG") == "" {
		_ = log.SetLevel("fatal")
	}
	os.Exit(m.Run())
}
