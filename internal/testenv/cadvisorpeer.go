package testenv

import "testing"

// cadvisorPeerModule is the peer benchmark's cAdvisor, relative to the
// repository root: a module of its own (e2e/cadvisorpeer/go.mod), out of
// the main module's ./... and go.mod.
const cadvisorPeerModule = "e2e/cadvisorpeer"

var cadvisorPeerBuild moduleBuild

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
	return cadvisorPeerBuild.get(t, cadvisorPeerModule, "cadvisorpeer", "the peer cAdvisor")
}
