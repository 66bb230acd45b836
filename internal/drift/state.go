package drift

// This file persists the open findings and recent events: drift.json
// beside the identity, written crash-safe (internal/atomicfile) whenever
// they change, read back at start.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sandboxstats/sandboxstats/internal/atomicfile"
	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// stateFileName is the file under the state directory holding the findings.
const stateFileName = "drift.json"

// maxStateFileBytes caps drift.json: save drops the oldest events to stay
// under it, and load takes a larger file for corrupt. The open findings
// alone (at most maxOpenFindingsTotal, each under 1 KiB) fit.
const maxStateFileBytes = 512 << 10

const stateVersion = 1

type stateFile struct {
	Version  int       `json:"version"`
	Findings []Finding `json:"findings"`
	Events   []Event   `json:"events"`
}

// load restores the findings and events of drift.json under cfg.StateDir,
// creating the directory and removing the temp files an interrupted write
// left. A file that cannot be used (unreadable as JSON, another version,
// over maxStateFileBytes) is moved aside and logged, and the check starts
// with no findings; only an error that leaves the file in place fails.
func (c *Checker) load() error {
	cfg := c.cfg
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("drift: state dir: %w", err)
	}
	removed, err := atomicfile.SweepTemps(cfg.StateDir, stateFileName)
	for _, p := range removed {
		cfg.Logger.Info("drift: removed a temp file an interrupted write left", "path", p)
	}
	if err != nil {
		return fmt.Errorf("drift: %w", err)
	}
	p := filepath.Join(cfg.StateDir, stateFileName)
	// A regular file only (never a FIFO, a device or a symlink), opened
	// non-blocking, at most maxStateFileBytes: over that it is corrupt.
	b, err := bounded.ReadRegularFile(p, maxStateFileBytes)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case errors.Is(err, source.ErrMalformed): // over the size cap: move it aside
	case err != nil:
		return fmt.Errorf("drift: read state: %w", err)
	default:
		var st stateFile
		if err = json.Unmarshal(b, &st); err == nil && st.Version != stateVersion {
			err = fmt.Errorf("unknown state version %d", st.Version)
		}
		if err == nil {
			for _, f := range st.Findings {
				c.open[f.key()] = f
			}
			c.events = st.Events
			return nil
		}
	}
	aside, rerr := atomicfile.MoveAside(p, cfg.Now().UnixNano())
	if rerr != nil {
		return fmt.Errorf("drift: state file %s is unreadable (%v) and could not be moved aside: %w", p, err, rerr)
	}
	cfg.Logger.Error("drift state file unreadable; moved aside, starting with no findings", "path", p, "moved_to", aside, "err", err)
	return nil
}

// save persists the findings if they changed. Called with mu held.
func (c *Checker) save() {
	if !c.persist || c.cfg.StateDir == "" {
		return
	}
	st := stateFile{Version: stateVersion, Findings: c.sortedLocked(), Events: c.events}
	b, err := json.MarshalIndent(st, "", "  ")
	// Over the cap, the oldest events go first (the file is read back
	// under the same cap).
	for err == nil && len(b)+1 > maxStateFileBytes && len(st.Events) > 0 {
		st.Events = st.Events[max(1, len(st.Events)/8):]
		b, err = json.MarshalIndent(st, "", "  ")
	}
	if err == nil {
		c.events = st.Events
		err = atomicfile.Write(c.cfg.StateDir, stateFileName, append(b, '\n'), 0o600)
	}
	if err != nil && !errors.Is(err, atomicfile.ErrNotDurable) {
		c.cfg.Logger.Error("drift: could not persist findings", "err", err)
		return
	}
	c.persist = false
}
