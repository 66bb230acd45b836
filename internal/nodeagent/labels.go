package nodeagent

import (
	"unicode/utf8"

	"google.golang.org/grpc/codes"

	"github.com/sandboxstats/sandboxstats/internal/api"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// labelSet is one series' labels; actor fields are empty without LabelActor.
type labelSet struct {
	class, source, templateNamespace, templateName string
	// workerPool is the identity's worker pool; withPool: the set has the
	// worker_pool label (LabelWorkerPool; never a per-template set of the
	// per-activation series).
	workerPool                          string
	withPool                            bool
	actorUID, actorName, actorNamespace string
}

// maxLabelBytes bounds a label value taken from a daemon's answer: statsd
// accepts identity fields of at most 253 bytes, so only a daemon that is
// not statsd sends longer ones, and each would be repeated in every series.
const maxLabelBytes = 253

// unmeasuredSource is the source label of a workload bound but not
// measured (STATS_SOURCE_UNSPECIFIED).
var unmeasuredSource = api.SourceName(sandboxstatsv1.StatsSource_STATS_SOURCE_UNSPECIFIED)

// unknownLabel is the label value of an enum value this build does not
// know (a newer or a hostile daemon's): never its number.
const unknownLabel = "unknown"

// cut returns s cut to maxLabelBytes at a rune boundary.
func cut(s string) string {
	if len(s) <= maxLabelBytes {
		return s
	}
	s = s[:maxLabelBytes]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// classLabel is api.ClassName, "unknown" for a value this build does not know.
func classLabel(c sandboxstatsv1.SandboxClass) string {
	if _, known := sandboxstatsv1.SandboxClass_name[int32(c)]; !known {
		return unknownLabel
	}
	return api.ClassName(c)
}

// knownSource reports whether s is a source whose numbers this build knows
// how to compare and sum (cgroup, guest agent).
func knownSource(s sandboxstatsv1.StatsSource) bool {
	return s == sandboxstatsv1.StatsSource_STATS_SOURCE_CGROUP || s == sandboxstatsv1.StatsSource_STATS_SOURCE_GUEST_AGENT
}

// sourceLabel is api.SourceName, "unknown" for a value this build does not
// know.
func sourceLabel(s sandboxstatsv1.StatsSource) string {
	if _, known := sandboxstatsv1.StatsSource_name[int32(s)]; !known {
		return unknownLabel
	}
	return api.SourceName(s)
}

// driftKindLabel is api.DriftKindName, "unknown" for a value this build does
// not know.
func driftKindLabel(k sandboxstatsv1.DriftKind) string {
	if _, known := sandboxstatsv1.DriftKind_name[int32(k)]; !known {
		return unknownLabel
	}
	return api.DriftKindName(k)
}

// codeLabel is a gRPC code's name ("DeadlineExceeded"), "unknown" for a
// number gRPC does not define (codes.Code's String would print
// "Code(99)").
func codeLabel(c codes.Code) string {
	if c > codes.Unauthenticated {
		return unknownLabel
	}
	return c.String()
}

func (m *metrics) labelsOf(s *sandboxstatsv1.WorkloadStatsSample) labelSet {
	l := labelSet{
		class:             classLabel(s.GetSandboxClass()),
		source:            sourceLabel(s.GetSource()),
		templateNamespace: cut(s.GetTemplateNamespace()),
		templateName:      cut(s.GetTemplateName()),
	}
	if m.cfg.LabelActor {
		l.actorUID, l.actorName, l.actorNamespace = cut(s.GetActorUid()), cut(s.GetActorName()), cut(s.GetActorNamespace())
	}
	if m.cfg.LabelWorkerPool {
		l.workerPool, l.withPool = cut(s.GetWorkerPool()), true
	}
	return l
}

// endedLabels returns the per-template labels of an ended activation, and
// with LabelActor its actor's too.
func (m *metrics) endedLabels(e *sandboxstatsv1.EndedActivation) (template, workload labelSet) {
	id := e.GetIdentity()
	template = labelSet{
		class: classLabel(e.GetSandboxClass()), source: sourceLabel(e.GetSource()),
		templateNamespace: cut(id.GetTemplateNamespace()), templateName: cut(id.GetTemplateName()),
	}
	workload = template
	if m.cfg.LabelWorkerPool {
		workload.workerPool, workload.withPool = cut(id.GetWorkerPool()), true
	}
	if m.cfg.LabelActor {
		workload.actorUID, workload.actorName, workload.actorNamespace = cut(id.GetActorUid()), cut(id.GetActorName()), cut(id.GetActorNamespace())
	}
	return template, workload
}

func (l labelSet) values(withActor bool) []string {
	v := []string{l.class, l.source, l.templateNamespace, l.templateName}
	if l.withPool {
		v = append(v, l.workerPool)
	}
	if withActor {
		v = append(v, l.actorUID, l.actorName, l.actorNamespace)
	}
	return v
}
