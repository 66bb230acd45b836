package ociimage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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

// Image is one image BuildProjectImages wrote.
type Image struct {
	Name   string // "statsd", "statsagent", "statsnri", "otelcol"
	Repo   string // Registry + "/" + Name
	Digest string // the manifest's digest, "sha256:<hex>"
	Ref    string // Repo + "@" + Digest: what the archive's index names
	Path   string // outDir/<Name>.tar
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
// statsagent, statsnri, otelcol. The binaries are built with the go command
// on PATH for linux and this GOARCH, static (CGO_ENABLED=0), -trimpath and
// -buildvcs=false: the same tree and Go release give the same digests.
// With Go's build cache warm the build is a link; cold, the Collector costs
// minutes of CPU.
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
	if err := GoBuild(ctx, root, tmp, mainPkgs...); err != nil {
		return nil, err
	}
	if err := GoBuild(ctx, filepath.Join(root, collectorModule), filepath.Join(tmp, "otelcol"), "."); err != nil {
		return nil, err
	}
	revision, err := sourceDigest(ctx, root, mainPkgs)
	if err != nil {
		return nil, err
	}
	var out []Image
	for _, pi := range projectImages {
		img, err := buildImage(pi, tmp, revision)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", pi.name, err)
		}
		repo := Registry + "/" + pi.name
		path := filepath.Join(outDir, pi.name+".tar")
		d, err := WriteArchiveByDigest(path, img, repo)
		if err != nil {
			return nil, err
		}
		out = append(out, Image{Name: pi.name, Repo: repo, Digest: d.Digest, Ref: repo + "@" + d.Digest, Path: path})
	}
	return out, nil
}

// buildImage is pi's Spec: the base layer and a layer of its binaries.
func buildImage(pi projectImage, binDir, revision string) (Spec, error) {
	app := []Entry{Dir("usr", 0o755), Dir("usr/local", 0o755), Dir(BinDir, 0o755)}
	version := ""
	for _, b := range pi.binaries {
		data, err := os.ReadFile(filepath.Join(binDir, b))
		if err != nil {
			return Spec{}, err
		}
		if version == "" {
			bi, err := buildinfo.Read(bytes.NewReader(data))
			if err != nil {
				return Spec{}, fmt.Errorf("%s: %w", b, err)
			}
			version = bi.Main.Version
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
		Architecture: runtime.GOARCH,
		Gzip:         true,
	}, nil
}

// GoBuild runs the go command on PATH: go build in dir, -o out, for
// linux/GOARCH, static (CGO_ENABLED=0), with -trimpath and -buildvcs=false
// (a VCS stamp would change the binaries, so the digests, with every commit,
// the one that records the digests too). The environment's GOFLAGS and
// code-generation settings are overridden. testenv.BuildCollector builds
// the test Collector with it too: one set of compiled packages in Go's build
// cache serves both.
func GoBuild(ctx context.Context, dir, out string, pkgs ...string) error {
	args := append([]string{"build", "-trimpath", "-buildvcs=false", "-o", out}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = buildEnv()
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("images: go %s in %s: %w\n%s", strings.Join(args, " "), dir, err, b)
	}
	return nil
}

// buildEnv is the environment of go build and go list: this one less what
// changes the code, plus static linux for this GOARCH.
func buildEnv() []string {
	drop := []string{"GOFLAGS", "GOOS", "GOARCH", "CGO_ENABLED", "GOAMD64", "GOARM64", "GOEXPERIMENT", "GOWORK"}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.Contains(drop, k)
	})
	return append(env, "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH, "GOWORK=off", "GOFLAGS=-mod=readonly")
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
		args := append([]string{"list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{range .GoFiles}}|{{.}}{{end}}{{range .EmbedFiles}}|{{.}}{{end}}{{end}}"}, m.pkgs...)
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = m.dir
		cmd.Env = buildEnv()
		b, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("images: go list in %s: %w", m.dir, err)
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
