package nodeagent

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/rate"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// exportState returns what the agent charged and delivered, for the state
// file. Called with mu held (in Apply, before the sweep is served).
func (m *metrics) exportState(now time.Time) *agentState {
	st := &agentState{Version: agentStateVersion, OriginUnixNano: m.cfg.Started.UnixNano(), SavedUnixNano: now.UnixNano(),
		Accountant: m.acct.Export()}
	for l, t := range m.totals {
		ts := totalState{Labels: [7]string{l.class, l.source, l.templateNamespace, l.templateName, l.actorUID, l.actorName, l.actorNamespace},
			StartUnixNano: t.values.start.UnixNano(), WorkerPool: l.workerPool}
		for c := range rate.NumCounters {
			if t.values.has[c] {
				ts.Counters = append(ts.Counters, totalCounter{Counter: c, Value: t.values.total[c]})
			}
		}
		for id, v := range t.values.perInterface {
			ts.Counters = append(ts.Counters, totalCounter{Counter: id.Counter, Interface: id.Interface, Value: v})
		}
		slices.SortFunc(ts.Counters, func(x, y totalCounter) int {
			return cmp.Or(cmp.Compare(x.Counter, y.Counter), strings.Compare(x.Interface, y.Interface))
		})
		st.Totals = append(st.Totals, ts)
	}
	slices.SortFunc(st.Totals, func(x, y totalState) int { return slices.Compare(x.Labels[:], y.Labels[:]) })
	for k, o := range m.owners {
		st.Owners = append(st.Owners, ownerState{Key: rate.KeyState{ActorUID: k.ActorUID, Source: int32(k.Source), EpochUnixNano: k.EpochUnixNano}, Socket: o.socket})
	}
	slices.SortFunc(st.Owners, func(x, y ownerState) int {
		return cmp.Or(strings.Compare(x.Key.ActorUID, y.Key.ActorUID), cmp.Compare(x.Key.EpochUnixNano, y.Key.EpochUnixNano), cmp.Compare(x.Key.Source, y.Key.Source))
	})
	for s, mark := range m.endedMarks {
		st.EndedMarks = append(st.EndedMarks, markState{Socket: s, Instance: mark.instance, Highest: mark.highest})
	}
	slices.SortFunc(st.EndedMarks, func(x, y markState) int { return strings.Compare(x.Socket, y.Socket) })
	m.exportContainers(st)
	if m.pending != nil {
		var dropped int
		st.Pending, dropped = m.pending.list()
		if dropped > 0 {
			m.logger.Warn("usage events not yet settled forgotten past the state's bound: a restart does not send them again", "forgotten", dropped, "bound", maxPendingEvents)
		}
	}
	return st
}

// decodeTotals returns the counter totals st holds, last seen at now.
func decodeTotals(st *agentState, now time.Time) (map[labelSet]*counterTotals, error) {
	totals := make(map[labelSet]*counterTotals, len(st.Totals))
	for i, ts := range st.Totals {
		l := labelSet{class: ts.Labels[0], source: ts.Labels[1], templateNamespace: ts.Labels[2], templateName: ts.Labels[3],
			actorUID: ts.Labels[4], actorName: ts.Labels[5], actorNamespace: ts.Labels[6], workerPool: ts.WorkerPool}
		for _, v := range append(ts.Labels[:], ts.WorkerPool) {
			if len(v) > maxLabelBytes {
				return nil, fmt.Errorf("totals[%d]: a label of %d bytes", i, len(v))
			}
		}
		if _, dup := totals[l]; dup {
			return nil, fmt.Errorf("totals[%d]: label set twice", i)
		}
		t := &counterTotals{lastSeen: now}
		t.values.has[rate.CounterCPU], t.values.start = true, now
		if ts.StartUnixNano > 0 && ts.StartUnixNano <= now.UnixNano() {
			t.values.start = time.Unix(0, ts.StartUnixNano)
		}
		for j, c := range ts.Counters {
			switch {
			case c.Counter < 0 || c.Counter >= rate.NumCounters || len(c.Interface) > rate.MaxInterfaceName:
				return nil, fmt.Errorf("totals[%d].counters[%d]: counter %d not known", i, j, c.Counter)
			case c.Interface != "" && !c.Counter.IsNetwork():
				return nil, fmt.Errorf("totals[%d].counters[%d]: counter %d per interface", i, j, c.Counter)
			case c.Interface != "":
				if t.values.perInterface == nil {
					t.values.perInterface = map[rate.CounterID]uint64{}
				}
				t.values.perInterface[rate.CounterID{Counter: c.Counter, Interface: c.Interface}] = c.Value
			default:
				t.values.has[c.Counter], t.values.total[c.Counter] = true, c.Value
			}
		}
		totals[l] = t
	}
	return totals, nil
}

// fitTotals returns totals as this run exports them, when --label-actor
// or --label-interface changed since the state was written: without actor
// labels the sets that differ only in them are summed into one, starting
// at the earliest's start (else they would be one Prometheus series
// served twice, a scrape's error, and whichever came first); the network
// counters kept in the other form (per interface, or their total) are
// dropped, their series end (their accounts start again from the next
// sample: rate.Accountant.Import).
func fitTotals(totals map[labelSet]*counterTotals, labelActor, labelInterface, labelPool bool) map[labelSet]*counterTotals {
	out := make(map[labelSet]*counterTotals, len(totals))
	for l, t := range totals {
		l.withPool = labelPool
		if !labelPool {
			l.workerPool = ""
		}
		if !labelActor {
			l.actorUID, l.actorName, l.actorNamespace = "", "", ""
		}
		if labelInterface {
			for c := range rate.NumCounters {
				if c.IsNetwork() {
					t.values.has[c], t.values.total[c] = false, 0
				}
			}
		} else {
			t.values.perInterface = nil
		}
		o := out[l]
		if o == nil {
			out[l] = t
			continue
		}
		for c := range rate.NumCounters {
			if t.values.has[c] {
				o.values.add(rate.CounterID{Counter: c}, t.values.total[c])
			}
		}
		for id, v := range t.values.perInterface {
			o.values.add(id, v)
		}
		if t.values.start.Before(o.values.start) { // the sum accrued since the earliest
			o.values.start = t.values.start
		}
	}
	return out
}

// checkState returns why st does not hold together (nil if it does): what
// restoreState would refuse, checked before the agent is made of it.
func checkState(st *agentState, now time.Time) error {
	if _, err := decodeTotals(st, now); err != nil {
		return err
	}
	if err := checkContainers(st, now); err != nil {
		return err
	}
	for i, ev := range st.Pending {
		// The pipeline settles an event by its record's log.record.uid:
		// one kept under another uid, or of a kind never kept, would be
		// sent again at every restart.
		var uid, kind string
		for _, a := range ev.Attrs {
			switch {
			case a.Key == string(attrRecordUID) && a.Type == "s":
				uid = a.S
			case a.Key == string(attrKind) && a.Type == "s":
				kind = a.S
			}
		}
		if ev.UID == "" || uid != ev.UID || kind == KindPeriodic {
			return fmt.Errorf("pending_events[%d]: uid %s, its record's %s, kind %s", i, foreign.Quote(ev.UID), foreign.Quote(uid), foreign.Quote(kind))
		}
	}
	return rate.NewAccountant(rate.AccountantConfig{}).Import(st.Accountant, now)
}

// restoreState makes st (checked: checkState) the agent's memory, seen
// again at now: the accountant continues every account, the counters
// continue from their totals, an activation's owner and each daemon's
// ended mark are known (no initial twice, a gap across the restart is
// counted), and the events left pending are pending again. Called before
// the first sweep.
func (m *metrics) restoreState(st *agentState, now time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	totals, err := decodeTotals(st, now)
	if err != nil {
		return err
	}
	if err := m.acct.Import(st.Accountant, now); err != nil {
		return err
	}
	if err := m.restoreContainers(st, now); err != nil {
		return err
	}
	m.totals = fitTotals(totals, m.cfg.LabelActor, m.cfg.LabelInterface, m.cfg.LabelWorkerPool)
	// The templates exported by name keep their slots (not the first
	// sampled after the restart): their usage stays under their names.
	for l := range m.totals {
		if l.templateNamespace != otherTemplate || l.templateName != otherTemplate {
			m.templates.use(l.templateNamespace, l.templateName, now, false)
		}
	}
	for _, o := range st.Owners {
		k := rate.ActivationKey{ActorUID: o.Key.ActorUID, Source: sandboxstatsv1.StatsSource(o.Key.Source), EpochUnixNano: o.Key.EpochUnixNano}
		m.owners[k] = owner{socket: o.Socket, lastSeen: now}
	}
	for _, mk := range st.EndedMarks {
		m.endedMarks[mk.Socket] = endedMark{instance: mk.Instance, highest: mk.Highest, lastSeen: now}
	}
	if m.pending != nil {
		for _, ev := range st.Pending {
			m.pending.add(ev)
		}
	}
	return nil
}

// resendPending emits again the events a previous process left pending.
func (m *metrics) resendPending(now time.Time) {
	if m.otel == nil || m.pending == nil {
		return
	}
	evs, _ := m.pending.list()
	if len(evs) > 0 {
		m.logger.Info("sending again the usage events a previous agent left unsettled", "events", len(evs))
		m.otel.resendPending(evs, now)
	}
}
