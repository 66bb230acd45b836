package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/ociimage"
)

func TestSetImages(t *testing.T) {
	imgs := []ociimage.Image{
		{Name: "statsd", Repo: "r/statsd", Digest: "sha256:aa", Go: "go1.26.8"},
		{Name: "otelcol", Repo: "r/otelcol", Digest: "sha256:bb", Go: "go1.26.8"},
	}
	block := "images:\n" + imagesComment + "  # Built by go1.26.8.\n" +
		"  - name: statsd\n    newName: r/statsd\n    digest: sha256:aa\n" +
		"  - name: otelcol\n    newName: r/otelcol\n    digest: sha256:bb\n"
	for _, tc := range []struct {
		name, in, want string
		err            error
	}{{
		name: "tags become digests",
		in:   "# c\nresources:\n  - a.yaml\nimages:\n  - name: statsd\n    newName: r/statsd\n    newTag: latest\n",
		want: "# c\nresources:\n  - a.yaml\n" + block,
	}, {
		name: "a block before other keys",
		in:   "images:\n- name: x\n  newTag: v1\n\nlabels:\n  - pairs: {a: b}\n",
		want: block + "labels:\n  - pairs: {a: b}\n",
	}, {
		name: "what it wrote is kept",
		in:   "kind: Kustomization\n" + block,
		want: "kind: Kustomization\n" + block,
	}, {
		name: "no images block",
		in:   "resources:\n  - a.yaml\n  # images:\n",
		err:  errNoImages,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := setImages([]byte(tc.in), imgs)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if diff := cmp.Diff(tc.want, string(got)); err == nil && diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if err == nil && recordedGo(got) != "go1.26.8" {
				t.Errorf("recordedGo of what setImages wrote: %q", recordedGo(got))
			}
		})
	}
}

// TestSameGo: images-check with another Go than the digests' says which
// two, plainly, instead of "stale".
func TestSameGo(t *testing.T) {
	for _, tc := range []struct {
		recorded, goVersion string
		err                 error
		msg                 string
	}{
		{"go1.26.8", "go1.26.8", nil, ""},
		{"", "go1.27.0", nil, ""}, // a kustomization from before the record
		{"go1.26.8", "go1.27.0", errOtherGo, "the committed digests are go1.26.8's; this is go1.27.0"},
	} {
		t.Run(tc.recorded+"/"+tc.goVersion, func(t *testing.T) {
			err := sameGo(tc.recorded, tc.goVersion)
			if !errors.Is(err, tc.err) || err != nil && !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("sameGo(%q, %q) = %v, want %v saying %q", tc.recorded, tc.goVersion, err, tc.err, tc.msg)
			}
		})
	}
}

// TestKustomizationGoIsDockerfiles: the Go release the committed digests
// were made with is the Dockerfile's build stage's.
func TestKustomizationGoIsDockerfiles(t *testing.T) {
	kust, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "kubernetes", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	df, err := os.ReadFile(filepath.Join("..", "..", "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	rec := recordedGo(kust)
	if rec == "" || !strings.Contains(string(df), "\nARG GO_VERSION="+strings.TrimPrefix(rec, "go")+"\n") {
		t.Errorf("kustomization.yaml records Go %q; the Dockerfile builds with another (ARG GO_VERSION=)", rec)
	}
}
