package ociimage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
)

// Registry is the repository prefix of the project's images, as the
// kustomization names them (an operator pushes them elsewhere and sets
// newName).
const Registry = "registry.example.com/sandboxstats"

// Source is the images' org.opencontainers.image.source label.
const Source = "https://github.com/sandboxstats/sandboxstats"

// BinDir is where the images hold their binaries; it is their PATH.
const BinDir = "usr/local/bin"

// Platforms are the architectures (linux) every image is built for, in
// the order of its index.
var Platforms = []string{"amd64", "arm64"}

// Image is one image BuildProjectImages wrote.
type Image struct {
	Name string // "statsd", "statsagent", "statsnri", "otelcol"
	Repo string // Registry + "/" + Name
	// Digest is the image index's digest, "sha256:<hex>": the index lists
	// one manifest per platform (Platforms), and a runtime given the
	// digest runs its own platform's.
	Digest string
	Ref    string // Repo + "@" + Digest: what the archive's index.json names and crictl/CRI runs
	Path   string // outDir/<Name>.tar
	Go     string // the Go release that built the binaries ("go1.26.8"): the digests are its
}

// projectImage is how one image is made.
type projectImage struct {
	name     string
	binaries []string // built binaries it holds, the first its entrypoint
	// user is the config's User. statsd runs as root: it reads other
	// users' /proc/<pid> (the sentries', the VMMs') and host cgroup files,
	// and binds its sockets in a root-owned directory; statsnri dials
	// containerd's NRI socket (root's, mode 0600). statsagent and the
	// Collector need no privilege: the nonroot user.
	user string
}

// projectImages are the images BuildProjectImages builds, in its order.
var projectImages = []projectImage{
	{name: "statsd", binaries: []string{"statsd", "statsctl"}, user: "0:0"},
	{name: "statsagent", binaries: []string{"statsagent"}, user: "65532:65532"},
	{name: "statsnri", binaries: []string{"statsnri"}, user: "0:0"},
	{name: "otelcol", binaries: []string{"otelcol"}, user: "65532:65532"},
}

// collectorModule is the Collector's module, relative to the repository root.
const collectorModule = "e2e/otelcol"

// BuildProjectImages builds every image of the project from the source tree
// at repoRoot into outDir/<name>.tar (outDir is created), each named by
// digest (Image.Ref) in its index, and returns them in the order statsd,
// statsagent, statsnri, otelcol. Each is an image index of one manifest per
// platform (linux/amd64, linux/arm64), whatever the host. The binaries are
// built with the go command on PATH as it is (GOTOOLCHAIN=local), static
// (CGO_ENABLED=0), -trimpath and -buildvcs=false, in an environment of
// fixed code-generation settings (buildEnv): the same tree and Go release
// give the same digests on any host. With Go's build cache warm the build
// is links; cold, the Collector costs minutes of CPU per platform.
func BuildProjectImages(ctx context.Context, repoRoot, outDir string) ([]Image, error) {
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	tmp, err := os.MkdirTemp(outDir, ".build-")
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	defer os.RemoveAll(tmp)
	mainPkgs := []string{"./cmd/statsd", "./cmd/statsctl", "./cmd/statsagent", "./cmd/statsnri"}
	for _, arch := range Platforms {
		dir := filepath.Join(tmp, arch)
		if err := goBuild(ctx, arch, root, dir+string(filepath.Separator), mainPkgs...); err != nil {
			return nil, err
		}
		if err := goBuild(ctx, arch, filepath.Join(root, collectorModule), filepath.Join(dir, "otelcol"), "."); err != nil {
			return nil, err
		}
	}
	revision, err := sourceDigest(ctx, root, mainPkgs)
	if err != nil {
		return nil, err
	}
	var out []Image
	for _, pi := range projectImages {
		var specs []Spec
		goVersion := ""
		for _, arch := range Platforms {
			img, gv, err := buildImage(pi, filepath.Join(tmp, arch), revision, arch)
			if err != nil {
				return nil, fmt.Errorf("image %s (%s): %w", pi.name, arch, err)
			}
			if goVersion != "" && gv != goVersion {
				return nil, fmt.Errorf("image %s: binaries built by %s and %s", pi.name, goVersion, gv)
			}
			goVersion = gv
			specs = append(specs, img)
		}
		repo := Registry + "/" + pi.name
		path := filepath.Join(outDir, pi.name+".tar")
		d, err := WriteIndexArchiveByDigest(path, specs, repo)
		if err != nil {
			return nil, err
		}
		out = append(out, Image{Name: pi.name, Repo: repo, Digest: d.Digest, Ref: repo + "@" + d.Digest, Path: path, Go: goVersion})
	}
	return out, nil
}

// buildImage is pi's Spec for arch: the base layer and a layer of its
// binaries (built into binDir); and the Go release that built them.
func buildImage(pi projectImage, binDir, revision, arch string) (Spec, string, error) {
	app := []Entry{Dir("usr", 0o755), Dir("usr/local", 0o755), Dir(BinDir, 0o755)}
	version, goVersion := "", ""
	for _, b := range pi.binaries {
		data, err := os.ReadFile(filepath.Join(binDir, b))
		if err != nil {
			return Spec{}, "", err
		}
		bi, err := buildinfo.Read(bytes.NewReader(data))
		if err != nil {
			return Spec{}, "", fmt.Errorf("%s: %w", b, err)
		}
		if version == "" {
			version, goVersion = bi.Main.Version, bi.GoVersion
		}
		if bi.GoVersion != goVersion {
			return Spec{}, "", fmt.Errorf("%s: built by %s, %s by %s", b, bi.GoVersion, pi.binaries[0], goVersion)
		}
		if err := checkSettings(bi.Settings, arch); err != nil {
			return Spec{}, "", fmt.Errorf("%s: %w", b, err)
		}
		app = append(app, File(BinDir+"/"+b, 0o755, data))
	}
	return Spec{
		Layers: [][]Entry{BaseLayer(), app},
		Config: Config{
			User:       pi.user,
			Env:        []string{"PATH=/" + BinDir},
			Entrypoint: []string{"/" + BinDir + "/" + pi.binaries[0]},
			WorkingDir: "/",
			Labels: map[string]string{
				"org.opencontainers.image.source":   Source,
				"org.opencontainers.image.revision": revision,
				"org.opencontainers.image.version":  version,
			},
		},
		Architecture: arch,
		Gzip:         true,
	}, goVersion, nil
}

// checkSettings fails unless a binary's build settings (its buildinfo)
// are exactly the images' for linux/arch: what the go command reads from a
// go env file or elsewhere that buildEnv did not override shows here.
func checkSettings(settings []debug.BuildSetting, arch string) error {
	want := map[string]string{"-buildmode": "exe", "-compiler": "gc", "-trimpath": "true", "CGO_ENABLED": "0", "GOOS": "linux", "GOARCH": arch}
	switch arch {
	case "amd64":
		want["GOAMD64"] = "v1"
	case "arm64":
		want["GOARM64"] = "v8.0"
	}
	got := map[string]string{}
	for _, s := range settings {
		if s.Key != "DefaultGODEBUG" { // from go.mod's go and godebug lines: the source's
			got[s.Key] = s.Value
		}
	}
	if !maps.Equal(got, want) {
		return fmt.Errorf("images: build settings %v, want %v", got, want)
	}
	return nil
}

// GoBuild runs the go command on PATH: go build in dir, -o out, for
// linux/GOARCH (this host's), static (CGO_ENABLED=0), with -trimpath and
// -buildvcs=false (a VCS stamp would change the binaries, so the digests,
// with every commit, the one that records the digests too), in buildEnv.
// testenv.BuildCollector builds the test Collector with it too: one set of
// compiled packages in Go's build cache serves both and the amd64 images
// (arm64's are the images' own).
func GoBuild(ctx context.Context, dir, out string, pkgs ...string) error {
	return goBuild(ctx, runtime.GOARCH, dir, out, pkgs...)
}

// goBuild is GoBuild for linux/arch.
func goBuild(ctx context.Context, arch, dir, out string, pkgs ...string) error {
	args := append([]string{"build", "-trimpath", "-buildvcs=false", "-o", out}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = buildEnv(arch)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("images: go %s in %s (GOARCH=%s): %w\n%s", strings.Join(args, " "), dir, arch, err, b)
	}
	return nil
}

// GoVersion is the release of the go command the images are built with
// (the one on PATH, GOTOOLCHAIN=local): "go1.26.8".
func GoVersion(ctx context.Context) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "env", "GOVERSION")
	cmd.Env = buildEnv(runtime.GOARCH)
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("images: go env GOVERSION: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// buildEnvFixed are the settings of every images build: static linux, the
// go command on PATH as it is (no switch to another toolchain by the
// environment or a go.mod toolchain line), the baseline instruction sets,
// no FIPS 140 module, no experiments, no GOFLAGS but -mod=readonly, no
// workspace. What the environment says of them is dropped (buildEnv).
var buildEnvFixed = []string{
	"CGO_ENABLED=0", "GOOS=linux", "GOTOOLCHAIN=local", "GOAMD64=v1", "GOARM64=v8.0",
	"GOFIPS140=off", "GOEXPERIMENT=", "GOFLAGS=-mod=readonly", "GOWORK=off",
}

// buildEnv is the environment of go build and go list for linux/arch: this
// one less every variable that changes what the compiler or linker makes,
// plus buildEnvFixed.
func buildEnv(arch string) []string {
	drop := []string{"GOARCH", "GO386", "GOARM", "GOMIPS", "GOMIPS64", "GOPPC64", "GORISCV64", "GOWASM", "CC", "CXX", "CGO_CFLAGS", "CGO_LDFLAGS"}
	for _, kv := range buildEnvFixed {
		k, _, _ := strings.Cut(kv, "=")
		drop = append(drop, k)
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.Contains(drop, k)
	})
	return slices.Concat(env, buildEnvFixed, []string{"GOARCH=" + arch})
}

// sourceDigest is the images' revision label: "sha256:" and the hash of the
// repository's files the binaries are built from (the main packages' and
// their in-repository dependencies' Go and embedded files, both modules'
// go.mod and go.sum, the Collector's Go files), names and contents. Not the
// git commit: a commit that records the images' digests would change them.
func sourceDigest(ctx context.Context, root string, mainPkgs []string) (string, error) {
	files := []string{"go.mod", "go.sum", collectorModule + "/go.mod", collectorModule + "/go.sum"}
	for _, m := range []struct {
		dir  string
		pkgs []string
	}{{root, mainPkgs}, {filepath.Join(root, collectorModule), []string{"."}}} {
		var b []byte
		for _, arch := range Platforms { // a file may be one platform's
			args := append([]string{"list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{range .GoFiles}}|{{.}}{{end}}{{range .EmbedFiles}}|{{.}}{{end}}{{end}}"}, m.pkgs...)
			cmd := exec.CommandContext(ctx, "go", args...)
			cmd.Dir = m.dir
			cmd.Env = buildEnv(arch)
			out, err := cmd.Output()
			if err != nil {
				return "", fmt.Errorf("images: go list in %s (GOARCH=%s): %w", m.dir, arch, err)
			}
			b = append(b, out...)
		}
		for line := range strings.Lines(string(b)) {
			parts := strings.Split(strings.TrimSpace(line), "|")
			rel, err := filepath.Rel(root, parts[0])
			if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
				continue // a module dependency: go.sum pins it
			}
			for _, f := range parts[1:] {
				files = append(files, filepath.ToSlash(filepath.Join(rel, f)))
			}
		}
	}
	slices.Sort(files)
	files = slices.Compact(files)
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			return "", fmt.Errorf("images: %w", err)
		}
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
