package ociimage

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/buildinfo"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestIntegrationBuildProjectImagesTwice is `make images` twice from one
// commit: every image built twice, the second time from a copy of the
// sources at another path (so a build path leaking into a binary shows) into
// another directory, gives the same digests and byte-identical archives;
// each archive is an index of linux/amd64 and linux/arm64 named by its
// digest, the binaries built for each by one Go, and the Collector links
// the fallback roots.
//
// What it does not prove: both builds share Go's build cache, and with
// -trimpath the copy at another path hits the same compiled packages, so
// the second build redoes only the links and the packaging. That the
// compiler makes the same packages on a clean machine (what images-check
// on CI's fresh clone relies on) is TestIntegrationColdCacheBinary's, for
// one binary, and was checked for all by hand (docs: deploy/README.md,
// "Images"). With the cache warm each build is the links and the
// compression of both platforms (33 s at load average 10 on 2 cores, 85 s
// at 15); cold, the first costs minutes per platform.
func TestIntegrationBuildProjectImagesTwice(t *testing.T) {
	root := needGo(t, "builds every image twice with the go command; not under -short")
	copyRoot := copySources(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var builds [2][]Image
	for i, src := range []string{root, copyRoot} {
		start := time.Now()
		imgs, err := BuildProjectImages(ctx, src, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("build %d (from %s): %v", i+1, src, time.Since(start).Round(time.Millisecond))
		builds[i] = imgs
	}
	digests := func(imgs []Image) []string {
		var ds []string
		for _, img := range imgs {
			ds = append(ds, img.Name+" "+img.Digest)
		}
		return ds
	}
	if diff := cmp.Diff(digests(builds[0]), digests(builds[1])); diff != "" {
		t.Errorf("digests of two builds (-first +second):\n%s", diff)
	}
	want := []string{"statsd", "statsagent", "statsnri", "otelcol"}
	for i, img := range builds[0] {
		if i >= len(want) || img.Name != want[i] || img.Ref != Registry+"/"+img.Name+"@"+img.Digest {
			t.Errorf("image %d: %+v, want %s", i, img, want)
		}
		a, err := os.ReadFile(img.Path)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(builds[1][i].Path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s: archives differ", img.Name)
		}
		checkProjectArchive(t, img, a)
		// Identical archives from two paths already say no path is inside;
		// this says where one would be.
		_, files := readTar(t, a)
		for name, blob := range files {
			if zr, err := gzip.NewReader(bytes.NewReader(blob)); err == nil {
				if blob, err = io.ReadAll(zr); err != nil {
					t.Fatalf("%s: %s: %v", img.Name, name, err)
				}
			}
			for _, leak := range []string{root, copyRoot} {
				if bytes.Contains(blob, []byte(leak)) {
					t.Errorf("%s: %s holds the build path %s", img.Name, name, leak)
				}
			}
		}
	}
}

// TestIntegrationColdCacheBinary: statsctl (in the statsd image) built
// with an empty Go build cache is byte for byte the one built with this
// machine's cache, so the compiler, not only the linker, makes the same
// bytes on a clean machine (what TestIntegrationBuildProjectImagesTwice
// cannot show). One small binary for this host's architecture: about
// 330 packages, the standard library's included, compiled cold: 31 s on a
// shared 2-core machine, 90 s at load average 13 (36 s of CPU). The other
// binaries and arm64 were checked by hand (deploy/README.md, "Images").
func TestIntegrationColdCacheBinary(t *testing.T) {
	root := needGo(t, "compiles statsctl with an empty build cache; not under -short")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	warm, cold := filepath.Join(dir, "warm"), filepath.Join(dir, "cold")
	if err := GoBuild(ctx, root, warm, "./cmd/statsctl"); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOCACHE", t.TempDir())
	start := time.Now()
	if err := GoBuild(ctx, root, cold, "./cmd/statsctl"); err != nil {
		t.Fatal(err)
	}
	t.Logf("statsctl with an empty build cache: %v", time.Since(start).Round(time.Millisecond))
	a, err := os.ReadFile(warm)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(cold)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Errorf("statsctl built with an empty build cache (%d bytes) differs from the one built with the cache (%d bytes)", len(b), len(a))
	}
}

// needGo skips the test under -short (saying why) or without a go command
// (failing under CI=true), and returns the repository's root.
func needGo(t *testing.T, why string) string {
	t.Helper()
	if testing.Short() {
		t.Skip(why)
	}
	if _, err := exec.LookPath("go"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no go command on PATH")
		}
		t.Skip("no go command on PATH")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// copySources copies what the images are built from (the files git tracks
// under go.mod, go.sum, cmd, internal, proto and the Collector's module) to
// a temporary directory and returns it.
func copySources(t *testing.T, root string) string {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--", "go.mod", "go.sum", "cmd", "internal", "proto", collectorModule).Output()
	if err != nil {
		t.Fatalf("git ls-files in %s: %v", root, err)
	}
	dst := t.TempDir()
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(root, f)
		fi, err := os.Lstat(src)
		if os.IsNotExist(err) {
			continue // deleted in the work tree
		}
		if err != nil {
			t.Fatal(err)
		}
		to := filepath.Join(dst, f)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			link, err := os.Readlink(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(link, to); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// TestBaseLayer: the users and groups a pod's securityContext names exist,
// the nonroot user's home is its own, /tmp is sticky.
func TestBaseLayer(t *testing.T) {
	b, err := LayerTar(BaseLayer())
	if err != nil {
		t.Fatal(err)
	}
	hs, files := readTar(t, b)
	for _, tc := range []struct {
		file, line string
	}{
		{"etc/passwd", "root:x:0:0:"},
		{"etc/passwd", "nonroot:x:65532:65532:"},
		{"etc/group", "root:x:0:"},
		{"etc/group", "nonroot:x:65532:"},
		{"etc/group", "sandboxstats:x:2375:"},
	} {
		lines := strings.Split(string(files[tc.file]), "\n")
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, tc.line) }) {
			t.Errorf("%s: no line %q...:\n%s", tc.file, tc.line, files[tc.file])
		}
	}
	want := map[string]header{
		"home/nonroot/": {Name: "home/nonroot/", Type: '5', Mode: 0o700, UID: NonrootUID, GID: NonrootUID},
		"tmp/":          {Name: "tmp/", Type: '5', Mode: 0o1777},
	}
	for _, h := range hs {
		if w, ok := want[h.Name]; ok {
			if diff := cmp.Diff(w, h); diff != "" {
				t.Errorf("%s (-want +got):\n%s", h.Name, diff)
			}
			delete(want, h.Name)
		}
	}
	if len(want) != 0 {
		t.Errorf("missing %v", want)
	}
}

// TestSysusersGroup: the base's sandboxstats group is the one systemd's
// hosts get (deploy/systemd/sandboxstats.sysusers.conf).
func TestSysusersGroup(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "systemd", "sandboxstats.sysusers.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(strings.Split(string(b), "\n"), "g sandboxstats 2375") || SandboxstatsGroup != 2375 {
		t.Errorf("sandboxstats.sysusers.conf does not say g sandboxstats %d:\n%s", SandboxstatsGroup, b)
	}
}

// TestDockerfileBase: the Dockerfile's base holds the same users and groups
// as BaseLayer, and builds the binaries as GoBuild does.
func TestDockerfileBase(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	heredoc := func(dst string) string {
		_, rest, ok := strings.Cut(df, "COPY <<EOT "+dst+"\n")
		body, _, ok2 := strings.Cut(rest, "EOT\n")
		if !ok || !ok2 {
			t.Fatalf("Dockerfile: no COPY <<EOT %s", dst)
		}
		return body
	}
	for _, tc := range []struct{ dst, want string }{
		{"/rootfs/etc/passwd", etcPasswd},
		{"/rootfs/etc/group", etcGroup},
		{"/rootfs/etc/nsswitch.conf", etcNsswitch},
	} {
		if diff := cmp.Diff(tc.want, heredoc(tc.dst)); diff != "" {
			t.Errorf("Dockerfile %s (-BaseLayer +Dockerfile):\n%s", tc.dst, diff)
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "go build -trimpath -buildvcs=false", "USER 65532:65532", "chmod 1777 /rootfs/tmp"} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile: no %q", want)
		}
	}
}

// checkProjectArchive: the archive's index.json names one image index,
// img.Ref; the index holds one manifest per platform, in Platforms' order,
// each config of that architecture, each binary built by img.Go for it;
// the Collector links golang.org/x/crypto/x509roots/fallback (the roots it
// verifies a TLS gateway with: the image has no CA bundle).
func checkProjectArchive(t *testing.T, img Image, archive []byte) {
	t.Helper()
	_, files := readTar(t, archive)
	blob := func(d Descriptor) []byte {
		b, ok := files[BlobPath(d)]
		if !ok || Describe(d.MediaType, b).Digest != d.Digest {
			t.Fatalf("%s: blob %s missing or not its digest", img.Name, d.Digest)
		}
		return b
	}
	var top index
	mustUnmarshal(t, files["index.json"], &top)
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != MediaTypeIndex || top.Manifests[0].Digest != img.Digest ||
		top.Manifests[0].Annotations[AnnotationContainerName] != img.Ref || top.Manifests[0].Annotations[AnnotationRefName] != img.Ref {
		t.Fatalf("%s: index.json %+v, want one image index %s named %s", img.Name, top.Manifests, img.Digest, img.Ref)
	}
	var ix index
	mustUnmarshal(t, blob(top.Manifests[0]), &ix)
	var archs []string
	for _, md := range ix.Manifests {
		archs = append(archs, md.Platform.OS+"/"+md.Platform.Architecture)
		var m manifest
		mustUnmarshal(t, blob(md), &m)
		var cfg imageConfig
		mustUnmarshal(t, blob(m.Config), &cfg)
		if cfg.Architecture != md.Platform.Architecture || cfg.OS != "linux" {
			t.Errorf("%s: manifest for %+v has a config for %s/%s", img.Name, md.Platform, cfg.OS, cfg.Architecture)
		}
		zr, err := gzip.NewReader(bytes.NewReader(blob(m.Layers[len(m.Layers)-1])))
		if err != nil {
			t.Fatal(err)
		}
		layer, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		_, bins := readTar(t, layer)
		for name, b := range bins {
			bi, err := buildinfo.Read(bytes.NewReader(b))
			if err != nil {
				t.Fatalf("%s: %s: %v", img.Name, name, err)
			}
			if bi.GoVersion != img.Go || !slices.Contains(bi.Settings, debug.BuildSetting{Key: "GOARCH", Value: md.Platform.Architecture}) {
				t.Errorf("%s: %s built by %s for %v, want %s for %s", img.Name, name, bi.GoVersion, bi.Settings, img.Go, md.Platform.Architecture)
			}
			fallback := slices.ContainsFunc(bi.Deps, func(m *debug.Module) bool { return m.Path == "golang.org/x/crypto/x509roots/fallback" })
			if name == BinDir+"/otelcol" && !fallback {
				t.Errorf("%s (%s): %s does not link golang.org/x/crypto/x509roots/fallback", img.Name, md.Platform.Architecture, name)
			}
		}
	}
	var want []string
	for _, arch := range Platforms {
		want = append(want, "linux/"+arch)
	}
	if diff := cmp.Diff(want, archs); diff != "" {
		t.Errorf("%s: the index's platforms (-want +got):\n%s", img.Name, diff)
	}
}
