// Package ociimage writes OCI image layouts as tar archives (what
// `ctr images import` and `skopeo copy oci-archive:` read), reproducibly:
// the same inputs give the same bytes, so the same digests. Layers are built
// from a list of Entries (sorted, every time the Unix epoch, uid, gid and
// mode as given); WriteArchive writes one image and names it in the
// layout's index.
//
// BuildProjectImages builds the project's images (statsd with statsctl,
// statsagent, statsnri and the e2e/otelcol Collector) from a source tree:
// `make images` runs it through internal/cmd/mkimages, the end-to-end tests
// call it directly.
//
//	imgs, err := ociimage.BuildProjectImages(ctx, repoRoot, outDir)
//	// imgs[i].Path is an archive; imgs[i].Ref names it by digest.
package ociimage
