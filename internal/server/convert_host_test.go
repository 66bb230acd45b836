package server

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// fillDomain sets every field reachable from v: each string and number to a
// value of its own (n counts them), each enum to 1, each pointer to a new
// value, each slice to one element.
func fillDomain(v reflect.Value, n *int) {
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fillDomain(v.Elem(), n)
	case reflect.Struct:
		for i := range v.NumField() {
			fillDomain(v.Field(i), n)
		}
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fillDomain(v.Index(0), n)
	case reflect.String:
		*n++
		v.SetString(fmt.Sprintf("s%d", *n))
	case reflect.Int, reflect.Int32, reflect.Int64:
		*n++
		if _, enum := v.Interface().(fmt.Stringer); enum {
			v.SetInt(1)
		} else {
			v.SetInt(int64(*n))
		}
	case reflect.Uint32, reflect.Uint64:
		*n++
		v.SetUint(uint64(*n))
	default:
		panic(fmt.Sprintf("fillDomain: kind %v not handled", v.Kind()))
	}
}

func foldName(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }

// sameAsDomain checks that every field of m is set and holds what the
// domain field of the same name (case and underscores aside) holds, and that
// every domain field has a proto field.
func sameAsDomain(t *testing.T, path string, m protoreflect.Message, v reflect.Value) {
	t.Helper()
	domain := map[string]reflect.Value{}
	for i := range v.NumField() {
		domain[foldName(v.Type().Field(i).Name)] = v.Field(i)
	}
	fds := m.Descriptor().Fields()
	for i := range fds.Len() {
		fd := fds.Get(i)
		at := path + "." + string(fd.Name())
		f, ok := domain[foldName(string(fd.Name()))]
		delete(domain, foldName(string(fd.Name())))
		switch {
		case !ok:
			t.Errorf("%s: no domain field", at)
			continue
		case !m.Has(fd):
			t.Errorf("%s: lost in the conversion", at)
			continue
		}
		val := m.Get(fd)
		switch {
		case fd.IsList():
			if val.List().Len() != f.Len() {
				t.Errorf("%s: %d elements, domain has %d", at, val.List().Len(), f.Len())
				continue
			}
			for j := range f.Len() {
				if fd.Kind() == protoreflect.MessageKind {
					sameAsDomain(t, fmt.Sprintf("%s[%d]", at, j), val.List().Get(j).Message(), reflect.Indirect(f.Index(j)))
				} else {
					sameScalar(t, fmt.Sprintf("%s[%d]", at, j), fd, val.List().Get(j), f.Index(j))
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			sameAsDomain(t, at, val.Message(), f.Elem())
		default:
			sameScalar(t, at, fd, val, reflect.Indirect(f))
		}
	}
	for name := range domain {
		t.Errorf("%s.%s: domain field without a proto field", path, name)
	}
}

func sameScalar(t *testing.T, at string, fd protoreflect.FieldDescriptor, got protoreflect.Value, want reflect.Value) {
	t.Helper()
	if fd.Kind() == protoreflect.EnumKind {
		if int64(got.Enum()) != want.Int() {
			t.Errorf("%s = enum %d, domain %v (%d)", at, got.Enum(), want.Interface(), want.Int())
		}
		return
	}
	if g, w := fmt.Sprint(got.Interface()), fmt.Sprint(want.Interface()); g != w {
		t.Errorf("%s = %s, domain %s", at, g, w)
	}
}

// TestHostToProtoLosesNothing converts a domain HostStats with every field
// set (each number and string distinct) and checks every wire field, all
// the way down, is set and holds its domain field's value.
func TestHostToProtoLosesNothing(t *testing.T) {
	var h source.HostStats
	n := 0
	fillDomain(reflect.ValueOf(&h).Elem(), &n)
	sameAsDomain(t, "HostStats", hostToProto(&h).ProtoReflect(), reflect.ValueOf(h))
}

// TestHostEnumsToProto: every domain enum value converts (by number) to the
// wire value of the same name, and the wire has no value the domain lacks.
func TestHostEnumsToProto(t *testing.T) {
	type enum interface{ String() string }
	for _, c := range []struct {
		values protoreflect.EnumValueDescriptors
		prefix string
		domain func(n int32) (enum, protoreflect.Enum)
	}{
		{sandboxstatsv1.VmmThreadClass(0).Descriptor().Values(), "VMM_THREAD_CLASS_", func(n int32) (enum, protoreflect.Enum) {
			return source.VMMThreadClass(n), threadClassToProto(source.VMMThreadClass(n))
		}},
		{sandboxstatsv1.KvmCounterKind(0).Descriptor().Values(), "KVM_COUNTER_KIND_", func(n int32) (enum, protoreflect.Enum) {
			return source.KVMCounterKind(n), counterKindToProto(source.KVMCounterKind(n))
		}},
		{sandboxstatsv1.KvmSource(0).Descriptor().Values(), "KVM_SOURCE_", func(n int32) (enum, protoreflect.Enum) {
			return source.KVMSource(n), kvmSourceKindToProto(source.KVMSource(n))
		}},
		{sandboxstatsv1.KvmSourceState(0).Descriptor().Values(), "KVM_SOURCE_STATE_", func(n int32) (enum, protoreflect.Enum) {
			return source.KVMSourceState(n), kvmStateToProto(source.KVMSourceState(n))
		}},
	} {
		for i := range c.values.Len() + 1 { // one past the wire's last value: unknown to both
			d, w := c.domain(int32(i))
			want := d.String()
			if want == "unknown" {
				want = "unspecified"
			}
			got := "unspecified"
			if v := c.values.ByNumber(w.Number()); v != nil {
				got = strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(string(v.Name()), c.prefix)), "_", " ")
			}
			if got != want {
				t.Errorf("%T(%d) = %s on the wire, want %s", d, i, got, want)
			}
		}
	}
}

func TestHostToProtoNil(t *testing.T) {
	if hostToProto(nil) != nil {
		t.Error("a nil host view must stay absent")
	}
	if w := hostToProto(&source.HostStats{GuestName: "srv1"}); w.GetRunnerKernel() != nil || w.GetVmmThreads() != nil || w.GetKvm() != nil {
		t.Errorf("absent views became present: %v", w)
	}
}
