package hoststat

// window_test.go (and window.go, render.go) still take the wire HostStats
// until the output code moves out of hoststat. This file gives them wire
// samples from the domain sampler: fixtureSampler, unavailable and toWire.
// toWire is generic (each proto field takes the domain field of the same
// name, enums by number), so it is no second field list to keep in step with
// internal/server's converter.

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// wireSampler is a Sampler whose samples come back in wire form.
type wireSampler struct{ s *Sampler }

func (w wireSampler) SampleHost(ctx context.Context) (*sandboxstatsv1.HostStats, error) {
	hs, err := w.s.SampleHost(ctx)
	if err != nil {
		return nil, err
	}
	return toWire(hs), nil
}

// fixtureSampler is newFixtureSampler answering in wire form.
func fixtureSampler(t testing.TB, ref source.SandboxRef, debugfs string) wireSampler {
	return wireSampler{newFixtureSampler(t, ref, debugfs)}
}

// unavailable is unavailableView in wire form.
func unavailable(src sandboxstatsv1.KvmSource, origin, reason string) *sandboxstatsv1.KvmSourceView {
	return &sandboxstatsv1.KvmSourceView{Source: src, State: sandboxstatsv1.KvmSourceState_KVM_SOURCE_STATE_UNAVAILABLE, Origin: origin, Reason: reason}
}

func toWire(h *source.HostStats) *sandboxstatsv1.HostStats {
	if h == nil {
		return nil
	}
	m := &sandboxstatsv1.HostStats{}
	fillWire(m.ProtoReflect(), reflect.ValueOf(h).Elem())
	return m
}

// normName folds a Go or proto field name: "VMMThreads", "vmm_threads" ->
// "vmmthreads".
func normName(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }

func fillWire(m protoreflect.Message, v reflect.Value) {
	fields := make(map[string]reflect.Value, v.NumField())
	for i := range v.NumField() {
		fields[normName(v.Type().Field(i).Name)] = v.Field(i)
	}
	fds := m.Descriptor().Fields()
	for i := range fds.Len() {
		fd := fds.Get(i)
		f, ok := fields[normName(string(fd.Name()))]
		if !ok {
			panic(fmt.Sprintf("no domain field for %s", fd.FullName()))
		}
		switch {
		case fd.IsList():
			if f.Len() == 0 {
				continue
			}
			l := m.Mutable(fd).List()
			for j := range f.Len() {
				e := f.Index(j)
				if fd.Kind() == protoreflect.MessageKind {
					el := l.NewElement()
					fillWire(el.Message(), reflect.Indirect(e))
					l.Append(el)
				} else {
					l.Append(wireScalar(fd, e))
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			if !f.IsNil() {
				fillWire(m.Mutable(fd).Message(), f.Elem())
			}
		case f.Kind() == reflect.Pointer:
			if !f.IsNil() {
				m.Set(fd, wireScalar(fd, f.Elem()))
			}
		default:
			m.Set(fd, wireScalar(fd, f))
		}
	}
}

func wireScalar(fd protoreflect.FieldDescriptor, v reflect.Value) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber(v.Int()))
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(v.String())
	case protoreflect.Int32Kind:
		return protoreflect.ValueOfInt32(int32(v.Int()))
	case protoreflect.Int64Kind:
		return protoreflect.ValueOfInt64(v.Int())
	case protoreflect.Uint32Kind:
		return protoreflect.ValueOfUint32(uint32(v.Uint()))
	case protoreflect.Uint64Kind:
		return protoreflect.ValueOfUint64(v.Uint())
	}
	panic(fmt.Sprintf("%s: kind %v not handled", fd.FullName(), fd.Kind()))
}
