// This file fills the signal parts of a Reading that v1 and v2 share in
// shape: pids, pressure, and the bookkeeping of absent parts and fields.

package gvisor

import (
	"slices"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// part collects the absent fields of one signal part of a Reading
// ("memory_signals", "pids", ...) while it is filled.
type part struct {
	name    string
	present bool
	missing []source.Absent
}

// absent records field (the proto's name below the part) as absent.
func (p *part) absent(field, why string) {
	p.missing = append(p.missing, source.Absent{Field: p.name + "." + field, Reason: why})
}

// done writes the part's absent fields into r when any field was there;
// otherwise the part itself is absent, with its fields' reasons.
func (p *part) done(r *source.Reading) bool {
	if p.present {
		r.Absent = append(r.Absent, p.missing...)
		return true
	}
	var why []string
	for _, m := range p.missing {
		if !slices.Contains(why, m.Reason) {
			why = append(why, m.Reason)
		}
	}
	absent(r, p.name, strings.Join(why, "; "))
	return false
}

// set stores v in *dst when ok, else records field absent.
func set[T any](p *part, dst **T, v T, ok bool, field, why string) {
	if !ok {
		p.absent(field, why)
		return
	}
	*dst, p.present = &v, true
}

// keyed takes key of a parsed flat keyed file into *dst, or records field
// absent: why when the file was not read, missingKey(key) when it lacks the
// key (made only then: a sample's paths are joined only for a reason).
func keyed(p *part, dst **uint64, m map[string]uint64, ok bool, key, field, why string, missingKey func(key string) string) {
	if ok {
		if v, has := m[key]; has {
			set(p, dst, v, true, field, "")
		} else {
			p.absent(field, missingKey(key))
		}
		return
	}
	p.absent(field, why)
}

// fillPids fills r.Pids from pids.current (required for the part) and
// pids.max; whyNil says why a nil request was not made.
func fillPids(r *source.Reading, cur, lim *fileReq, whyNil string) error {
	n, ok, why, err := optParse(cur, whyNil, parseSingleUint)
	if err != nil {
		return err
	}
	if !ok {
		absent(r, "pids", why)
		return nil
	}
	r.Pids = &source.Pids{Current: n}
	l, ok, why, err := optParse(lim, whyNil, parseLimit)
	if err != nil {
		return err
	}
	if ok {
		r.Pids.Limit = &l
	} else {
		absent(r, "pids.limit", why)
	}
	return nil
}

// fillPressure fills r.Pressure from the cpu, memory and io PSI files of one
// v2 cgroup; whyNil says why nil requests were not made.
func fillPressure(r *source.Reading, cpu, mem, io *fileReq, whyNil string) error {
	p := part{name: "pressure"}
	out := &source.Pressure{}
	for _, res := range []struct {
		name string
		f    *fileReq
		dst  **source.PressureStall
	}{{"cpu", cpu, &out.CPU}, {"memory", mem, &out.Memory}, {"io", io, &out.IO}} {
		t, ok, why, err := optParse(res.f, whyNil, parsePressure)
		if err != nil {
			return err
		}
		if !ok {
			p.absent(res.name, why)
			continue
		}
		*res.dst, p.present = &source.PressureStall{SomeUsec: t.Some, FullUsec: t.Full}, true
		if t.Full == nil {
			why := "no \"full\" line in " + res.f.path()
			if res.name == "cpu" {
				why += " (cpu full needs Linux 5.13)"
			}
			p.absent(res.name+".full_usec", why)
		}
	}
	if p.done(r) {
		r.Pressure = out
	}
	return nil
}
