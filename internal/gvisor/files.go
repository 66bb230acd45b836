// This file reads the files of one Sample: the per-file requests, read
// concurrently through the directory cache (retried once when the directory
// was replaced), and their required and optional values.

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// fileReq is one file a Sample reads; the reads of one Sample run
// concurrently, each bounded.
type fileReq struct {
	root      *os.Root
	dir, name string
	// optional marks a signal file: a missing one is absent, so its read
	// skips the check of the directory that a required file's read makes
	// (readOptional).
	optional bool
	b        []byte
	err      error
}

func (s *cgroupSource) readAll(ctx context.Context, reqs []*fileReq) {
	var wg sync.WaitGroup
	for _, r := range reqs[1:] {
		wg.Go(func() { r.read(ctx, s) })
	}
	reqs[0].read(ctx, s)
	wg.Wait()
}

func (r *fileReq) read(ctx context.Context, s *cgroupSource) {
	if r.optional {
		r.b, r.err = s.readOptional(ctx, r.root, r.dir, r.name)
		return
	}
	r.b, r.err = s.readFile(ctx, r.root, r.dir, r.name)
}

// optional marks reqs as signal files and returns them.
func optional(reqs ...*fileReq) []*fileReq {
	for _, r := range reqs {
		r.optional = true
	}
	return reqs
}

func (f *fileReq) path() string { return filepath.Join(display(f.root, f.dir), f.name) }

func (f *fileReq) malformed(err error) error {
	return fmt.Errorf("gvisor: %w: %s: %w", source.ErrMalformed, f.path(), err)
}

// reqUint parses a required one-number file.
func reqUint(f *fileReq) (uint64, error) {
	if errors.Is(f.err, fs.ErrNotExist) {
		return 0, fmt.Errorf("gvisor: %w: %s has no %s", source.ErrNotMeasurable, display(f.root, f.dir), f.name)
	}
	if f.err != nil {
		return 0, f.err
	}
	v, err := parseSingleUint(f.b)
	if err != nil {
		return 0, f.malformed(err)
	}
	return v, nil
}

// optUint parses an optional one-number file: ok is false when the file
// alone is missing.
func optUint(f *fileReq) (v uint64, ok bool, err error) {
	if errors.Is(f.err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if f.err != nil {
		return 0, false, f.err
	}
	if v, err = parseSingleUint(f.b); err != nil {
		return 0, false, f.malformed(err)
	}
	return v, true, nil
}

// optKeyed finds key in an optional flat keyed file: ok is false when the
// file is missing or lacks the key.
func optKeyed(f *fileReq, key string) (v uint64, ok bool, err error) {
	if errors.Is(f.err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if f.err != nil {
		return 0, false, f.err
	}
	if v, ok, err = parseKeyed(f.b, key); err != nil {
		return 0, false, f.malformed(err)
	}
	return v, ok, nil
}

// procs counts cgroup.procs into r; nil with an Absent when it is missing.
func procs(r *source.Reading, f *fileReq) error {
	if errors.Is(f.err, fs.ErrNotExist) {
		r.Absent = append(r.Absent, source.Absent{Field: "sandbox_processes", Reason: "no cgroup.procs in " + display(f.root, f.dir)})
		return nil
	}
	if f.err != nil {
		return f.err
	}
	n, err := parseProcs(f.b)
	if err != nil {
		return f.malformed(err)
	}
	r.SandboxProcesses = &n
	return nil
}

// readFile reads name in the cgroup dir of root. A missing file is reported
// as fs.ErrNotExist when the directory is there, and as errCgroupGone (with
// source.ErrNotMeasurable) when the directory is gone.
func (s *cgroupSource) readFile(ctx context.Context, root *os.Root, dir, name string) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		if b, again, err := s.readFileOnce(ctx, root, dir, name, attempt); !again {
			return b, err
		}
	}
}

// readFileOnce is one attempt of readFile; again is true when the directory
// held open was replaced by a new one, which the next attempt opens.
func (s *cgroupSource) readFileOnce(ctx context.Context, root *os.Root, dir, name string, attempt int) (b []byte, again bool, err error) {
	h, err := s.acquireDir(ctx, root, dir)
	defer s.releaseDir(h)
	var d *os.Root
	if err == nil {
		d = h.r
		if b, err = s.g.ReadRootFile(ctx, d, name); err == nil {
			return b, false, nil
		}
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, wrapRead(err)
	}
	// Is the directory still there, and still the one we hold open?
	exists, same, serr := s.dirState(ctx, root, dir, d)
	if serr != nil {
		return nil, false, wrapRead(serr)
	}
	if h != nil && !same {
		s.forgetDir(root, dir, h)
	}
	if !exists {
		return nil, false, fmt.Errorf("gvisor: %w: %s: %w", source.ErrNotMeasurable, display(root, dir), errCgroupGone)
	}
	if same || attempt > 0 {
		return nil, false, err // the file alone is missing: the caller decides
	}
	return nil, true, nil
}

// readOptional reads an optional file of dir through the directory cache
// without readFile's check of the directory on a missing file: the
// directory missing is errCgroupGone, the file missing fs.ErrNotExist. A
// handle held on a directory that was just removed and made again can make
// an optional file read as missing for one sample (absent, never a wrong
// number); the required files of the same sample find the new directory.
func (s *cgroupSource) readOptional(ctx context.Context, root *os.Root, dir, name string) ([]byte, error) {
	h, err := s.acquireDir(ctx, root, dir)
	defer s.releaseDir(h)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("gvisor: %w: %s: %w", source.ErrNotMeasurable, display(root, dir), errCgroupGone)
	}
	if err != nil {
		return nil, wrapRead(err)
	}
	b, err := s.g.ReadRootFile(ctx, h.r, name)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, wrapRead(err)
	}
	return b, err
}

// wrapRead gives a read error that is neither a timeout nor malformed the
// not-measurable sentinel (permission denied, I/O error on a dying cgroup).
func wrapRead(err error) error {
	if errors.Is(err, source.ErrTimeout) || errors.Is(err, source.ErrMalformed) || errors.Is(err, source.ErrNotMeasurable) {
		return err
	}
	return fmt.Errorf("gvisor: %w: %w", source.ErrNotMeasurable, err)
}

// optParse reads an optional signal file: ok is false, with why, when f is
// nil (whyNil), when the file or its directory is missing (another
// hierarchy may lack the sandbox's cgroup), or when the kernel refuses to
// show it (EOPNOTSUPP: pressure turned off). A timeout or another read
// error is returned, and so is a malformed file, naming the path.
func optParse[T any](f *fileReq, whyNil string, parse func([]byte) (T, error)) (v T, ok bool, why string, err error) {
	switch {
	case f == nil:
		return v, false, whyNil, nil
	case errors.Is(f.err, fs.ErrNotExist):
		return v, false, "no " + f.path(), nil
	case errors.Is(f.err, errCgroupGone):
		return v, false, "no cgroup " + display(f.root, f.dir), nil
	case errors.Is(f.err, syscall.EOPNOTSUPP):
		return v, false, f.path() + ": not supported by the kernel (pressure accounting off?)", nil
	case f.err != nil:
		return v, false, "", f.err
	}
	if v, err = parse(f.b); err != nil {
		return v, false, "", f.malformed(err)
	}
	return v, true, "", nil
}

// absent appends an Absent entry to r.
func absent(r *source.Reading, field, why string) {
	r.Absent = append(r.Absent, source.Absent{Field: field, Reason: why})
}
