package kubernetes_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	kustypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// TestImagesOverlayKeepsDigests is what deploy/README.md ("Images") tells an
// operator who pushed the archives to another registry: an overlay that
// renames the images (newName only) keeps the digests make images wrote, so
// every container still runs exactly the image this commit built.
func TestImagesOverlayKeepsDigests(t *testing.T) {
	base, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	k := only[*kustypes.Kustomization](t, objects(t), "kustomization.yaml")
	overlay := t.TempDir()
	rel, err := filepath.Rel(overlay, base)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("resources:\n  - " + rel + "\nimages:\n")
	want := map[string]bool{}
	for _, img := range k.Images {
		if img.Digest == "" || img.NewTag != "" {
			t.Errorf("image %s: digest %q, newTag %q: want a digest only (make images)", img.Name, img.Digest, img.NewTag)
		}
		moved := strings.Replace(img.NewName, "registry.example.com/", "mirror.example.org/", 1)
		b.WriteString("  - name: " + img.NewName + "\n    newName: " + moved + "\n")
		want[moved+"@"+img.Digest] = true
	}
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		t.Fatalf("kustomize build of an overlay: %v", err)
	}
	out, err := rm.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, doc := range documents(out) {
		obj, err := decodeStrict(doc)
		if err != nil {
			t.Fatal(err)
		}
		ds, ok := obj.(*appsv1.DaemonSet)
		if !ok {
			continue
		}
		for _, c := range slices.Concat(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers) {
			seen++
			if !want[c.Image] {
				t.Errorf("%s: image %q after the overlay, want one of %v", c.Name, c.Image, want)
			}
		}
	}
	if seen == 0 {
		t.Error("no DaemonSet containers built")
	}
}
