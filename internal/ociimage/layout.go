package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
	"time"
)

// The media types of an OCI image.
const (
	MediaTypeManifest  = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig    = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer     = "application/vnd.oci.image.layer.v1.tar"
	MediaTypeLayerGzip = "application/vnd.oci.image.layer.v1.tar+gzip"
	MediaTypeIndex     = "application/vnd.oci.image.index.v1+json"
)

// The index annotations that name an image: the OCI layout's ref.name
// (skopeo, oras) and containerd's image.name (ctr images import names the
// image it creates after it).
const (
	AnnotationRefName       = "org.opencontainers.image.ref.name"
	AnnotationContainerName = "io.containerd.image.name"
)

// ErrLayout is wrapped by every error of a malformed layer or image.
var ErrLayout = errors.New("ociimage: invalid image")

// epoch is every time an archive holds.
var epoch = time.Unix(0, 0).UTC()

// Descriptor is an OCI content descriptor.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *Platform         `json:"platform,omitempty"`
}

// Platform is a descriptor's platform in an index.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Describe returns the descriptor of b (its sha256 digest and size).
func Describe(mediaType string, b []byte) Descriptor {
	sum := sha256.Sum256(b)
	return Descriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(b))}
}

// BlobPath is where the blob of d lies in a layout: blobs/sha256/<hex>.
func BlobPath(d Descriptor) string {
	return "blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:")
}

// Entry is one file of a layer.
type Entry struct {
	Name     string // path in the image, relative ("etc/passwd"), no trailing slash
	Type     byte   // tar.TypeDir, tar.TypeReg or tar.TypeSymlink
	Mode     int64  // permission bits (with sticky, setuid: 0o1777)
	UID, GID int
	Data     []byte // a regular file's contents
	Linkname string // a symlink's target
}

// Dir, File and Symlink are the entries of a layer, owned by root.
func Dir(name string, mode int64) Entry { return Entry{Name: name, Type: tar.TypeDir, Mode: mode} }

// File is a regular file owned by root.
func File(name string, mode int64, data []byte) Entry {
	return Entry{Name: name, Type: tar.TypeReg, Mode: mode, Data: data}
}

// Symlink is a symbolic link owned by root.
func Symlink(name, target string) Entry {
	return Entry{Name: name, Type: tar.TypeSymlink, Mode: 0o777, Linkname: target}
}

// LayerTar returns the tar of entries, sorted by name (a directory before
// what it holds), every time the Unix epoch, no user or group names, in
// USTAR format. Names must be relative and clean, each once; every parent
// directory must be an entry too.
func LayerTar(entries []Entry) ([]byte, error) {
	es := slices.Clone(entries)
	slices.SortFunc(es, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	dirs := map[string]bool{".": true}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for i, e := range es {
		if e.Name == "" || path.IsAbs(e.Name) || path.Clean(e.Name) != e.Name || strings.HasPrefix(e.Name, "../") || e.Name == ".." {
			return nil, fmt.Errorf("%w: entry name %q: not a clean relative path", ErrLayout, e.Name)
		}
		if i > 0 && es[i-1].Name == e.Name {
			return nil, fmt.Errorf("%w: entry %q twice", ErrLayout, e.Name)
		}
		if !dirs[path.Dir(e.Name)] {
			return nil, fmt.Errorf("%w: entry %q: no entry for its directory %q", ErrLayout, e.Name, path.Dir(e.Name))
		}
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Uid: e.UID, Gid: e.GID, ModTime: epoch, Format: tar.FormatUSTAR}
		switch e.Type {
		case tar.TypeDir:
			h.Name += "/"
			dirs[e.Name] = true
		case tar.TypeReg:
			h.Size = int64(len(e.Data))
		case tar.TypeSymlink:
			h.Linkname = e.Linkname
		default:
			return nil, fmt.Errorf("%w: entry %q: type %q", ErrLayout, e.Name, e.Type)
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("%w: entry %q: %w", ErrLayout, e.Name, err)
		}
		if _, err := tw.Write(e.Data); err != nil {
			return nil, fmt.Errorf("%w: entry %q: %w", ErrLayout, e.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Gzip compresses a layer reproducibly: no name, no time in the header
// (compress/gzip's output is fixed for a given Go release).
func Gzip(b []byte) ([]byte, error) {
	var out bytes.Buffer
	zw, err := gzip.NewWriterLevel(&out, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// Config is an image's runtime configuration (the config's "config").
type Config struct {
	User       string            `json:"User,omitempty"`
	Env        []string          `json:"Env,omitempty"`
	Entrypoint []string          `json:"Entrypoint,omitempty"`
	Cmd        []string          `json:"Cmd,omitempty"`
	WorkingDir string            `json:"WorkingDir,omitempty"`
	Labels     map[string]string `json:"Labels,omitempty"`
}

// Spec is what WriteArchive writes: layers of entries, the runtime
// configuration and the platform.
type Spec struct {
	Layers       [][]Entry
	Config       Config
	Architecture string // GOARCH spelling: amd64, arm64
	// Gzip compresses the layers (what a registry is pushed); else they are
	// stored as plain tar.
	Gzip bool
}

// imageConfig is the config blob.
type imageConfig struct {
	Created      string `json:"created"`
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       Config `json:"config"`
	RootFS       struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// manifest is the image manifest blob.
type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// index is index.json.
type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// ociLayout is the oci-layout file's contents.
const ociLayout = `{"imageLayoutVersion":"1.0.0"}`

// Blobs is an image's content: its manifest's descriptor and every blob by
// digest.
type Blobs struct {
	Manifest Descriptor
	Config   Descriptor
	Layers   []Descriptor
	Data     map[string][]byte // by digest
}

// Build makes the blobs of img.
func Build(img Spec) (*Blobs, error) {
	bl := &Blobs{Data: map[string][]byte{}}
	var cfg imageConfig
	cfg.Created = epoch.Format(time.RFC3339)
	cfg.Architecture, cfg.OS, cfg.Config = img.Architecture, "linux", img.Config
	cfg.RootFS.Type = "layers"
	cfg.RootFS.DiffIDs = []string{}
	for i, entries := range img.Layers {
		raw, err := LayerTar(entries)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, Describe(MediaTypeLayer, raw).Digest)
		blob, mt := raw, MediaTypeLayer
		if img.Gzip {
			if blob, err = Gzip(raw); err != nil {
				return nil, fmt.Errorf("layer %d: %w", i, err)
			}
			mt = MediaTypeLayerGzip
		}
		d := Describe(mt, blob)
		bl.Layers = append(bl.Layers, d)
		bl.Data[d.Digest] = blob
	}
	cb, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	bl.Config = Describe(MediaTypeConfig, cb)
	bl.Data[bl.Config.Digest] = cb
	mb, err := json.Marshal(manifest{SchemaVersion: 2, MediaType: MediaTypeManifest, Config: bl.Config, Layers: slices.Concat([]Descriptor{}, bl.Layers)})
	if err != nil {
		return nil, err
	}
	bl.Manifest = Describe(MediaTypeManifest, mb)
	bl.Manifest.Platform = &Platform{Architecture: img.Architecture, OS: "linux"}
	bl.Data[bl.Manifest.Digest] = mb
	return bl, nil
}

// Index makes an image index of imgs (each a manifest with its platform,
// in the order given) holding all their blobs: its Manifest is the
// index's descriptor, its Config and Layers empty. A runtime that pulls or
// imports it by the index's digest picks the manifest of its platform.
func Index(imgs ...*Blobs) (*Blobs, error) {
	ix := &Blobs{Data: map[string][]byte{}}
	var ms []Descriptor
	for _, img := range imgs {
		if img.Manifest.MediaType != MediaTypeManifest || img.Manifest.Platform == nil {
			return nil, fmt.Errorf("%w: index entry %s: not a manifest with a platform", ErrLayout, img.Manifest.Digest)
		}
		ms = append(ms, img.Manifest)
		for dg, b := range img.Data {
			ix.Data[dg] = b
		}
	}
	ib, err := json.Marshal(index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: slices.Concat([]Descriptor{}, ms)})
	if err != nil {
		return nil, err
	}
	ix.Manifest = Describe(MediaTypeIndex, ib)
	ix.Data[ix.Manifest.Digest] = ib
	return ix, nil
}

// Archive returns the OCI image layout of bl as a tar, its index naming the
// manifest ref (under both AnnotationRefName and AnnotationContainerName);
// entries sorted, every time the Unix epoch.
func (bl *Blobs) Archive(ref string) ([]byte, error) {
	desc := bl.Manifest
	desc.Annotations = map[string]string{AnnotationRefName: ref, AnnotationContainerName: ref}
	ib, err := json.Marshal(index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{desc}})
	if err != nil {
		return nil, err
	}
	entries := []Entry{
		Dir("blobs", 0o755), Dir("blobs/sha256", 0o755),
		File("oci-layout", 0o644, []byte(ociLayout)),
		File("index.json", 0o644, ib),
	}
	for dg, b := range bl.Data {
		entries = append(entries, File(BlobPath(Descriptor{Digest: dg}), 0o644, b))
	}
	return LayerTar(entries)
}

// WriteArchive writes img to file as an OCI image layout in a tar, named
// ref in its index (a full reference: registry.example.com/x/y:tag). It
// returns the manifest's descriptor. The file is written whole or not at
// all.
func WriteArchive(file string, img Spec, ref string) (Descriptor, error) {
	return writeArchive(file, img, func(string) string { return ref })
}

// WriteArchiveByDigest is WriteArchive naming the image repo@<its manifest
// digest>, the reference a kustomization's digest resolves to.
func WriteArchiveByDigest(file string, img Spec, repo string) (Descriptor, error) {
	return writeArchive(file, img, func(digest string) string { return repo + "@" + digest })
}

// WriteIndexArchiveByDigest writes the images of imgs, one per platform,
// as an image index (Index) to file, named repo@<the index's digest> in
// the layout's index.json. It returns the index's descriptor.
func WriteIndexArchiveByDigest(file string, imgs []Spec, repo string) (Descriptor, error) {
	var bls []*Blobs
	for _, img := range imgs {
		bl, err := Build(img)
		if err != nil {
			return Descriptor{}, fmt.Errorf("image %s (%s): %w", file, img.Architecture, err)
		}
		bls = append(bls, bl)
	}
	ix, err := Index(bls...)
	if err != nil {
		return Descriptor{}, fmt.Errorf("image %s: %w", file, err)
	}
	return writeBlobs(file, ix, repo+"@"+ix.Manifest.Digest)
}

// writeArchive writes img named ref(its manifest's digest).
func writeArchive(file string, img Spec, ref func(digest string) string) (Descriptor, error) {
	bl, err := Build(img)
	if err != nil {
		return Descriptor{}, fmt.Errorf("image %s: %w", file, err)
	}
	return writeBlobs(file, bl, ref(bl.Manifest.Digest))
}

// writeBlobs writes bl's archive, named ref, to file.
func writeBlobs(file string, bl *Blobs, ref string) (Descriptor, error) {
	b, err := bl.Archive(ref)
	if err != nil {
		return Descriptor{}, fmt.Errorf("image %s: %w", file, err)
	}
	if err := writeFileAtomic(file, b); err != nil {
		return Descriptor{}, err
	}
	return bl.Manifest, nil
}

func writeFileAtomic(file string, b []byte) error {
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("image %s: %w", file, err)
	}
	if err := os.Rename(tmp, file); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("image %s: %w", file, err)
	}
	return nil
}
