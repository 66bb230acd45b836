package testenv

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"
)

// PauseEntrypoint is the pause image's entrypoint: a shell that sleeps until
// SIGTERM and then exits 0 (as PID 1 of its namespace it would ignore a
// signal it has no handler for; the sleep runs in the background so that
// the trap runs at once).
var PauseEntrypoint = []string{"/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"}

// ociDescriptor is an OCI content descriptor.
type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// The media types of an OCI image.
const (
	ociManifestType = "application/vnd.oci.image.manifest.v1+json"
	ociConfigType   = "application/vnd.oci.image.config.v1+json"
	ociLayerType    = "application/vnd.oci.image.layer.v1.tar"
	ociIndexType    = "application/vnd.oci.image.index.v1+json"
)

// WritePauseImage writes to path an OCI image layout as a tar archive (what
// `ctr images import` reads): one uncompressed layer holding busybox (the
// static binary at busybox) as /bin/busybox with /bin/sh and /bin/sleep
// linked to it, PauseEntrypoint as its entrypoint, and ref (a full image
// reference, e.g. localhost/sandboxstats/pause:test) as the name in its
// index, under both the OCI ref.name and containerd's image.name
// annotations. The archive is reproducible: every time is the Unix epoch.
func WritePauseImage(path, busybox, ref string) error {
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return fmt.Errorf("pause image: %w", err)
	}
	layer, err := pauseLayer(bb)
	if err != nil {
		return fmt.Errorf("pause image layer: %w", err)
	}
	layerDesc := describe(ociLayerType, layer)
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"Entrypoint": PauseEntrypoint,
			"Env":        []string{"PATH=/bin"},
			"WorkingDir": "/",
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	})
	if err != nil {
		return fmt.Errorf("pause image config: %w", err)
	}
	configDesc := describe(ociConfigType, config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     ociManifestType,
		"config":        configDesc,
		"layers":        []ociDescriptor{layerDesc},
	})
	if err != nil {
		return fmt.Errorf("pause image manifest: %w", err)
	}
	manifestDesc := describe(ociManifestType, manifest)
	manifestDesc.Annotations = map[string]string{
		"org.opencontainers.image.ref.name": ref,
		"io.containerd.image.name":          ref,
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     ociIndexType,
		"manifests":     []ociDescriptor{manifestDesc},
	})
	if err != nil {
		return fmt.Errorf("pause image index: %w", err)
	}

	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(layerDesc), layer},
		{blobPath(configDesc), config},
		{blobPath(manifestDesc), manifest},
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
			return fmt.Errorf("pause image archive: %w", err)
		}
	}
	for _, f := range files {
		if err := writeTarFile(tw, f.name, 0o644, f.data); err != nil {
			return fmt.Errorf("pause image archive: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("pause image archive: %w", err)
	}
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		return fmt.Errorf("pause image: %w", err)
	}
	return nil
}

// pauseLayer is the layer's tar: the directories a container's root needs,
// busybox and its two links.
func pauseLayer(busybox []byte) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, d := range []string{"bin/", "dev/", "etc/", "proc/", "sys/", "tmp/"} {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode, ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
	}
	if err := writeTarFile(tw, "bin/busybox", 0o755, busybox); err != nil {
		return nil, err
	}
	for _, l := range []string{"bin/sh", "bin/sleep"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: l, Linkname: "busybox", Mode: 0o777, ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func writeTarFile(tw *tar.Writer, name string, mode int64, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
		return err
	}
	_, err := io.Copy(tw, bytes.NewReader(data))
	return err
}

func describe(mediaType string, b []byte) ociDescriptor {
	sum := sha256.Sum256(b)
	return ociDescriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(b))}
}

func blobPath(d ociDescriptor) string { return "blobs/sha256/" + d.Digest[len("sha256:"):] }
