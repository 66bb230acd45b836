package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// cadvisorPeerModule is the peer benchmark's cAdvisor, relative to the
// repository root: a module of its own (e2e/cadvisorpeer/go.mod), out of
// the main module's ./... and go.mod.
const cadvisorPeerModule = "e2e/cadvisorpeer"

var cadvisorPeerBuild struct {
	sync.Mutex
	path string
}

// BuildCadvisorPeer builds the kubelet's embedded cAdvisor as the peer
// benchmark runs it (the e2e/cadvisorpeer module: github.com/google/cadvisor
// v0.53.0's manager and Prometheus collector, see its doc) and returns its
// binary's path, kept and reused as BuildCollector keeps the collector's
// (os.TempDir()/sandboxstats-cadvisorpeer-<key>). A cold build takes about
// 20 s of CPU once the modules are downloaded. Without a go command, or
// when the build fails, the benchmark is skipped, or fails under CI=true.
// Where PrebuiltBinEnv names a directory, its cadvisorpeer is returned.
func BuildCadvisorPeer(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv(PrebuiltBinEnv); dir != "" {
		p := filepath.Join(dir, "cadvisorpeer")
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s=%s: %v", PrebuiltBinEnv, dir, err)
		}
		return p
	}
	cadvisorPeerBuild.Lock()
	defer cadvisorPeerBuild.Unlock()
	if p := cadvisorPeerBuild.path; p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	goCmd, err := exec.LookPath("go")
	Need(t, err == nil, "no go command on PATH: the peer cAdvisor (e2e/cadvisorpeer) is built with it")
	p, err := buildModule(goCmd, cadvisorPeerModule, "cadvisorpeer")
	Need(t, err == nil, fmt.Sprintf("building the peer cAdvisor failed: %v", err))
	cadvisorPeerBuild.path = p
	return p
}
