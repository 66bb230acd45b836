package nodeagent

// The per-container series across restarts (--state-dir): the container
// accountant's accounts and each series' CPU charged, beside the
// workloads' (state.go). A file without them (an older agent's) restores
// none: the containers then start as at a first start.

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sandboxstats/sandboxstats/internal/rate"
)

// containerTotalState is one per-container series' CPU.
type containerTotalState struct {
	// Labels as totalState's; CAdvisor: only the actor's namespace and
	// name are set (a cAdvisor-shaped series).
	Labels        [7]string `json:"labels"`
	Container     string    `json:"container"`
	CAdvisor      bool      `json:"cadvisor,omitempty"`
	WorkerPool    string    `json:"worker_pool,omitempty"`
	CPUUsec       uint64    `json:"cpu_usec"`
	StartUnixNano int64     `json:"start_unix_nano"`
}

// exportContainers adds the per-container state to st.
func (m *metrics) exportContainers(st *agentState) {
	acct := m.cacct.Export()
	st.ContainerAccountant = &acct
	st.ContainerLedgers = m.exportLedgers()
	for k, cv := range m.containers {
		l := k.labels
		st.ContainerTotals = append(st.ContainerTotals, containerTotalState{
			Labels:    [7]string{l.class, l.source, l.templateNamespace, l.templateName, l.actorUID, l.actorName, l.actorNamespace},
			Container: k.container, CAdvisor: k.cadvisor, WorkerPool: l.workerPool, CPUUsec: cv.cpu, StartUnixNano: cv.start.UnixNano(),
		})
	}
	slices.SortFunc(st.ContainerTotals, func(x, y containerTotalState) int {
		return cmp.Or(slices.Compare(x.Labels[:], y.Labels[:]), strings.Compare(x.Container, y.Container), compareBool(x.CAdvisor, y.CAdvisor))
	})
}

func compareBool(x, y bool) int {
	switch {
	case x == y:
		return 0
	case x:
		return 1
	}
	return -1
}

// decodeContainers returns the per-container series st holds, seen at
// now, as this run exports them: without LabelActor the actor labels are
// dropped (the series that then share labels summed), without
// CAdvisorCompat the cAdvisor-shaped ones are left out.
func decodeContainers(st *agentState, now time.Time, labelActor, cadvisor, labelPool bool) (map[containerKey]*containerValues, error) {
	out := make(map[containerKey]*containerValues, len(st.ContainerTotals))
	for i, ct := range st.ContainerTotals {
		for _, v := range append(ct.Labels[:], ct.Container) {
			if len(v) > maxLabelBytes || !utf8.ValidString(v) {
				return nil, fmt.Errorf("container_totals[%d]: a label of %d bytes or not UTF-8", i, len(v))
			}
		}
		if ct.CAdvisor && !cadvisor {
			continue
		}
		l := labelSet{class: ct.Labels[0], source: ct.Labels[1], templateNamespace: ct.Labels[2], templateName: ct.Labels[3],
			actorUID: ct.Labels[4], actorName: ct.Labels[5], actorNamespace: ct.Labels[6]}
		if !labelActor && !ct.CAdvisor {
			l.actorUID, l.actorName, l.actorNamespace = "", "", ""
		}
		if labelPool && !ct.CAdvisor {
			l.workerPool, l.withPool = ct.WorkerPool, true
		}
		k := containerKey{labels: l, container: ct.Container, cadvisor: ct.CAdvisor}
		start := time.Unix(0, ct.StartUnixNano)
		if ct.StartUnixNano == 0 || start.After(now) {
			start = now
		}
		cv := out[k]
		if cv == nil {
			cv = &containerValues{start: start}
			out[k] = cv
		}
		cv.cpu = addSat(cv.cpu, ct.CPUUsec)
		cv.lastSeen = now
		if start.Before(cv.start) {
			cv.start = start
		}
	}
	return out, nil
}

// restoreContainers makes st's per-container state m's (called with mu
// held, by restoreState).
func (m *metrics) restoreContainers(st *agentState, now time.Time) error {
	cs, err := decodeContainers(st, now, m.cfg.LabelActor, m.cfg.CAdvisorCompat, m.cfg.LabelWorkerPool)
	if err != nil {
		return err
	}
	if st.ContainerAccountant != nil {
		if err := m.cacct.Import(*st.ContainerAccountant, now); err != nil {
			return fmt.Errorf("container accountant: %w", err)
		}
	}
	ledgers, err := decodeLedgers(st.ContainerLedgers, now)
	if err != nil {
		return err
	}
	m.containers, m.ledgers = cs, ledgers
	return nil
}

// checkContainers is checkState's part for the containers.
func checkContainers(st *agentState, now time.Time) error {
	if _, err := decodeContainers(st, now, true, true, true); err != nil {
		return err
	}
	if _, err := decodeLedgers(st.ContainerLedgers, now); err != nil {
		return err
	}
	if st.ContainerAccountant != nil {
		return rate.NewAccountant(rate.AccountantConfig{}).Import(*st.ContainerAccountant, now)
	}
	return nil
}
