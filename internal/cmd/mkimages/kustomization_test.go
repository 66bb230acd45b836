package main

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/ociimage"
)

func TestSetImages(t *testing.T) {
	imgs := []ociimage.Image{
		{Name: "statsd", Repo: "r/statsd", Digest: "sha256:aa"},
		{Name: "otelcol", Repo: "r/otelcol", Digest: "sha256:bb"},
	}
	block := "images:\n" + imagesComment +
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
		})
	}
}
