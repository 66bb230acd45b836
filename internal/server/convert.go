package server

import (
	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// source.Class and source.Kind are numbered like the wire's SandboxClass and
// StatsSource (TestEnumsConvertByNumber holds it), so they convert by number;
// a class the wire sends that this build does not know fails validation.
func classToProto(c source.Class) sandboxstatsv1.SandboxClass { return sandboxstatsv1.SandboxClass(c) }

func classFromProto(c sandboxstatsv1.SandboxClass) source.Class { return source.Class(c) }

func kindToProto(k source.Kind) sandboxstatsv1.StatsSource { return sandboxstatsv1.StatsSource(k) }

func refFromProto(r *sandboxstatsv1.SandboxRef) source.SandboxRef {
	return source.SandboxRef{
		Class:        classFromProto(r.GetSandboxClass()),
		CgroupPath:   r.GetCgroupPath(),
		SentryPID:    int(r.GetSentryPid()),
		AgentAddress: r.GetAgentAddress(),
		ContainerIDs: r.GetContainerIds(),
		VMMPID:       int(r.GetVmmPid()),
		VMMPIDFile:   r.GetVmmPidFile(),
		QMPSocket:    r.GetQmpSocket(),
		Containers:   containerRefsFromProto(r.GetContainers()),
	}
}

// containerRefsFromProto converts the wire's ContainerRefs (nil for none).
func containerRefsFromProto(cs []*sandboxstatsv1.ContainerRef) []source.ContainerRef {
	var out []source.ContainerRef
	for _, c := range cs {
		out = append(out, source.ContainerRef{ID: c.GetId(), Name: c.GetName()})
	}
	return out
}

// identityFromProto converts the wire WorkloadIdentity.
func identityFromProto(id *sandboxstatsv1.WorkloadIdentity) identity.Identity {
	return identity.Identity{
		ActorUID:          id.GetActorUid(),
		ActorName:         id.GetActorName(),
		ActorNamespace:    id.GetActorNamespace(),
		TemplateNamespace: id.GetTemplateNamespace(),
		TemplateName:      id.GetTemplateName(),
		WorkerPool:        id.GetWorkerPool(),
	}
}

func identityToProto(id identity.Identity) *sandboxstatsv1.WorkloadIdentity {
	return &sandboxstatsv1.WorkloadIdentity{
		ActorUid:          id.ActorUID,
		ActorName:         id.ActorName,
		ActorNamespace:    id.ActorNamespace,
		TemplateNamespace: id.TemplateNamespace,
		TemplateName:      id.TemplateName,
		WorkerPool:        id.WorkerPool,
	}
}

// sampleFromReading attributes a reading to the binding it was read for;
// its epoch baseline is baselines' (shared: read-only).
func sampleFromReading(b *identity.Binding, r source.Reading, observedAtUnixNano int64, baselines *baselineCache) *sandboxstatsv1.WorkloadStatsSample {
	s := readingToSample(b.Identity, b.Ref.Class, b.EpochUnixNano, r, observedAtUnixNano)
	s.EpochBaseline = baselines.of(b.Activation.Baseline(), b.Identity, b.Ref.Class, b.EpochUnixNano)
	if s.EpochBaseline == nil {
		s.Absent = append(s.Absent, &sandboxstatsv1.AbsentValue{Field: "epoch_baseline",
			Reason: "not taken yet: the guest agent's counters survive a restore, and no read of this epoch has succeeded"})
	}
	return s
}

// readingToSample attributes a reading to an identity and epoch.
func readingToSample(id identity.Identity, class source.Class, epoch int64, r source.Reading, observedAtUnixNano int64) *sandboxstatsv1.WorkloadStatsSample {
	b := new(struct {
		sample  sandboxstatsv1.WorkloadStatsSample
		signals signalBlocks
	})
	s := &b.sample
	*s = sandboxstatsv1.WorkloadStatsSample{
		ActorUid:              id.ActorUID,
		ActorName:             id.ActorName,
		ActorNamespace:        id.ActorNamespace,
		TemplateNamespace:     id.TemplateNamespace,
		TemplateName:          id.TemplateName,
		WorkerPool:            id.WorkerPool,
		SandboxClass:          classToProto(class),
		Source:                kindToProto(r.Kind),
		SourceDetail:          r.Detail,
		MemoryCurrentBytes:    r.MemoryCurrentBytes,
		MemoryPeakBytes:       r.MemoryPeakBytes,
		MemoryWorkingSetBytes: r.MemoryWorkingSetBytes,
		CpuUsageUsec:          r.CPUUsageUsec,
		ObservedAtUnixNano:    observedAtUnixNano,
		EpochUnixNano:         epoch,
		SandboxProcesses:      r.SandboxProcesses,
	}
	for _, c := range r.UnreadContainers {
		s.UnreadContainers = append(s.UnreadContainers, &sandboxstatsv1.ContainerReadError{ContainerId: c.ID, Reason: c.Reason})
	}
	s.Absent = absentToProto(r.Absent, 1) // room for epoch_baseline's
	s.SandboxOwnCpuUsec = r.SandboxOwnCPUUsec
	s.Containers = containersToProto(r.Containers)
	signalsToProto(s, r, &b.signals)
	return s
}

// containersToProto converts a reading's containers into messages of their
// own (the cuts may change them; the domain values stay as they were).
func containersToProto(cs []source.Container) []*sandboxstatsv1.ContainerStats {
	if len(cs) == 0 {
		return nil
	}
	vals := make([]sandboxstatsv1.ContainerStats, len(cs)) // the messages in one block
	out := make([]*sandboxstatsv1.ContainerStats, len(cs))
	for i, c := range cs {
		m := &vals[i]
		m.Id, m.Name = c.ID, c.Name
		m.CpuUsageUsec, m.CpuUserUsec, m.CpuSystemUsec = c.CPUUsageUsec, c.CPUUserUsec, c.CPUSystemUsec
		m.MemoryCurrentBytes, m.MemoryWorkingSetBytes, m.MemoryIsOwn = c.MemoryCurrentBytes, c.MemoryWorkingSetBytes, c.MemoryIsOwn
		m.PidsCurrent, m.Exited = c.PidsCurrent, c.Exited
		m.Absent = absentToProto(c.Absent, 0)
		out[i] = m
	}
	return out
}

// absentToProto converts absent values (nil for none), with room for more
// entries appended later. The messages are made in one block: a micro-VM
// sample names a dozen in every answer.
func absentToProto(list []source.Absent, room int) []*sandboxstatsv1.AbsentValue {
	if len(list) == 0 {
		return nil
	}
	vals := make([]sandboxstatsv1.AbsentValue, len(list))
	out := make([]*sandboxstatsv1.AbsentValue, len(list), len(list)+room)
	for i, a := range list {
		vals[i].Field, vals[i].Reason = a.Field, a.Reason
		out[i] = &vals[i]
	}
	return out
}

// splitKnownAbsent parts absent values into the KnownAbsent codes of those
// that have one and the rest (a new slice: list is left as it was).
func splitKnownAbsent(list []source.Absent) ([]sandboxstatsv1.KnownAbsent, []source.Absent) {
	var (
		codes []sandboxstatsv1.KnownAbsent
		rest  []source.Absent
	)
	for i, a := range list {
		code := api.KnownAbsentCode(a.Field, a.Reason)
		if code == sandboxstatsv1.KnownAbsent_KNOWN_ABSENT_UNSPECIFIED {
			rest = append(rest, a)
			continue
		}
		if codes == nil {
			codes = make([]sandboxstatsv1.KnownAbsent, 0, len(list)-i)
		}
		codes = append(codes, code)
	}
	return codes, rest
}
