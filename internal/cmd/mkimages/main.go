// Command mkimages builds the project's images (`make images`,
// `make images-check`): OCI image layouts as tars under -out, one per image
// (internal/ociimage.BuildProjectImages), and writes their digests into the
// kustomization's images: block, or with -check fails when the committed
// digests differ from the ones just built. Run from the repository's root.
//
// A dev tool (go run by the Makefile), not a binary of the project.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/ociimage"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "mkimages:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("mkimages", flag.ContinueOnError)
	out := fs.String("out", "bin/images", "directory of the image archives (<name>.tar)")
	kust := fs.String("kustomization", "deploy/kubernetes/kustomization.yaml", "the kustomization whose images: block names the images by digest")
	check := fs.Bool("check", false, "fail when the kustomization's digests differ from the images built (write nothing into it)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	start := time.Now()
	imgs, err := ociimage.BuildProjectImages(ctx, ".", *out)
	if err != nil {
		return err
	}
	for _, img := range imgs {
		fmt.Fprintf(stdout, "%s %s\n", img.Path, img.Ref)
	}
	fmt.Fprintf(stdout, "built %d images in %v\n", len(imgs), time.Since(start).Round(time.Millisecond))
	old, err := os.ReadFile(*kust)
	if err != nil {
		return err
	}
	updated, err := setImages(old, imgs)
	if err != nil {
		return fmt.Errorf("%s: %w", *kust, err)
	}
	if *check {
		if string(updated) != string(old) {
			return fmt.Errorf("%w: %s names other digests than this tree builds: run make images and commit it", errStale, *kust)
		}
		return nil
	}
	if string(updated) == string(old) {
		return nil
	}
	return os.WriteFile(*kust, updated, 0o644)
}

var errStale = errors.New("stale image digests")
