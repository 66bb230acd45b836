package hoststat

// This file is the KVM QMP view: one QMP session per sample (query-stats of
// targets vm and vcpu, kinds and units from query-stats-schemas).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// qmpView reads KVM statistics through QEMU's QMP query-stats when the ref
// names a QMP socket.
func (s *sampler) qmpView(ctx context.Context, vmmPID int32) *source.KVMSourceView {
	sock := s.ref.QMPSocket
	if sock == "" {
		return &source.KVMSourceView{
			Source: source.KVMSourceQMP,
			State:  source.KVMSourceStateNotConfigured,
			Reason: "no QMP socket in the sandbox ref",
		}
	}
	timeout := s.cfg.ReadTimeout
	cacheKey := ""
	if vmmPID > 0 {
		cacheKey = fmt.Sprintf("%s\x00%d", sock, vmmPID)
	}
	v, err := bounded.Do(ctx, s.g, "hoststat:qmp:"+sock, func() (*source.KVMSourceView, error) {
		v, schemas, err := queryQMPStats(sock, time.Now().Add(timeout), s.cachedSchemas(cacheKey))
		if err == nil && cacheKey != "" {
			s.qmpMu.Lock()
			s.qmpSchemas = map[string]map[string]qmpSchema{cacheKey: schemas}
			s.qmpMu.Unlock()
		}
		return v, err
	})
	if err != nil {
		return unavailableView(source.KVMSourceQMP, sock, err.Error())
	}
	return v
}

// cachedSchemas returns the schemas cached for key, or nil.
func (s *sampler) cachedSchemas(key string) map[string]qmpSchema {
	if key == "" {
		return nil
	}
	s.qmpMu.Lock()
	defer s.qmpMu.Unlock()
	return s.qmpSchemas[key]
}

// queryQMPStats connects, negotiates capabilities and reads the KVM stats
// schemas (unless given), the vCPU list and query-stats for targets vcpu and
// vm, all before deadline. The connection is closed before it returns: a
// QMP socket serves one client at a time, so it is never held.
func queryQMPStats(sock string, deadline time.Time, schemas map[string]qmpSchema) (*source.KVMSourceView, map[string]qmpSchema, error) {
	d := net.Dialer{Deadline: deadline}
	c, err := d.Dial("unix", sock)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: qmp %s: %w", source.ErrNotMeasurable, sock, err)
	}
	defer c.Close()
	if err := c.SetDeadline(deadline); err != nil {
		return nil, nil, err
	}
	q := newQMPConn(c)
	greeting, err := q.readMessage(maxQMPGreeting)
	if err != nil {
		return nil, nil, fmt.Errorf("qmp %s greeting: %w", sock, err)
	}
	if greeting.QMP == nil {
		return nil, nil, fmt.Errorf("%w: qmp %s: first message is not a QMP greeting", source.ErrMalformed, sock)
	}
	if _, err := q.execute("qmp_capabilities", nil); err != nil {
		return nil, nil, fmt.Errorf("qmp %s: %w", sock, err)
	}
	if schemas == nil {
		schemaRaw, err := q.execute("query-stats-schemas", map[string]any{"provider": "kvm"})
		if err != nil {
			return nil, nil, fmt.Errorf("qmp %s: %w", sock, err)
		}
		if schemas, err = parseQMPSchemas(schemaRaw); err != nil {
			return nil, nil, fmt.Errorf("qmp %s query-stats-schemas: %w", sock, err)
		}
	}
	cpusRaw, err := q.execute("query-cpus-fast", nil)
	if err != nil {
		return nil, nil, fmt.Errorf("qmp %s: %w", sock, err)
	}
	cpus, err := parseQMPCPUs(cpusRaw)
	if err != nil {
		return nil, nil, fmt.Errorf("qmp %s query-cpus-fast: %w", sock, err)
	}
	v := &source.KVMSourceView{Source: source.KVMSourceQMP, Origin: sock}
	for _, target := range []string{"vm", "vcpu"} {
		raw, err := q.execute("query-stats", map[string]any{"target": target, "providers": []map[string]string{{"provider": "kvm"}}})
		if err != nil {
			return nil, nil, fmt.Errorf("qmp %s: %w", sock, err)
		}
		counters, err := parseQMPStats(raw, target, schemas, cpus)
		if err != nil {
			return nil, nil, fmt.Errorf("qmp %s query-stats target %s: %w", sock, target, err)
		}
		v.Counters = append(v.Counters, counters...)
	}
	v.State = source.KVMSourceStateAvailable
	if len(v.Counters) == 0 {
		v.State = source.KVMSourceStateUnavailable
		v.Reason = "query-stats returned no kvm statistics (QEMU not using KVM?)"
	}
	return v, schemas, nil
}

// qmpSchema is one statistic's type from query-stats-schemas.
type qmpSchema struct {
	Type     string `json:"type"`
	Unit     string `json:"unit"`
	Base     int    `json:"base"`
	Exponent int    `json:"exponent"`
}

// parseQMPSchemas maps "<target>/<name>" to its schema.
func parseQMPSchemas(raw []byte) (map[string]qmpSchema, error) {
	var reply []struct {
		Provider string `json:"provider"`
		Target   string `json:"target"`
		Stats    []struct {
			Name string `json:"name"`
			qmpSchema
		} `json:"stats"`
	}
	if err := json.Unmarshal(raw, &reply); err != nil {
		return nil, fmt.Errorf("%w: %w", source.ErrMalformed, err)
	}
	out := make(map[string]qmpSchema)
	for _, r := range reply {
		if r.Provider != "kvm" {
			continue
		}
		for _, st := range r.Stats {
			// The unit is copied into every counter of the statistic:
			// cut where it enters, like the names.
			st.Unit, st.Type = foreign.Bound(st.Unit, maxQMPName), foreign.Bound(st.Type, maxQMPName)
			out[foreign.Bound(r.Target, maxQMPName)+"/"+foreign.Bound(st.Name, maxQMPName)] = st.qmpSchema
		}
	}
	return out, nil
}

// parseQMPCPUs maps a vCPU's qom-path to its cpu-index.
func parseQMPCPUs(raw []byte) (map[string]int32, error) {
	var reply []struct {
		CPUIndex int32  `json:"cpu-index"`
		QOMPath  string `json:"qom-path"`
	}
	if err := json.Unmarshal(raw, &reply); err != nil {
		return nil, fmt.Errorf("%w: %w", source.ErrMalformed, err)
	}
	out := make(map[string]int32, len(reply))
	for _, c := range reply {
		out[c.QOMPath] = c.CPUIndex
	}
	return out, nil
}

// Bounds of what a query-stats reply may put in an answer: QEMU's names
// are short (KVM statistic names, QOM paths such as
// /machine/unattached/device[0]), and a VM has at most a few thousand
// counters (about 40 per vCPU).
const (
	maxQMPName     = 128
	maxQMPCounters = 8192
)

// parseQMPStats turns a query-stats reply into counters. Histograms (arrays)
// are left out; booleans become 0/1; kind and unit come from the schema
// (cumulative -> cumulative, instant -> gauge, peak -> peak).
func parseQMPStats(raw []byte, target string, schemas map[string]qmpSchema, cpus map[string]int32) ([]source.KVMCounter, error) {
	var reply []struct {
		Provider string `json:"provider"`
		QOMPath  string `json:"qom-path"`
		Stats    []struct {
			Name  string          `json:"name"`
			Value json.RawMessage `json:"value"`
		} `json:"stats"`
	}
	if err := json.Unmarshal(raw, &reply); err != nil {
		return nil, fmt.Errorf("%w: %w", source.ErrMalformed, err)
	}
	var out []source.KVMCounter
	for _, r := range reply {
		if r.Provider != "" && r.Provider != "kvm" {
			continue
		}
		scope := "vm"
		if target == "vcpu" {
			// A vCPU that query-cpus-fast does not list is named by its QOM
			// path: its position in this reply could equal a real vCPU's
			// index.
			if idx, ok := cpus[r.QOMPath]; ok {
				scope = "vcpu" + strconv.Itoa(int(idx))
			} else {
				scope = "qom:" + foreign.Bound(r.QOMPath, maxQMPName)
			}
		}
		for _, st := range r.Stats {
			st.Name = foreign.Bound(st.Name, maxQMPName)
			val, ok, err := qmpValue(st.Value)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", scope, st.Name, err)
			}
			if !ok {
				continue // histogram
			}
			sch, known := schemas[target+"/"+st.Name]
			kind := qmpKind(sch.Type)
			if !known || kind == source.KVMCounterKindUnspecified {
				if sch.Type == "linear-histogram" || sch.Type == "log2-histogram" {
					continue
				}
				kind = kvmKind(st.Name, 0)
			}
			unit := qmpUnit(sch)
			if !known {
				unit = kvmUnit(st.Name)
			}
			if len(out) == maxQMPCounters {
				return nil, fmt.Errorf("%w: more than %d statistics", source.ErrMalformed, maxQMPCounters)
			}
			out = append(out, source.KVMCounter{Name: st.Name, Kind: kind, Scope: scope, Value: val, Unit: unit})
		}
	}
	slices.SortStableFunc(out, func(a, b source.KVMCounter) int {
		if c := compareScope(a.Scope, b.Scope); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

// compareScope orders "vm" first, then vCPUs by number.
func compareScope(a, b string) int {
	na, erra := strconv.Atoi(strings.TrimPrefix(a, "vcpu"))
	nb, errb := strconv.Atoi(strings.TrimPrefix(b, "vcpu"))
	if erra == nil && errb == nil && strings.HasPrefix(a, "vcpu") && strings.HasPrefix(b, "vcpu") {
		return na - nb
	}
	return strings.Compare(strings.Replace(a, "vm", "\x00", 1), strings.Replace(b, "vm", "\x00", 1))
}

// qmpValue decodes a stat value: a non-negative integer, a boolean (0/1), or
// an array (histogram, ok=false).
func qmpValue(raw json.RawMessage) (uint64, bool, error) {
	t := bytes.TrimSpace(raw)
	switch {
	case len(t) == 0:
		return 0, false, fmt.Errorf("%w: empty value", source.ErrMalformed)
	case t[0] == '[':
		return 0, false, nil
	case bytes.Equal(t, []byte("true")):
		return 1, true, nil
	case bytes.Equal(t, []byte("false")):
		return 0, true, nil
	}
	v, err := strconv.ParseUint(string(t), 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("%w: value %s: %w", source.ErrMalformed, foreign.QuoteBytes(t), err)
	}
	return v, true, nil
}

func qmpKind(t string) source.KVMCounterKind {
	switch t {
	case "cumulative":
		return source.KVMCounterKindCumulative
	case "instant":
		return source.KVMCounterKindGauge
	case "peak":
		return source.KVMCounterKindPeak
	}
	return source.KVMCounterKindUnspecified
}

// qmpUnit renders a schema's unit with its scale: seconds at 10^-9 is "ns".
func qmpUnit(s qmpSchema) string {
	unit := s.Unit
	if unit == "" {
		unit = "count"
	}
	if s.Exponent == 0 {
		return unit
	}
	if unit == "seconds" && s.Base == 10 {
		switch s.Exponent {
		case -9:
			return "ns"
		case -6:
			return "usec"
		case -3:
			return "ms"
		}
	}
	return fmt.Sprintf("%s*%d^%d", unit, s.Base, s.Exponent)
}
