package ociimage

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestIndex: an index lists the manifests with their platforms in the
// order given, holds every blob of them and itself, and takes nothing but
// platform manifests.
func TestIndex(t *testing.T) {
	var bls []*Blobs
	for _, arch := range []string{"amd64", "arm64"} {
		bl, err := Build(Spec{Layers: [][]Entry{{Dir("etc", 0o755)}, {File(arch, 0o644, []byte(arch))}}, Architecture: arch, Gzip: true})
		if err != nil {
			t.Fatal(err)
		}
		bls = append(bls, bl)
	}
	ix, err := Index(bls...)
	if err != nil {
		t.Fatal(err)
	}
	var got index
	mustUnmarshal(t, ix.Data[ix.Manifest.Digest], &got)
	want := index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{bls[0].Manifest, bls[1].Manifest}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("index (-want +got):\n%s", diff)
	}
	if got.Manifests[1].Platform.Architecture != "arm64" || ix.Manifest.MediaType != MediaTypeIndex || ix.Manifest.Platform != nil {
		t.Errorf("index %+v of %+v", ix.Manifest, got.Manifests)
	}
	// The base layer is the same blob in both: 2 configs, 2 manifests, 3 layers, the index.
	if len(ix.Data) != 8 {
		t.Errorf("%d blobs, want 8: %v", len(ix.Data), sortedDigests(ix))
	}
	for _, bl := range bls {
		for dg, b := range bl.Data {
			if !bytes.Equal(ix.Data[dg], b) {
				t.Errorf("blob %s missing from the index", dg)
			}
		}
	}
	if _, err := Index(ix); !errors.Is(err, ErrLayout) {
		t.Errorf("an index of an index: %v, want ErrLayout", err)
	}
}

// TestWriteIndexArchiveByDigest: the archive's index.json names the index
// (not a manifest) by its own digest.
func TestWriteIndexArchiveByDigest(t *testing.T) {
	file := filepath.Join(t.TempDir(), "x.tar")
	specs := []Spec{
		{Layers: [][]Entry{{Dir("etc", 0o755)}}, Architecture: "amd64"},
		{Layers: [][]Entry{{Dir("etc", 0o755)}}, Architecture: "arm64"},
	}
	d, err := WriteIndexArchiveByDigest(file, specs, "registry.example.com/x")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	_, files := readTar(t, b)
	var top index
	mustUnmarshal(t, files["index.json"], &top)
	ref := "registry.example.com/x@" + d.Digest
	want := []Descriptor{{MediaType: MediaTypeIndex, Digest: d.Digest, Size: d.Size, Annotations: map[string]string{AnnotationRefName: ref, AnnotationContainerName: ref}}}
	if diff := cmp.Diff(want, top.Manifests); diff != "" {
		t.Errorf("index.json (-want +got):\n%s", diff)
	}
	if _, ok := files[BlobPath(d)]; !ok {
		t.Errorf("no blob of the index %s", d.Digest)
	}
}

// TestCheckSettings: a binary built otherwise than the images' settings
// (an experiment, FIPS, a level, cgo, another arch) is refused.
func TestCheckSettings(t *testing.T) {
	base := func(arch string) []debug.BuildSetting {
		return []debug.BuildSetting{
			{Key: "-buildmode", Value: "exe"}, {Key: "-compiler", Value: "gc"}, {Key: "-trimpath", Value: "true"},
			{Key: "DefaultGODEBUG", Value: "x=1"}, {Key: "CGO_ENABLED", Value: "0"},
			{Key: "GOARCH", Value: arch}, {Key: "GOOS", Value: "linux"},
		}
	}
	with := func(s []debug.BuildSetting, more ...debug.BuildSetting) []debug.BuildSetting {
		return append(append([]debug.BuildSetting{}, s...), more...)
	}
	amd := with(base("amd64"), debug.BuildSetting{Key: "GOAMD64", Value: "v1"})
	arm := with(base("arm64"), debug.BuildSetting{Key: "GOARM64", Value: "v8.0"})
	for _, tc := range []struct {
		name     string
		settings []debug.BuildSetting
		arch     string
		ok       bool
	}{
		{"amd64", amd, "amd64", true},
		{"arm64", arm, "arm64", true},
		{"other arch", amd, "arm64", false},
		{"experiment", with(amd, debug.BuildSetting{Key: "GOEXPERIMENT", Value: "greenteagc"}), "amd64", false},
		{"fips", with(amd, debug.BuildSetting{Key: "GOFIPS140", Value: "v1.0.0"}), "amd64", false},
		{"v3", with(base("amd64"), debug.BuildSetting{Key: "GOAMD64", Value: "v3"}), "amd64", false},
		{"cgo", with(base("amd64")[:4], debug.BuildSetting{Key: "CGO_ENABLED", Value: "1"}, debug.BuildSetting{Key: "GOARCH", Value: "amd64"}, debug.BuildSetting{Key: "GOOS", Value: "linux"}, debug.BuildSetting{Key: "GOAMD64", Value: "v1"}), "amd64", false},
		{"tags", with(amd, debug.BuildSetting{Key: "-tags", Value: "x"}), "amd64", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkSettings(tc.settings, tc.arch); (err == nil) != tc.ok {
				t.Errorf("checkSettings: %v, want ok %v", err, tc.ok)
			}
		})
	}
}
