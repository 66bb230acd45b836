package e2e

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/ociimage"
)

// projectImages holds the images `make images` builds, built once per e2e
// process (TestIntegrationImagesByDigest and TestIntegrationK8sDaemonSet
// import the same archives): about 15 to 30 s a build.
var projectImages struct {
	sync.Mutex
	dir  string
	imgs []ociimage.Image
}

// buildProjectImages returns the project's images (both platforms), built
// into a directory that removeProjectImages deletes when the e2e process
// ends. A failed build is not kept: the next caller builds again.
func buildProjectImages(t *testing.T) []ociimage.Image {
	t.Helper()
	projectImages.Lock()
	defer projectImages.Unlock()
	if projectImages.imgs != nil {
		t.Logf("the project's %d images, built earlier in this process", len(projectImages.imgs))
		return projectImages.imgs
	}
	dir, err := os.MkdirTemp("", "sandboxstats-images-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	imgs, err := ociimage.BuildProjectImages(ctx, "..", dir)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	t.Logf("built %d images in %v", len(imgs), time.Since(start).Round(time.Millisecond))
	projectImages.dir, projectImages.imgs = dir, imgs
	return imgs
}

// removeProjectImages deletes what buildProjectImages built.
func removeProjectImages() {
	projectImages.Lock()
	defer projectImages.Unlock()
	if projectImages.dir != "" {
		os.RemoveAll(projectImages.dir)
	}
	projectImages.dir, projectImages.imgs = "", nil
}

// TestMain removes the images built for the process's tests once they ran.
func TestMain(m *testing.M) {
	code := m.Run()
	removeProjectImages()
	os.Exit(code)
}
