package testenv

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/ociimage"
)

// TestWritePauseImage reads the archive back as `ctr images import` does:
// index.json names the manifest and the image, every blob is stored under
// its own digest, the config's diff_id is the layer's digest, and the layer
// holds busybox, its links and the entrypoint's shell.
func TestWritePauseImage(t *testing.T) {
	dir := t.TempDir()
	busybox := []byte("\x7fELF not really busybox")
	if err := os.WriteFile(filepath.Join(dir, "busybox"), busybox, 0o755); err != nil {
		t.Fatal(err)
	}
	const ref = "localhost/sandboxstats/pause:test"
	archive := filepath.Join(dir, "pause.tar")
	if err := WritePauseImage(archive, filepath.Join(dir, "busybox"), ref); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	files := untar(t, b)
	if got := string(files["oci-layout"]); got != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout: %q", got)
	}
	blob := func(d ociimage.Descriptor) []byte {
		t.Helper()
		b, ok := files[ociimage.BlobPath(d)]
		if !ok {
			t.Fatalf("no blob %s", d.Digest)
		}
		if sum := sha256.Sum256(b); "sha256:"+hex.EncodeToString(sum[:]) != d.Digest || int64(len(b)) != d.Size {
			t.Fatalf("blob %s: digest or size %d does not match", d.Digest, d.Size)
		}
		return b
	}
	var index struct {
		Manifests []ociimage.Descriptor `json:"manifests"`
	}
	mustUnmarshal(t, files["index.json"], &index)
	if len(index.Manifests) != 1 {
		t.Fatalf("index.json: %d manifests", len(index.Manifests))
	}
	m := index.Manifests[0]
	if m.MediaType != ociimage.MediaTypeManifest || m.Annotations["org.opencontainers.image.ref.name"] != ref || m.Annotations["io.containerd.image.name"] != ref {
		t.Errorf("index.json manifest: %+v", m)
	}
	var manifest struct {
		Config ociimage.Descriptor   `json:"config"`
		Layers []ociimage.Descriptor `json:"layers"`
	}
	mustUnmarshal(t, blob(m), &manifest)
	if len(manifest.Layers) != 1 || manifest.Layers[0].MediaType != ociimage.MediaTypeLayer || manifest.Config.MediaType != ociimage.MediaTypeConfig {
		t.Fatalf("manifest: %+v", manifest)
	}
	var config struct {
		Config struct {
			Entrypoint []string `json:"Entrypoint"`
		} `json:"config"`
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	mustUnmarshal(t, blob(manifest.Config), &config)
	if diff := cmp.Diff(PauseEntrypoint, config.Config.Entrypoint); diff != "" {
		t.Errorf("entrypoint (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{manifest.Layers[0].Digest}, config.RootFS.DiffIDs); diff != "" {
		t.Errorf("diff_ids (-want +got):\n%s", diff)
	}
	layer := untar(t, blob(manifest.Layers[0]))
	if !bytes.Equal(layer["bin/busybox"], busybox) {
		t.Errorf("layer bin/busybox: %q", layer["bin/busybox"])
	}
	for _, l := range []string{"bin/sh", "bin/sleep"} {
		if got := string(layer[l]); got != "-> busybox" {
			t.Errorf("layer %s: %q, want a link to busybox", l, got)
		}
	}
}

// untar returns each entry of a tar: a file's content, "-> target" for a
// link, nothing for a directory.
func untar(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeReg:
			files[h.Name], err = io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
		case tar.TypeSymlink:
			files[h.Name] = []byte("-> " + h.Linkname)
		default:
			files[h.Name] = nil
		}
	}
}

func mustUnmarshal(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
}
