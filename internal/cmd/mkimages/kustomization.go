package main

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/ociimage"
)

// errNoImages: the kustomization has no top-level images: block.
var errNoImages = errors.New("no top-level images: block")

// imagesComment heads the images: block setImages writes; goLine (with
// the Go release) follows it.
const imagesComment = `  # Written by make images (internal/cmd/mkimages): the images this tree
  # builds, each an index of linux/amd64 and linux/arm64, named by its
  # digest; make images-check fails when they differ. The binaries embed
  # the Go release that built them: another release builds other digests.
`

// goLine is the images: block's line that records the Go release.
const goLine = "  # Built by %s.\n"

// goLineRE finds goLine in a kustomization.
var goLineRE = regexp.MustCompile(`(?m)^  # Built by (go[^\s]+)\.$`)

// recordedGo is the Go release the kustomization's digests were made with
// ("" if it records none).
func recordedGo(kust []byte) string {
	if m := goLineRE.FindSubmatch(kust); m != nil {
		return string(m[1])
	}
	return ""
}

// setImages returns the kustomization with its top-level images: block
// (the key's line and every indented, list or blank line after it)
// replaced by one entry per image (the Go release that built them first):
// name (what the DaemonSet's image: says),
// newName (its repository) and digest.
func setImages(kust []byte, imgs []ociimage.Image) ([]byte, error) {
	lines := strings.SplitAfter(string(kust), "\n")
	start := -1
	for i, l := range lines {
		if strings.TrimRight(l, " \r\n") == "images:" {
			start = i
			break
		}
	}
	if start < 0 {
		return nil, errNoImages
	}
	end := start + 1
	for end < len(lines) {
		l := lines[end]
		if l == "" || !(strings.HasPrefix(l, " ") || strings.HasPrefix(l, "-") || strings.TrimSpace(l) == "") {
			break
		}
		end++
	}
	var b strings.Builder
	b.WriteString("images:\n")
	b.WriteString(imagesComment)
	if len(imgs) > 0 {
		fmt.Fprintf(&b, goLine, imgs[0].Go)
	}
	for _, img := range imgs {
		fmt.Fprintf(&b, "  - name: %s\n    newName: %s\n    digest: %s\n", img.Name, img.Repo, img.Digest)
	}
	return []byte(strings.Join(lines[:start], "") + b.String() + strings.Join(lines[end:], "")), nil
}
