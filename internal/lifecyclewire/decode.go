package lifecyclewire

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// decodeRequest reads a RunWorkloadRequest's or RestoreWorkloadRequest's
// bytes (the two have the same fields: 1 identity, 2 sandbox). ok is false
// for anything proto.Unmarshal reads otherwise or refuses: a field not
// known here, a known one with another wire type or given twice (proto
// merges a message field given twice; a repeated one is appended, as
// proto does), text that is not UTF-8, cut bytes.
func decodeRequest(b []byte) (id *sandboxstatsv1.WorkloadIdentity, ref *sandboxstatsv1.SandboxRef, ok bool) {
	var seen fields
	for len(b) > 0 {
		num, v, rest, ok := next(b, protowire.BytesType)
		if !ok || !seen.first(num) {
			return nil, nil, false
		}
		b = rest
		switch num {
		case 1:
			if id, ok = decodeIdentity(v); !ok {
				return nil, nil, false
			}
		case 2:
			if ref, ok = decodeSandbox(v); !ok {
				return nil, nil, false
			}
		default:
			return nil, nil, false
		}
	}
	return id, ref, true
}

func decodeIdentity(b []byte) (*sandboxstatsv1.WorkloadIdentity, bool) {
	id := &sandboxstatsv1.WorkloadIdentity{}
	ok := decodeStrings(b, &id.ActorUid, &id.ActorName, &id.ActorNamespace, &id.TemplateNamespace, &id.TemplateName, &id.WorkerPool)
	return id, ok
}

func decodeContainer(b []byte) (*sandboxstatsv1.ContainerRef, bool) {
	c := &sandboxstatsv1.ContainerRef{}
	ok := decodeStrings(b, &c.Id, &c.Name)
	return c, ok
}

// decodeStrings reads a message whose fields are strings numbered 1 to
// len(dst), field i into *dst[i-1].
func decodeStrings(b []byte, dst ...*string) bool {
	var seen fields
	for len(b) > 0 {
		num, v, rest, ok := next(b, protowire.BytesType)
		if !ok || !seen.first(num) || int(num) > len(dst) || !utf8.Valid(v) {
			return false
		}
		*dst[num-1] = string(v)
		b = rest
	}
	return true
}

// The SandboxRef fields read as varints (int32 and the enum); the others
// are length-delimited.
func sandboxWireType(num protowire.Number) protowire.Type {
	switch num {
	case 1, 3, 6:
		return protowire.VarintType
	}
	return protowire.BytesType
}

func decodeSandbox(b []byte) (*sandboxstatsv1.SandboxRef, bool) {
	ref := &sandboxstatsv1.SandboxRef{}
	var seen fields
	for len(b) > 0 {
		num, _, _, ok := next(b, -1)
		if !ok {
			return nil, false
		}
		num, v, rest, ok := next(b, sandboxWireType(num))
		if !ok || num != 5 && num != 9 && !seen.first(num) {
			return nil, false
		}
		b = rest
		if sandboxWireType(num) == protowire.BytesType && num != 9 && !utf8.Valid(v) {
			return nil, false
		}
		switch num {
		case 1:
			ref.SandboxClass = sandboxstatsv1.SandboxClass(int32(varint(v)))
		case 2:
			ref.CgroupPath = string(v)
		case 3:
			ref.SentryPid = int32(varint(v))
		case 4:
			ref.AgentAddress = string(v)
		case 5:
			ref.ContainerIds = append(ref.ContainerIds, string(v))
		case 6:
			ref.VmmPid = int32(varint(v))
		case 7:
			ref.VmmPidFile = string(v)
		case 8:
			ref.QmpSocket = string(v)
		case 9:
			c, ok := decodeContainer(v)
			if !ok {
				return nil, false
			}
			ref.Containers = append(ref.Containers, c)
		default:
			return nil, false
		}
	}
	return ref, true
}

// next reads the field at the start of b, which must have wire type typ
// (any type when typ is negative: then v is nil): its number, its value
// (a varint's bytes or the length-delimited bytes) and what follows.
func next(b []byte, typ protowire.Type) (num protowire.Number, v, rest []byte, ok bool) {
	num, t, n := protowire.ConsumeTag(b)
	if n < 0 {
		return 0, nil, nil, false
	}
	if typ < 0 {
		return num, nil, nil, true
	}
	if t != typ {
		return 0, nil, nil, false
	}
	b = b[n:]
	switch t {
	case protowire.VarintType:
		_, m := protowire.ConsumeVarint(b)
		if m < 0 {
			return 0, nil, nil, false
		}
		return num, b[:m], b[m:], true
	case protowire.BytesType:
		v, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return 0, nil, nil, false
		}
		return num, v, b[m:], true
	}
	return 0, nil, nil, false
}

// varint is the value of a varint next read whole.
func varint(b []byte) uint64 {
	v, _ := protowire.ConsumeVarint(b)
	return v
}

// fields records which of the field numbers 1 to 63 were read.
type fields uint64

// first records num and says whether it was not read before; numbers
// past 63 are never known here.
func (f *fields) first(num protowire.Number) bool {
	if num < 1 || num > 63 || *f&(1<<num) != 0 {
		return false
	}
	*f |= 1 << num
	return true
}
