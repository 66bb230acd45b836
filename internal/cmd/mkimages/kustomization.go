package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/ociimage"
)

// errNoImages: the kustomization has no top-level images: block.
var errNoImages = errors.New("no top-level images: block")

// imagesComment heads the images: block setImages writes.
const imagesComment = `  # Written by make images (internal/cmd/mkimages): the images this tree
  # builds, named by digest; make images-check fails when they differ.
`

// setImages returns the kustomization with its top-level images: block
// (the key's line and every indented, list or blank line after it)
// replaced by one entry per image: name (what the DaemonSet's image: says),
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
	for _, img := range imgs {
		fmt.Fprintf(&b, "  - name: %s\n    newName: %s\n    digest: %s\n", img.Name, img.Repo, img.Digest)
	}
	return []byte(strings.Join(lines[:start], "") + b.String() + strings.Join(lines[end:], "")), nil
}
