// This file reads the files of one Sample: the per-file requests, read one
// after another in one bounded call through the directory cache (a file
// retried once when its directory was replaced), and their required and
// optional values.

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// fileReq is one file a Sample reads; the reads of one Sample run in one
// bounded call (readAll).
type fileReq struct {
	root      *os.Root
	dir, name string
	// optional marks a signal file: a missing one is absent, so its read
	// skips the check of the directory that a required file's read makes
	// (readBatch).
	optional bool
	b        []byte
	err      error
}

// fileResult is what the shared read found for one request.
type fileResult struct {
	b   []byte
	err error
}

// readAll reads the files of reqs in one bounded call (bounded.DoBatch) that
// concurrent Samples of the same cgroup share: one goroutine, the
// directories from the cache, each file read into one buffer with no
// allocation of its own. At the deadline every request gets the timeout,
// naming the file the read is blocked in.
func (s *cgroupSource) readAll(ctx context.Context, reqs []*fileReq) {
	res, err := bounded.DoBatch(ctx, s.g, batchKey(reqs), int(s.batchBytes.Load()), func(b *bounded.Batch) ([]fileResult, error) {
		out := s.readBatch(b, reqs)
		s.batchBytes.Store(int64(b.Len()))
		return out, nil
	})
	for i, r := range reqs {
		if err != nil {
			r.b, r.err = nil, wrapRead(err)
			continue
		}
		r.b, r.err = res[i].b, res[i].err
	}
}

// batchKey names the shared read of reqs: their directories and how many
// files. Samples of one source with the same directories read the same
// files, in the same order.
func batchKey(reqs []*fileReq) string {
	n := len("cgroup files ()") + 8
	for i, r := range reqs {
		if i == 0 || r.root != reqs[i-1].root || r.dir != reqs[i-1].dir {
			n += len(r.root.Name()) + len(r.dir) + 2
		}
	}
	var k strings.Builder
	k.Grow(n)
	k.WriteString("cgroup files (")
	k.WriteString(strconv.Itoa(len(reqs)))
	k.WriteString(")")
	for i, r := range reqs {
		if i == 0 || r.root != reqs[i-1].root || r.dir != reqs[i-1].dir {
			k.WriteString(" ")
			k.WriteString(r.root.Name())
			k.WriteString(r.dir)
		}
	}
	return k.String()
}

// readBatch reads every file of reqs through b. It blocks: it is the body of
// readAll's bounded call, and must not write to reqs (a caller may have left
// at its deadline and be reading them).
func (s *cgroupSource) readBatch(b *bounded.Batch, reqs []*fileReq) []fileResult {
	out := make([]fileResult, len(reqs))
	var dirs batchDirs
	dirs.held = dirs.few[:0]
	defer dirs.release(s)
	for i, r := range reqs {
		out[i].b, out[i].err = s.readReq(b, &dirs, r)
	}
	return out
}

// batchDirs are the directories one batch has acquired (a few: one per
// hierarchy), and those it found missing.
type batchDirs struct {
	held []heldDir
	few  [8]heldDir // held's first array: a v1 sample acquires 7 at most
}

type heldDir struct {
	id  dirID
	h   *dirHandle // nil: missing, with err
	err error
	// known: err is the directory known missing (knownMissing), not
	// looked up by this batch; a required read looks it up.
	known bool
	gone  bool // dirState said the directory is not there
	// checked: dirState already ran for this directory in this batch.
	checked bool
}

// get returns the held entry of root's dir, acquiring the directory the
// first time the batch needs it. For an optional read a directory found
// missing a moment ago (knownMissing) is missing without a look.
func (d *batchDirs) get(s *cgroupSource, root *os.Root, dir string, optional bool) *heldDir {
	id := dirID{root, dir}
	for i := range d.held {
		if e := &d.held[i]; e.id == id {
			if e.known && !optional {
				e.h, e.err = s.acquireDir(root, dir)
				e.known, e.gone, e.checked = false, false, false
			}
			return e
		}
	}
	if optional && s.knownMissing(root, dir) {
		d.held = append(d.held, heldDir{id: id, err: errMissingCached, known: true})
		return &d.held[len(d.held)-1]
	}
	h, err := s.acquireDir(root, dir)
	d.held = append(d.held, heldDir{id: id, h: h, err: err})
	return &d.held[len(d.held)-1]
}

// reacquire replaces a held directory that was replaced on disk by the one
// there now.
func (d *batchDirs) reacquire(s *cgroupSource, e *heldDir) {
	s.releaseDir(e.h)
	e.h, e.err = s.acquireDir(e.id.root, e.id.dir)
	e.gone = false
}

func (d *batchDirs) release(s *cgroupSource) {
	for _, e := range d.held {
		s.releaseDir(e.h)
	}
}

// readReq reads one request. A required file that is missing is reported
// as fs.ErrNotExist when its directory is there, and as errCgroupGone (with
// source.ErrNotMeasurable) when the directory is gone; when the directory
// held open was replaced by a new one, the new one is read. An optional file
// skips that check: its directory missing is errCgroupGone, the file missing
// fs.ErrNotExist. A handle held on a directory that was just removed and
// made again can make an optional file read as missing for one sample
// (absent, never a wrong number); the required files of the same sample
// find the new directory.
func (s *cgroupSource) readReq(b *bounded.Batch, dirs *batchDirs, r *fileReq) ([]byte, error) {
	gone := func() error {
		return fmt.Errorf("gvisor: %w: %s: %w", source.ErrNotMeasurable, display(r.root, r.dir), errCgroupGone)
	}
	for attempt := 0; ; attempt++ {
		e := dirs.get(s, r.root, r.dir, r.optional)
		if e.gone {
			return nil, gone()
		}
		err := e.err
		if err == nil {
			var data []byte
			if data, err = s.readFile(b, e.h, r.name); err == nil {
				return data, nil
			}
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, wrapRead(err)
		}
		if r.optional {
			if e.h == nil {
				e.gone = true
				return nil, gone()
			}
			if e.checked && !errors.Is(err, bounded.ErrHeldGone) {
				return nil, err
			}
			e.checked = true
		}
		// Is the directory still there, and still the one held open?
		exists, same, serr := dirState(r.root, r.dir, e.h)
		if serr != nil {
			return nil, wrapRead(serr)
		}
		if e.h != nil && !same {
			s.forgetDir(r.root, r.dir, e.h)
		}
		if !exists {
			e.gone = true
			return nil, gone()
		}
		if same || attempt > 0 {
			return nil, err // the file alone is missing: the caller decides
		}
		dirs.reacquire(s, e)
	}
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
