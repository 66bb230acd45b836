package identity

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/atomicfile"
	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// The state files under the state directory.
const (
	// stateFileName holds the binding (and the last cleared actor).
	stateFileName = "binding.json"
	// endedFileName holds the recently ended activations.
	endedFileName = "ended.json"
)

// Size caps of the state files. A binding is a few hundred bytes, but one
// of a guest agent carries its epoch's first read, up to about 41 KiB (64
// interfaces, 64 devices: what the micro-VM source admits), and any
// binding up to MaxExited exited containers, about 27 KiB at the caps;
// binding.json holds up to LimitMaxWorkloads of them (about 4.5 MiB at
// every cap, TestStateFileHoldsEveryLargeBinding) and is refused over
// maxStateBytes at write, never only at read. The ended records are kept
// under maxEndedBytes by dropping the oldest.
const (
	maxStateBytes = 6 << 20
	maxEndedBytes = 1 << 20
	// maxEndedSlack is what ended.json is read with beyond maxEndedBytes
	// (one record saved alone may pass the cap).
	maxEndedSlack = 256 << 10
)

// stateVersion is the version of both state files. Both still load at
// version 1: binding.json's one binding and one last cleared actor, and
// ended.json, whose records version 2 did not change (refusing them would
// move aside, at the upgrade, the ends the node agent has not polled yet).
const (
	stateVersion    = 2
	stateVersionOne = 1
)

// endedVersion is ended.json's version: 3 adds the records' numbering
// (the instance id, each record's sequence, the next sequence) and the
// eviction counts. Versions 1 and 2 load: their records are numbered from
// 1, in order, under a new instance id, and the file is written back at
// version 3 at once.
const endedVersion = 3

// stateFile is binding.json: every bound workload, and the actors whose last
// activation a Checkpoint ended (for safe retries).
type stateFile struct {
	Version  int             `json:"version"`
	Bindings []*bindingState `json:"bindings,omitempty"`
	Cleared  []string        `json:"cleared_actor_uids,omitempty"`
	// Version 1's fields.
	Binding     *bindingState `json:"binding,omitempty"`
	LastCleared string        `json:"last_cleared_actor_uid,omitempty"`
}

// bindings is every binding the file holds, whichever its version.
func (st stateFile) bindings() []*bindingState {
	if st.Binding != nil {
		return []*bindingState{st.Binding}
	}
	return st.Bindings
}

// cleared is every cleared actor the file holds, whichever its version.
func (st stateFile) cleared() []string {
	if st.LastCleared != "" {
		return []string{st.LastCleared}
	}
	return st.Cleared
}

type bindingState struct {
	Identity      Identity          `json:"identity"`
	Ref           source.SandboxRef `json:"ref"`
	Op            Op                `json:"op"`
	EpochUnixNano int64             `json:"epoch_unix_nano"`
	Baseline      *Baseline         `json:"baseline,omitempty"`
	// Exited are the activation's exited containers (containers.go); Ref
	// holds its container set now.
	Exited *exitedState `json:"exited,omitempty"`
	// Breakdown is the source's own state (source.Persistent, breakdown.go).
	Breakdown json.RawMessage `json:"breakdown,omitempty"`
}

type endedFile struct {
	Version int `json:"version"`
	// Version 3's numbering (ledger.go).
	InstanceID   string    `json:"instance_id,omitempty"`
	NextSequence uint64    `json:"next_sequence,omitempty"`
	Evicted      Evictions `json:"evicted"`
	Ended        []*Ended  `json:"ended"`
}

func (l *ledger) file(records []*Ended) endedFile {
	return endedFile{Version: endedVersion, InstanceID: l.instanceID, NextSequence: l.next, Evicted: l.evicted, Ended: records}
}

// readState reads one state file: a regular file (never a FIFO, a device or
// a symlink) of at most max bytes. A missing file is (nil, nil).
func readState(p string, max int) ([]byte, error) {
	b, err := bounded.ReadRegularFile(p, max)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// loadState reads and decodes one state file. A file that does not decode is
// moved aside and logged, and the zero state returned; a file that cannot be
// read at all (EIO, EACCES, not a regular file) is an error: moving it aside
// could forget a good state, so statsd refuses to start.
func (s *Store) loadState(name string, max int, decode func([]byte) error) error {
	p := filepath.Join(s.cfg.StateDir, name)
	b, err := readState(p, max)
	switch {
	case errors.Is(err, source.ErrMalformed): // over the size cap: corrupt
	case err != nil:
		return fmt.Errorf("identity: read state: %w", err)
	case b == nil:
		return nil
	default:
		if err = decode(b); err == nil {
			return nil
		}
	}
	aside, rerr := atomicfile.MoveAside(p, s.cfg.Now().UnixNano())
	if rerr != nil {
		return fmt.Errorf("identity: state file %s is unreadable (%v) and could not be moved aside: %w", p, err, rerr)
	}
	s.logger.Error("state file unreadable; moved aside, starting without it", "path", p, "moved_to", aside, "err", err)
	return decode(nil)
}

func (s *Store) loadBinding() (stateFile, error) {
	st := stateFile{Version: stateVersion}
	err := s.loadState(stateFileName, maxStateBytes, func(b []byte) error {
		if b == nil {
			st = stateFile{Version: stateVersion}
			return nil
		}
		return decodeState(b, &st)
	})
	return st, err
}

func decodeState(b []byte, st *stateFile) error {
	if err := json.Unmarshal(b, st); err != nil {
		return fmt.Errorf("parse: %w", err)
	}
	switch {
	case st.Version == stateVersionOne && st.Bindings == nil && st.Cleared == nil:
	case st.Version == stateVersion && st.Binding == nil && st.LastCleared == "":
	default:
		return fmt.Errorf("unknown state version %d", st.Version)
	}
	if n := len(st.bindings()); n > LimitMaxWorkloads {
		return fmt.Errorf("%d bindings, over the limit of %d", n, LimitMaxWorkloads)
	}
	seen := map[string]bool{}
	for i, b := range st.bindings() {
		if b == nil {
			return fmt.Errorf("binding %d: null", i)
		}
		if err := b.Identity.Validate(); err != nil {
			return fmt.Errorf("binding %d: %w", i, err)
		}
		if err := ValidateRef(b.Ref); err != nil {
			return fmt.Errorf("binding %d: %w", i, err)
		}
		if b.Exited != nil {
			if err := validateExited(*b.Exited); err != nil {
				return fmt.Errorf("binding %d: %w", i, err)
			}
		}
		if b.Op != OpRun && b.Op != OpRestore {
			return fmt.Errorf("binding %d: unknown op %q", i, b.Op)
		}
		if seen[b.Identity.ActorUID] {
			return fmt.Errorf("binding %d: actor %q bound twice", i, b.Identity.ActorUID)
		}
		seen[b.Identity.ActorUID] = true
	}
	for i, a := range st.cleared() {
		if err := ValidateActorUID(a); err != nil {
			return fmt.Errorf("cleared actor %d: %w", i, err)
		}
	}
	return nil
}

// loadEnded reads ended.json and sets the store's ledger from it: the
// records' numbering continues; a missing or unreadable file starts a new
// instance, written with its first record (until then nothing is numbered
// under it, so a restart that makes another loses nothing). A file older
// than version 3 is numbered and written back at once, so its records keep
// their numbers across the next restart; if that write fails, they are
// written with the first new record.
func (s *Store) loadEnded() ([]*Ended, error) {
	var (
		out     []*Ended
		missing bool
	)
	s.ledger = newLedger()
	err := s.loadState(endedFileName, maxEndedBytes+maxEndedSlack, func(b []byte) error {
		out = nil
		s.ledger, missing = newLedger(), false
		if b == nil {
			return nil
		}
		var f endedFile
		if err := json.Unmarshal(b, &f); err != nil {
			return fmt.Errorf("parse: %w", err)
		}
		switch f.Version {
		case endedVersion:
		case stateVersion, stateVersionOne:
			if f.InstanceID != "" || f.NextSequence != 0 {
				return fmt.Errorf("version %d with version %d's numbering", f.Version, endedVersion)
			}
		default:
			return fmt.Errorf("unknown ended-activations version %d", f.Version)
		}
		var last uint64
		for i, e := range f.Ended {
			if e == nil || e.Identity.Validate() != nil {
				return fmt.Errorf("record %d: not a valid ended activation", i)
			}
			if f.Version == endedVersion && e.Sequence <= last {
				return fmt.Errorf("record %d: sequence %d after %d", i, e.Sequence, last)
			}
			last = e.Sequence
		}
		out = f.Ended
		s.ledger, missing = ledgerOf(out, f.InstanceID, f.NextSequence, f.Evicted)
		return nil
	})
	if err != nil || !missing {
		return out, err
	}
	if err := s.save(endedFileName, s.ledger.file(out)); err != nil {
		s.logger.Warn("could not write the ended records' numbering; it is written with the first record", "err", err)
	}
	return out, nil
}

// save writes one state file crash-safely (atomicfile). Written but not
// known to be durable counts as written (memory stays in step with the
// file), with a warning.
func (s *Store) save(name string, v any) error {
	if s.cfg.StateDir == "" {
		return nil
	}
	b, err := encodeState(v)
	if err != nil {
		return fmt.Errorf("%w: encode %s: %w", ErrNotPersisted, name, err)
	}
	if name == stateFileName && len(b) > maxStateBytes {
		// A file the next start would take for corrupt: refuse the call
		// instead, with nothing changed.
		return fmt.Errorf("%w: %s would be %d bytes, over its %d-byte cap", ErrNotPersisted, name, len(b), maxStateBytes)
	}
	err = atomicfile.Write(s.cfg.StateDir, name, b, 0o600)
	switch {
	case errors.Is(err, atomicfile.ErrNotDurable):
		s.logger.Warn("state saved but not known to be durable", "file", name, "err", err)
		return nil
	case err != nil:
		return fmt.Errorf("%w: save %s in %s: %w", ErrNotPersisted, name, s.cfg.StateDir, err)
	}
	return nil
}

// encodeState is a state file's bytes as save writes them: the byte caps
// measure this, not another encoding of the same records.
func encodeState(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// saveBindings persists bindings (with each one's first-read baseline, once
// taken, its container set now and its exited containers) and the cleared
// actors as binding.json. Called under commit.
func (s *Store) saveBindings(bindings []*Binding, cleared []string) error {
	return s.saveBindingsWith(bindings, cleared, nil)
}

// saveBindingsWith is saveBindings with set as the container set of the
// binding of the actor named (an update saved before it applies).
func (s *Store) saveBindingsWith(bindings []*Binding, cleared []string, set *namedSet) error {
	st := stateFile{Version: stateVersion, Cleared: cleared}
	var saved [][]byte // each binding's source state, as written
	for _, b := range bindings {
		containers := b.Activation.Containers()
		if set != nil && set.actorUID == b.Identity.ActorUID {
			containers = set.set
		}
		bs := &bindingState{Identity: b.Identity, Ref: b.Ref.WithContainers(containers), Op: b.Op, EpochUnixNano: b.EpochUnixNano}
		if base := b.Activation.Baseline(); base != nil && base.Kind == BaselineFirstRead {
			bs.Baseline = base
		}
		if ex := b.Activation.exitedNow(); len(ex.Containers) > 0 {
			bs.Exited = &ex
		}
		bs.Breakdown = s.breakdownNow(b)
		saved = append(saved, bs.Breakdown)
		st.Bindings = append(st.Bindings, bs)
	}
	slices.SortFunc(st.Bindings, func(a, b *bindingState) int { return strings.Compare(a.Identity.ActorUID, b.Identity.ActorUID) })
	if err := s.save(stateFileName, st); err != nil {
		return err
	}
	for i, b := range bindings {
		b.markSaved(saved[i])
	}
	return nil
}

// saveEnded numbers e (the ledger's next sequence) and persists the ended
// activations with e added (replacing a record of the same activation),
// less what is past the retention, the count cap or the byte cap (oldest
// first), each drop counted, and returns that list. Called under commit;
// the caller publishes the list (with the binding it goes with) once it is
// saved. The ledger moves on only once the file is written: a failed save
// gives no sequence out.
func (s *Store) saveEnded(e *Ended) ([]*Ended, error) {
	led := *s.ledger
	e.InstanceID, e.Sequence = led.instanceID, led.next
	led.next++
	var (
		cutoff = s.cutoff()
		next   []*Ended
		unseen unseenBatch
	)
	drop := func(o *Ended, count *uint64, why string) {
		*count++
		never, fresh := o.settle()
		if never {
			led.evicted.NeverServed++
		}
		if fresh {
			unseen.add(o, why)
		}
	}
	for _, o := range s.view.Load().ended {
		switch {
		case o.key() == e.key():
		case o.EndUnixNano < cutoff:
			drop(o, &led.evicted.ByRetention, "retention")
		default:
			next = append(next, o)
		}
	}
	next = append(next, e)
	for len(next) > s.cfg.EndedMax {
		drop(next[0], &led.evicted.ByMax, "ended-max")
		next = next[1:]
	}
	for len(next) > 1 {
		b, err := encodeState(led.file(next))
		if err != nil {
			return nil, err
		}
		if len(b) <= maxEndedBytes {
			break
		}
		drop(next[0], &led.evicted.BySize, "size")
		next = next[1:]
	}
	if err := s.save(endedFileName, led.file(next)); err != nil {
		return nil, err
	}
	s.ledger = &led
	s.warnUnserved(led.instanceID, unseen)
	return next, nil
}

// endedOf returns the record of an actor's epoch, or nil.
func (s *Store) endedOf(actorUID string, epoch int64) *Ended {
	for _, e := range s.view.Load().ended {
		if e.Identity.ActorUID == actorUID && e.EpochUnixNano == epoch {
			return e
		}
	}
	return nil
}

// lastEndedOf returns the newest record of an actor, or nil.
func (s *Store) lastEndedOf(actorUID string) *Ended {
	all := s.view.Load().ended
	for i := len(all) - 1; i >= 0; i-- {
		if all[i].Identity.ActorUID == actorUID {
			return all[i]
		}
	}
	return nil
}

// sweepTemps removes the temp files a crash left beside the state files
// (atomicfile writes <name>.tmp-*).
func sweepTemps(dir string, logger *slog.Logger) {
	removed, err := atomicfile.SweepTemps(dir, stateFileName, endedFileName)
	for _, p := range removed {
		logger.Info("removed a temp file an interrupted write left", "path", p)
	}
	if err != nil {
		logger.Warn("could not sweep temp files", "err", err)
	}
}
