package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// header is the part of a tar header the tests compare.
type header struct {
	Name     string
	Type     byte
	Mode     int64
	UID, GID int
	Size     int64
	Link     string
	ModTime  int64
	Uname    string
	Gname    string
}

// readTar returns the headers of a tar and its files' contents by name.
func readTar(t *testing.T, b []byte) ([]header, map[string][]byte) {
	t.Helper()
	var hs []header
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hs, files
		}
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, header{h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.Size, h.Linkname, h.ModTime.Unix(), h.Uname, h.Gname})
		if h.Typeflag == tar.TypeReg {
			if files[h.Name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestLayerTar(t *testing.T) {
	owned := File("home/u/f", 0o600, []byte("x"))
	owned.UID, owned.GID = 65532, 2375
	for _, tc := range []struct {
		name    string
		entries []Entry
		want    []header
		err     error
	}{{
		name: "sorted whatever the order given, a directory before what it holds",
		entries: []Entry{
			File("usr/local/bin/statsd", 0o755, []byte("ELF")),
			Dir("usr/local/bin", 0o755), Dir("usr", 0o755), Dir("usr/local", 0o755),
			Symlink("usr/local/bin/sd", "statsd"),
			Dir("tmp", 0o1777),
		},
		want: []header{
			{Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777},
			{Name: "usr/", Type: tar.TypeDir, Mode: 0o755},
			{Name: "usr/local/", Type: tar.TypeDir, Mode: 0o755},
			{Name: "usr/local/bin/", Type: tar.TypeDir, Mode: 0o755},
			{Name: "usr/local/bin/sd", Type: tar.TypeSymlink, Mode: 0o777, Link: "statsd"},
			{Name: "usr/local/bin/statsd", Type: tar.TypeReg, Mode: 0o755, Size: 3},
		},
	}, {
		name:    "uid and gid as given, no user or group names",
		entries: []Entry{owned, Dir("home", 0o755), Dir("home/u", 0o700)},
		want: []header{
			{Name: "home/", Type: tar.TypeDir, Mode: 0o755},
			{Name: "home/u/", Type: tar.TypeDir, Mode: 0o700},
			{Name: "home/u/f", Type: tar.TypeReg, Mode: 0o600, UID: 65532, GID: 2375, Size: 1},
		},
	}, {
		name:    "empty",
		entries: nil,
	}, {
		name:    "absolute name",
		entries: []Entry{File("/etc", 0o644, nil)},
		err:     ErrLayout,
	}, {
		name:    "unclean name",
		entries: []Entry{Dir("etc", 0o755), File("etc/../passwd", 0o644, nil)},
		err:     ErrLayout,
	}, {
		name:    "escaping name",
		entries: []Entry{File("../passwd", 0o644, nil)},
		err:     ErrLayout,
	}, {
		name:    "twice",
		entries: []Entry{File("a", 0o644, nil), File("a", 0o600, nil)},
		err:     ErrLayout,
	}, {
		name:    "no entry for the parent directory",
		entries: []Entry{File("etc/passwd", 0o644, nil)},
		err:     ErrLayout,
	}, {
		name:    "a hard link",
		entries: []Entry{{Name: "a", Type: tar.TypeLink, Linkname: "b"}},
		err:     ErrLayout,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := LayerTar(tc.entries)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			got, _ := readTar(t, b)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("headers (-want +got):\n%s", diff)
			}
			again, _ := LayerTar(tc.entries)
			if !bytes.Equal(b, again) {
				t.Error("a second tar of the same entries differs")
			}
		})
	}
}

func TestGzip(t *testing.T) {
	raw := bytes.Repeat([]byte("sandboxstats "), 1000)
	a, err := Gzip(raw)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Gzip(raw)
	if !bytes.Equal(a, b) {
		t.Error("two compressions of the same bytes differ")
	}
	zr, err := gzip.NewReader(bytes.NewReader(a))
	if err != nil {
		t.Fatal(err)
	}
	if !zr.ModTime.IsZero() || zr.Name != "" || zr.Comment != "" {
		t.Errorf("gzip header: time %v, name %q, comment %q", zr.ModTime, zr.Name, zr.Comment)
	}
	got, err := io.ReadAll(zr)
	if err != nil || !bytes.Equal(got, raw) {
		t.Errorf("round trip: %v, %d bytes", err, len(got))
	}
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// TestArchive reads an archive back as `ctr images import` does: the layout's
// files, every blob under its digest with its size, the index naming the
// manifest, the manifest the config and layers, the config's diff_ids the
// uncompressed layers; every entry sorted, at the Unix epoch, root's.
func TestArchive(t *testing.T) {
	spec := Spec{
		Layers: [][]Entry{
			{Dir("etc", 0o755), File("etc/passwd", 0o644, []byte("root:x:0:0::/:/sbin/nologin\n"))},
			{Dir("bin", 0o755), File("bin/app", 0o755, []byte("ELF app"))},
		},
		Config:       Config{User: "65532:65532", Entrypoint: []string{"/bin/app"}, Env: []string{"PATH=/bin"}, WorkingDir: "/", Labels: map[string]string{"k": "v"}},
		Architecture: "amd64",
	}
	for _, tc := range []struct {
		name      string
		gzip      bool
		layerType string
	}{
		{"plain layers", false, MediaTypeLayer},
		{"gzip layers", true, MediaTypeLayerGzip},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := spec
			spec.Gzip = tc.gzip
			const ref = "registry.example.com/x/app@sha256:0"
			bl, err := Build(spec)
			if err != nil {
				t.Fatal(err)
			}
			b, err := bl.Archive(ref)
			if err != nil {
				t.Fatal(err)
			}
			hs, files := readTar(t, b)
			var names []string
			for _, h := range hs {
				names = append(names, h.Name)
				if h.ModTime != 0 || h.UID != 0 || h.GID != 0 || h.Uname != "" {
					t.Errorf("%s: time %d, owner %d:%d %q", h.Name, h.ModTime, h.UID, h.GID, h.Uname)
				}
			}
			wantNames := []string{"blobs/", "blobs/sha256/"}
			for _, d := range sortedDigests(bl) {
				wantNames = append(wantNames, "blobs/sha256/"+d[len("sha256:"):])
			}
			wantNames = append(wantNames, "index.json", "oci-layout")
			if diff := cmp.Diff(wantNames, names); diff != "" {
				t.Errorf("entries (-want +got):\n%s", diff)
			}
			if got := string(files["oci-layout"]); got != `{"imageLayoutVersion":"1.0.0"}` {
				t.Errorf("oci-layout: %s", got)
			}
			blob := func(d Descriptor) []byte {
				t.Helper()
				b, ok := files[BlobPath(d)]
				if !ok {
					t.Fatalf("no blob %s", d.Digest)
				}
				if digestOf(b) != d.Digest || int64(len(b)) != d.Size {
					t.Fatalf("blob %s: digest %s, size %d, descriptor's size %d", d.Digest, digestOf(b), len(b), d.Size)
				}
				return b
			}
			var index map[string]any
			mustUnmarshal(t, files["index.json"], &index)
			wantIndex := map[string]any{
				"schemaVersion": 2.0,
				"mediaType":     MediaTypeIndex,
				"manifests": []any{map[string]any{
					"mediaType":   MediaTypeManifest,
					"digest":      bl.Manifest.Digest,
					"size":        float64(bl.Manifest.Size),
					"annotations": map[string]any{AnnotationRefName: ref, AnnotationContainerName: ref},
					"platform":    map[string]any{"architecture": "amd64", "os": "linux"},
				}},
			}
			if diff := cmp.Diff(wantIndex, index); diff != "" {
				t.Errorf("index.json (-want +got):\n%s", diff)
			}
			var manifest map[string]any
			mustUnmarshal(t, blob(bl.Manifest), &manifest)
			desc := func(d Descriptor) map[string]any {
				return map[string]any{"mediaType": d.MediaType, "digest": d.Digest, "size": float64(d.Size)}
			}
			wantManifest := map[string]any{
				"schemaVersion": 2.0,
				"mediaType":     MediaTypeManifest,
				"config":        desc(bl.Config),
				"layers":        []any{desc(bl.Layers[0]), desc(bl.Layers[1])},
			}
			if diff := cmp.Diff(wantManifest, manifest); diff != "" {
				t.Errorf("manifest (-want +got):\n%s", diff)
			}
			var diffIDs []any
			for i, l := range bl.Layers {
				if l.MediaType != tc.layerType {
					t.Errorf("layer %d: media type %s, want %s", i, l.MediaType, tc.layerType)
				}
				raw := blob(l)
				if tc.gzip {
					zr, err := gzip.NewReader(bytes.NewReader(raw))
					if err != nil {
						t.Fatal(err)
					}
					if raw, err = io.ReadAll(zr); err != nil {
						t.Fatal(err)
					}
				}
				want, _ := LayerTar(spec.Layers[i])
				if !bytes.Equal(raw, want) {
					t.Errorf("layer %d: not its entries' tar", i)
				}
				diffIDs = append(diffIDs, digestOf(raw))
			}
			var config map[string]any
			mustUnmarshal(t, blob(bl.Config), &config)
			wantConfig := map[string]any{
				"created":      "1970-01-01T00:00:00Z",
				"architecture": "amd64",
				"os":           "linux",
				"config": map[string]any{
					"User": "65532:65532", "Entrypoint": []any{"/bin/app"}, "Env": []any{"PATH=/bin"},
					"WorkingDir": "/", "Labels": map[string]any{"k": "v"},
				},
				"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
			}
			if diff := cmp.Diff(wantConfig, config); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
			again, _ := Build(spec)
			if b2, _ := again.Archive(ref); !bytes.Equal(b, b2) {
				t.Error("a second archive of the same image differs")
			}
		})
	}
}

// sortedDigests are the blobs' digests in the archive's order (by name:
// blobs/sha256/<hex>).
func sortedDigests(bl *Blobs) []string {
	return slices.Sorted(maps.Keys(bl.Data))
}

func mustUnmarshal(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
}

// TestWriteArchiveByDigest: the file holds the archive naming the image by
// its own manifest's digest, and no temporary file is left.
func TestWriteArchiveByDigest(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "x.tar")
	spec := Spec{Layers: [][]Entry{{Dir("etc", 0o755)}}, Architecture: "arm64", Gzip: true}
	d, err := WriteArchiveByDigest(file, spec, "registry.example.com/x")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	bl, _ := Build(spec)
	want, _ := bl.Archive("registry.example.com/x@" + bl.Manifest.Digest)
	if !bytes.Equal(b, want) || d.Digest != bl.Manifest.Digest {
		t.Errorf("archive of %s differs from Build's, or descriptor %+v", d.Digest, d)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d files in %s, want only x.tar", len(ents), dir)
	}
	if _, err := WriteArchiveByDigest(filepath.Join(dir, "no", "x.tar"), spec, "r/x"); err == nil {
		t.Error("writing into a missing directory: no error")
	}
}
