// Command mkimages builds the project's images (`make images`,
// `make images-check`): OCI image layouts as tars under -out, one per image,
// each an index of linux/amd64 and linux/arm64
// (internal/ociimage.BuildProjectImages), and writes their digests and the
// Go release that built them into the kustomization's images: block, or
// with -check fails when the committed digests differ from the ones just
// built (first, without building, when the go on PATH is another release
// than the recorded one: saying so). Run from the repository's root.
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
	old, err := os.ReadFile(*kust)
	if err != nil {
		return err
	}
	if *check {
		goVersion, err := ociimage.GoVersion(ctx)
		if err != nil {
			return err
		}
		if err := sameGo(recordedGo(old), goVersion); err != nil {
			return fmt.Errorf("%s: %w", *kust, err)
		}
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

// errStale: the kustomization's digests are not what this tree builds.
var errStale = errors.New("stale image digests")

// errOtherGo: the go command is not the release the digests were made with.
var errOtherGo = errors.New("another Go release")

// sameGo fails, saying both, when the kustomization's digests were made
// with another Go release than the go command's (the binaries embed it, so
// the digests would differ for that reason alone).
func sameGo(recorded, goVersion string) error {
	if recorded == "" || recorded == goVersion {
		return nil
	}
	return fmt.Errorf("%w: the committed digests are %s's; this is %s (the go on PATH): run make images-check with %s, or make images with this Go and commit it", errOtherGo, recorded, goVersion, recorded)
}
