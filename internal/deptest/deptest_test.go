package deptest

import (
	"bytes"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/sandboxstats/sandboxstats"

// Daemon packages: statsd's internals. A client that links one links the
// daemon. (internal/atomicfile is not one: a dependency-free helper that
// writes statsd's state and the bridge's placement key alike; statsctl's
// allowlist keeps it out of statsctl.)
var daemonPackages = []string{
	"internal/server", "internal/identity", "internal/drift", "internal/hoststat",
	"internal/gvisor", "internal/microvm", "internal/bounded",
	"internal/process", "internal/source", "internal/nodeagent",
	// sentryusage dials sentries' control servers: daemon side.
	"internal/sentryusage",
	// lifecyclewire: the codec of statsd's lifecycle socket.
	"internal/lifecyclewire",
}

// statsctlAllowed are the only packages of this module statsctl may link
// (besides itself): the API, the client side and the dependency-free
// helpers every binary shares. A new one must be added here, explicitly.
var statsctlAllowed = []string{
	"proto/sandboxstats/v1", "internal/api", "internal/rate", "internal/sweep",
	"internal/sockaddr", "internal/version",
	// peercred: the sweep checks the uid of the statsd it dialled.
	"internal/peercred",
	// foreign (dependency-free): rate cuts a hostile daemon's long actor
	// uids as foreign text is. statsctl's own output sanitizer
	// (cmd/statsctl/sanitize.go) stays its own: it escapes for a terminal.
	"internal/foreign",
}

// Test-only packages: fakes and end-to-end helpers.
var testOnlyPackages = []string{"internal/statsdfake", "internal/kataagentfake", "internal/nrifake", "internal/testenv"}

// devTools are the main packages outside cmd/: run with go run by the
// Makefile, never built by make build nor installed, so no binary rules
// apply to them. Any other main package must be a binary under cmd/.
var devTools = []string{
	"internal/benchtable",   // make bench: go test -bench output as a table of ratios
	"internal/cmd/mkimages", // make images: the images' archives and the kustomization's digests
}

// badDeps returns, per binary, the packages it must not link (each with its
// subpackages) and why.
func badDeps() map[string]map[string]string {
	statsctl := map[string]string{
		"github.com/prometheus/procfs":        "reads kernel files: daemon side",
		"github.com/containerd/ttrpc":         "the Kata agent's RPC: daemon side",
		"github.com/containerd/cgroups":       "cgroup reading: daemon side (and only a benchmark uses it)",
		"github.com/prometheus/client_golang": "serves metrics: statsagent only",
		"github.com/mdlayher/vsock":           "dials guest agents: daemon side",
	}
	for _, p := range daemonPackages {
		statsctl[module+"/"+p] = "a daemon package: statsctl talks to statsd over the API only"
	}
	otlp := map[string]string{
		"go.opentelemetry.io/otel/sdk":       "the OpenTelemetry SDK: statsagent's OTLP export only",
		"go.opentelemetry.io/otel/exporters": "the OTLP exporters: statsagent only",
		module + "/internal/otlp":            "the OTLP export: statsagent only",
	}
	statsd := map[string]string{
		"github.com/prometheus/client_golang": "statsd serves no metrics (statsagent does)",
		// Its package-level regular expressions, compiled at start, were
		// 0.15 MiB of an idle statsd's 2.6 MiB (internal/process reads the
		// few /proc files statsd needs).
		"github.com/prometheus/procfs": "statsd reads /proc through internal/process",
		// Its descriptors, registered at start: 11 KiB.
		"google.golang.org/genproto/googleapis/rpc/errdetails": "statsd writes its errors' ErrorInfo by hand (internal/api)",
	}
	maps.Copy(statsd, otlp)
	maps.Copy(statsctl, otlp)
	// statsnri, the NRI bridge, is a client of statsd's API like statsctl
	// (it links none of the daemon) and the only binary that speaks NRI.
	// (procfs comes with client_golang, as in statsagent.)
	statsnri := map[string]string{
		"github.com/containerd/cgroups": "cgroup reading: daemon side",
		"github.com/mdlayher/vsock":     "dials guest agents: daemon side (the bridge only passes an agent's address on)",
	}
	for _, p := range daemonPackages {
		statsnri[module+"/"+p] = "a daemon package: the bridge talks to statsd over the API only"
	}
	nri := "NRI (and the WASM runtime and logrus it links): statsnri's only"
	maps.Copy(statsnri, otlp)
	rules := map[string]map[string]string{
		module + "/cmd/statsctl":   statsctl,
		module + "/cmd/statsd":     statsd,
		module + "/cmd/statsagent": {},
		module + "/cmd/statsnri":   statsnri,
	}
	for _, b := range []string{"statsctl", "statsd", "statsagent"} {
		rules[module+"/cmd/"+b]["github.com/containerd/nri"] = nri
		rules[module+"/cmd/"+b]["github.com/tetratelabs/wazero"] = nri
	}
	for _, r := range rules {
		r["testing"] = "production code does not link the testing package"
		for _, p := range testOnlyPackages {
			r[module+"/"+p] = "test-only package"
		}
		r[module+"/internal/ociimage"] = "builds the images (make images, the tests): no binary packs images"
	}
	return rules
}

func TestDeps(t *testing.T) {
	goTool := goTool(t)
	root := moduleRoot(t, goTool)
	rules := badDeps()

	bins := strings.Fields(run(t, goTool, root, "list", "-f", `{{if eq .Name "main"}}{{.ImportPath}}{{end}}`, "./cmd/..."))
	for _, b := range bins {
		if _, ok := rules[b]; !ok {
			t.Errorf("binary %s has no dependency rules: add it to badDeps", b)
		}
	}
	for b := range rules {
		if !slices.Contains(bins, b) {
			t.Errorf("no binary %s any more: update badDeps", b)
		}
	}
	// A main package elsewhere would escape the rules above.
	for _, m := range strings.Fields(run(t, goTool, root, "list", "-f", `{{if eq .Name "main"}}{{.ImportPath}}{{end}}`, "./...")) {
		if !slices.Contains(bins, m) && !slices.Contains(devTools, strings.TrimPrefix(m, module+"/")) {
			t.Errorf("main package %s is neither a binary under cmd/ (with rules in badDeps) nor a dev tool (devTools)", m)
		}
	}
	// A rule naming a package that was renamed or removed would pass
	// forever: every one of ours must still exist.
	var ours []string
	for _, p := range slices.Concat(daemonPackages, testOnlyPackages, statsctlAllowed, devTools) {
		ours = append(ours, "./"+p)
	}
	run(t, goTool, root, append([]string{"list"}, ours...)...)

	for _, bin := range bins {
		t.Run(strings.TrimPrefix(bin, module+"/"), func(t *testing.T) {
			imports := parseGraph(run(t, goTool, root, "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, bin))
			bad := rules[bin]
			for _, dep := range slices.Sorted(maps.Keys(imports)) {
				if prefix, ok := violates(dep, bad); ok {
					t.Errorf("links %s: %s\n\timported through %s", dep, bad[prefix], short(importChain(imports, bin, dep)))
				}
				if bin == module+"/cmd/statsctl" && !allowedInStatsctl(dep) {
					t.Errorf("links %s, which is not in statsctlAllowed (add it there if it is client-side)\n\timported through %s", dep, short(importChain(imports, bin, dep)))
				}
			}
			t.Logf("%d packages linked", len(imports))
		})
	}
}

// allowedInStatsctl reports whether statsctl may link dep: anything outside
// this module (the denylist above rules those), itself, statsctlAllowed.
func allowedInStatsctl(dep string) bool {
	rel, ours := strings.CutPrefix(dep, module+"/")
	return !ours || rel == "cmd/statsctl" || slices.Contains(statsctlAllowed, rel)
}

// violates reports whether dep is one of the bad packages or below one.
func violates(dep string, bad map[string]string) (string, bool) {
	for p := range bad {
		if dep == p || strings.HasPrefix(dep, p+"/") {
			return p, true
		}
	}
	return "", false
}

func TestViolates(t *testing.T) {
	bad := map[string]string{module + "/internal/server": "", "github.com/prometheus/client_golang": ""}
	for dep, want := range map[string]bool{
		module + "/internal/server":                      true,
		module + "/internal/server/sub":                  true,
		module + "/internal/serverless":                  false,
		"github.com/prometheus/client_golang/prometheus": true,
		"github.com/prometheus/client_model/go":          false,
		"github.com/prometheus/client_golang_other/x":    false,
	} {
		if _, got := violates(dep, bad); got != want {
			t.Errorf("violates(%s) = %v, want %v", dep, got, want)
		}
	}
}

// short joins an import chain, our packages without the module path.
func short(chain []string) string {
	for i, p := range chain {
		chain[i] = strings.TrimPrefix(p, module+"/")
	}
	return strings.Join(chain, " -> ")
}

// parseGraph reads lines of "package import...".
func parseGraph(out string) map[string][]string {
	g := make(map[string][]string)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 {
			g[f[0]] = f[1:]
		}
	}
	return g
}

// importChain returns a shortest import path from 'from' to 'to', for the
// failure message.
func importChain(g map[string][]string, from, to string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == to {
			var chain []string
			for ; p != ""; p = prev[p] {
				chain = append([]string{p}, chain...)
			}
			return chain
		}
		for _, q := range g[p] {
			if _, seen := prev[q]; !seen {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return []string{from, "?", to}
}

// goTool finds the go command: on PATH (go test puts its own GOROOT/bin
// first), else under $GOROOT. Without it the test skips, except in CI.
func goTool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); fileExists(p) {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("the go tool is not on PATH nor under $GOROOT: the dependency test cannot run")
	}
	t.Skip("the go tool is not on PATH nor under $GOROOT (set CI=true to make this a failure)")
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// moduleRoot is the directory of the module's go.mod.
func moduleRoot(t *testing.T, goTool string) string {
	t.Helper()
	gomod := strings.TrimSpace(run(t, goTool, ".", "env", "GOMOD"))
	if gomod == "" || gomod == os.DevNull {
		t.Fatal("not inside the module")
	}
	return filepath.Dir(gomod)
}

func run(t *testing.T, goTool, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(goTool, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

func TestAllowedInStatsctl(t *testing.T) {
	for dep, want := range map[string]bool{
		module + "/internal/sockaddr":      true,
		module + "/proto/sandboxstats/v1":  true,
		module + "/cmd/statsctl":           true,
		module + "/internal/atomicfile":    false,
		module + "/internal/sockaddr/sub":  false,
		"google.golang.org/grpc":           true,
		"github.com/prometheus/procfs/sub": true, // the denylist's business
	} {
		if got := allowedInStatsctl(dep); got != want {
			t.Errorf("allowedInStatsctl(%s) = %v, want %v", dep, got, want)
		}
	}
}
