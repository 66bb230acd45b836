package testenv

import (
	"fmt"
	"os"
	"runtime"

	"github.com/sandboxstats/sandboxstats/internal/ociimage"
)

// PauseEntrypoint is the pause image's entrypoint: a shell that sleeps until
// SIGTERM and then exits 0 (as PID 1 of its namespace it would ignore a
// signal it has no handler for; the sleep runs in the background so that
// the trap runs at once).
var PauseEntrypoint = []string{"/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"}

// WritePauseImage writes to path an OCI image layout as a tar archive (what
// `ctr images import` reads; internal/ociimage writes it): one uncompressed
// layer holding busybox (the static binary at busybox) as /bin/busybox with
// /bin/sh and /bin/sleep linked to it, PauseEntrypoint as its entrypoint,
// and ref (a full image reference, e.g. localhost/sandboxstats/pause:test)
// as the name in its index, under both the OCI ref.name and containerd's
// image.name annotations. The archive is reproducible: every time is the
// Unix epoch.
func WritePauseImage(path, busybox, ref string) error {
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return fmt.Errorf("pause image: %w", err)
	}
	if _, err := ociimage.WriteArchive(path, pauseImage(bb), ref); err != nil {
		return fmt.Errorf("pause image: %w", err)
	}
	return nil
}

// pauseImage is the pause image: the directories a container's root needs,
// busybox and its two links.
func pauseImage(busybox []byte) ociimage.Spec {
	layer := []ociimage.Entry{
		ociimage.File("bin/busybox", 0o755, busybox),
		ociimage.Symlink("bin/sh", "busybox"),
		ociimage.Symlink("bin/sleep", "busybox"),
		ociimage.Dir("tmp", 0o1777),
	}
	for _, d := range []string{"bin", "dev", "etc", "proc", "sys"} {
		layer = append(layer, ociimage.Dir(d, 0o755))
	}
	return ociimage.Spec{
		Layers:       [][]ociimage.Entry{layer},
		Config:       ociimage.Config{Entrypoint: PauseEntrypoint, Env: []string{"PATH=/bin"}, WorkingDir: "/"},
		Architecture: runtime.GOARCH,
	}
}
