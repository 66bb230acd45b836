package nodeagent

// This file keeps what the agent charged and delivered across its restarts
// (--state-dir): agent-state.json, rewritten crash-safe
// (internal/atomicfile) after every sweep, before that sweep is served, and
// read back at start.

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxstats/sandboxstats/internal/atomicfile"
	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/rate"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// agentStateFile is the file under the state directory.
const agentStateFile = "agent-state.json"

// agentStateVersion is the version this build writes and reads; a file of
// another version is set aside (there is no older version to read).
const agentStateVersion = 1

// maxAgentStateBytes caps agent-state.json: a larger file is set aside at
// start, and a save that would be larger fails (the file is removed: a
// restart starts afresh). Loading takes 2.5 to 3 bytes of heap a byte
// (TestStateLoadMemory; up to 6.7 measured beside other tests' heap), so
// the cap keeps a load within the DaemonSet's 128 MiB. A real file holds about 2.6 KiB a live activation with
// --label-actor, 100 bytes an ended one charged (at most
// rate.DefaultMaxEnded) and 1 KiB an unsettled event (at most
// maxPendingEvents): 1000 live activations take about 3 MB.
const maxAgentStateBytes = 16 << 20

// metricStateSaves counts the state file's writes.
const metricStateSaves = "sandboxstats_agent_state_saves_total"

// agentState is agent-state.json.
type agentState struct {
	Version int `json:"version"`
	// OriginUnixNano is when the first agent of this state started: an
	// activation begun before it is none of this state's (it charges from
	// its first sample on, as at a first start).
	OriginUnixNano int64                `json:"origin_unix_nano"`
	SavedUnixNano  int64                `json:"saved_unix_nano"`
	Accountant     rate.AccountantState `json:"accountant"`
	Totals         []totalState         `json:"totals"`
	Owners         []ownerState         `json:"owners"`
	EndedMarks     []markState          `json:"ended_marks"`
	Pending        []pendingEvent       `json:"pending_events"`
	// The per-container series (state_containers.go); absent in an older
	// agent's file.
	ContainerAccountant *rate.AccountantState `json:"container_accountant,omitempty"`
	ContainerTotals     []containerTotalState `json:"container_totals,omitempty"`
	ContainerLedgers    []ledgerState         `json:"container_ledgers,omitempty"`
}

// totalState is one label set's exported counters.
type totalState struct {
	// Labels: class, source, template namespace and name, actor uid, name
	// and namespace (empty without LabelActor).
	Labels   [7]string      `json:"labels"`
	Counters []totalCounter `json:"counters"`
	// StartUnixNano is when the label set was first charged (its series'
	// start); absent (an older file) or in the future: the restart's time.
	StartUnixNano int64 `json:"start_unix_nano,omitempty"`
	// WorkerPool is the worker_pool label (LabelWorkerPool; absent in
	// an older file: none).
	WorkerPool string `json:"worker_pool,omitempty"`
}

// totalCounter is one counter's total; Interface is set for a network
// counter exported per interface.
type totalCounter struct {
	Counter   rate.Counter `json:"counter"`
	Interface string       `json:"interface,omitempty"`
	Value     uint64       `json:"value"`
}

// ownerState is the socket an activation was sampled from.
type ownerState struct {
	Key    rate.KeyState `json:"key"`
	Socket string        `json:"socket"`
}

// markState is what the agent read of one daemon's ended records.
type markState struct {
	Socket   string `json:"socket"`
	Instance string `json:"instance_id"`
	Highest  uint64 `json:"highest_sequence"`
}

// stateStore is the agent's state directory.
type stateStore struct {
	dir    string
	logger *slog.Logger
	// write replaces the file (atomicfile.Write; a fault in tests).
	write func(dir, name string, data []byte, perm os.FileMode) error
	saves *prometheus.CounterVec // result
	// failing: the last save failed (logged once until one succeeds).
	failing bool
}

func newStateStore(dir string, logger *slog.Logger) *stateStore {
	saves := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricStateSaves,
		Help: "Writes of --state-dir's agent-state.json, by result: ok, failed (a full disk, a read-only directory: the file is removed, so that a restart does not continue from an older one; see docs/statsagent.md)."},
		[]string{"result"})
	saves.WithLabelValues("ok")
	saves.WithLabelValues("failed")
	return &stateStore{dir: dir, logger: logger, write: atomicfile.Write, saves: saves}
}

// load reads the state file, creating the directory and removing the temp
// files an interrupted write left. It returns nil, and says why in the
// log, when there is no state to continue from: none yet (a first start),
// a file that cannot be used (unreadable as JSON, another version, over
// maxAgentStateBytes, not holding together: moved aside), or a directory
// that cannot be made or read. The agent runs either way.
func (s *stateStore) load(now time.Time) *agentState {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		s.logger.Error("state dir cannot be made: running without state (a restart starts as a first start)", "dir", s.dir, "err", err)
		return nil
	}
	removed, err := atomicfile.SweepTemps(s.dir, agentStateFile)
	for _, p := range removed {
		s.logger.Info("removed a temp file an interrupted state write left", "path", p)
	}
	if err != nil {
		s.logger.Warn("state dir: temp files of interrupted writes not all removed", "dir", s.dir, "err", err)
	}
	p := filepath.Join(s.dir, agentStateFile)
	b, err := bounded.ReadRegularFile(p, maxAgentStateBytes)
	switch {
	case errors.Is(err, os.ErrNotExist):
		s.logger.Info("no agent state yet: a first start; activations running now are charged from their first sample on", "path", p)
		return nil
	case errors.Is(err, source.ErrMalformed): // over the size cap, or not a regular file
	case err != nil:
	default:
		var st agentState
		if err = json.Unmarshal(b, &st); err == nil && st.Version != agentStateVersion {
			err = fmt.Errorf("state version %d, this build reads %d", st.Version, agentStateVersion)
		}
		if err == nil && (st.OriginUnixNano <= 0 || st.OriginUnixNano > now.UnixNano()) {
			err = fmt.Errorf("origin %d not in the past", st.OriginUnixNano)
		}
		if err == nil {
			return &st
		}
	}
	s.setAside(p, now, err)
	return nil
}

// setAside moves the unusable file at p aside and logs what is lost.
func (s *stateStore) setAside(p string, now time.Time, why error) {
	aside, err := atomicfile.MoveAside(p, now.UnixNano())
	if err != nil {
		s.logger.Error("agent state unusable and not moved aside: starting as a first start", "path", p, "err", why, "move_err", err)
		return
	}
	s.logger.Error("agent state unusable; moved aside, starting as a first start: the usage charged and the events unsent that it held are lost (counters start again; the usage while no agent ran, and the activations that ended then, are neither charged nor sent a final)",
		"path", p, "moved_to", aside, "err", why)
}

// probeFile is the file probe writes and removes.
const probeFile = agentStateFile + ".probe"

// probe reports whether a file can be written in the state directory (a
// small one, crash-safe as a save is, then removed): a state that could
// not be kept in step with what the agent serves is not continued from.
// Cheaper than writing the state back (a large state's bytes twice in
// memory at start).
func (s *stateStore) probe() error {
	if err := s.write(s.dir, probeFile, []byte("probe\n"), 0o600); err != nil && !errors.Is(err, atomicfile.ErrNotDurable) {
		return err
	}
	return os.Remove(filepath.Join(s.dir, probeFile))
}

// save writes st and reports whether it did. A failure is counted and logged (once until a save
// succeeds), and the file is removed: a restart from a file older than
// what was served would show Prometheus a counter going down.
func (s *stateStore) save(st *agentState) bool { return s.persist(st, true) }

// saveAgain writes st, a state whose counters the file already holds (the
// shutdown save: only events settled since the last sweep differ). A
// failure is counted and logged, and the file is kept: it is in step with
// what was served, and removing it would make the restart a first start.
func (s *stateStore) saveAgain(st *agentState) bool { return s.persist(st, false) }

// persist is save (removeOnFailure) and saveAgain.
func (s *stateStore) persist(st *agentState, removeOnFailure bool) bool {
	b, err := json.Marshal(st)
	if err == nil && len(b) >= maxAgentStateBytes {
		err = fmt.Errorf("state of %d bytes over the %d cap", len(b), maxAgentStateBytes)
	}
	if err == nil {
		err = s.write(s.dir, agentStateFile, b, 0o600)
	}
	if err != nil && !errors.Is(err, atomicfile.ErrNotDurable) {
		s.saves.WithLabelValues("failed").Inc()
		if !removeOnFailure {
			s.logger.Error("agent state not saved again at shutdown: the last sweep's is kept (the events settled since are sent again after a restart)",
				"dir", s.dir, "err", err)
			return false
		}
		rmErr := os.Remove(filepath.Join(s.dir, agentStateFile))
		if errors.Is(rmErr, os.ErrNotExist) {
			rmErr = nil
		}
		if !s.failing {
			s.logger.Error("agent state not saved: a restart now starts as a first start (the file is removed) until a save succeeds",
				"dir", s.dir, "err", err, "remove_err", rmErr)
		}
		s.failing = true
		return false
	}
	s.saves.WithLabelValues("ok").Inc()
	if s.failing {
		s.logger.Info("agent state saved again", "dir", s.dir)
	}
	s.failing = false
	return true
}

// openState opens the state directory dir ("": none) and reads its state.
// A state is continued from only if it can be written back at once: a
// directory that cannot be written could not keep it in step with the
// counters served, so the agent starts as at a first start (and keeps
// trying to save).
func openState(dir string, now time.Time, logger *slog.Logger) (*stateStore, *agentState) {
	if dir == "" {
		return nil, nil
	}
	store := newStateStore(dir, logger)
	st := store.load(now)
	if st != nil {
		if err := checkState(st, now); err != nil {
			store.setAside(filepath.Join(dir, agentStateFile), now, err)
			st = nil
		}
	}
	if st != nil {
		if err := store.probe(); err != nil {
			logger.Error("agent state found but cannot be written back: starting as a first start", "dir", dir, "err", err)
			store.saves.WithLabelValues("failed").Inc()
			st = nil
		}
	}
	return store, st
}

// newStatefulMetrics is newMetrics continuing from the state in dir (none
// when dir is ""), cfg.Started being now: with a state, the accountant's
// start is the state's origin and its memory the state's.
func newStatefulMetrics(reg prometheus.Registerer, cfg metricsConfig, dir string, logger *slog.Logger) (*metrics, error) {
	now := cfg.Started
	store, st := openState(dir, now, logger)
	cfg.State = store
	if st != nil {
		cfg.Started = time.Unix(0, st.OriginUnixNano)
	}
	m, err := newMetrics(reg, cfg, logger)
	if err != nil || st == nil {
		return m, err
	}
	if err := m.restoreState(st, now); err != nil { // checked by openState: not reached
		return nil, fmt.Errorf("restore state: %w", err)
	}
	logger.Info("agent state restored: counters continue, unsent events are sent again",
		"dir", dir, "origin", cfg.Started, "saved", time.Unix(0, st.SavedUnixNano), "live_activations", len(st.Accountant.Live),
		"ended_charged", len(st.Accountant.Ended), "label_sets", len(st.Totals), "pending_events", len(st.Pending))
	return m, nil
}
