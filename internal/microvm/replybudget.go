package microvm

// This file bounds the work an agent's reply can make statsd do before it
// is decoded. The frame guard bounds a reply's bytes (256 KiB); within
// them, a guest could pack 14,000 memory.stat keys per container, and 25
// such replies cost about 240 ms of statsd CPU per poll to decode. A
// decoder's work follows the fields it reads (each unknown field is kept,
// each string allocated) and the messages it makes (each map entry, block
// IO line, interface). Counting them on the wire first costs a scan without
// allocations, and a reply holding more than any agent sends is refused
// undecoded: its payload here, by a ttrpc client interceptor, and the
// envelope around it (ttrpc's Response: the status and its details, which
// ttrpc decodes before any interceptor runs) in the frame guard.

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// replyBudget is what one reply may hold, counted at every depth: fields
// (every field on the wire, known or not, and each element of a packed
// list), messages (each nested message, map entry and
// list element that is a message) and map entries among them.
type replyBudget struct{ fields, messages, mapEntries int }

// statsReplyBudget bounds a StatsContainer reply's payload. An ordinary
// reply has a few dozen messages and about a hundred fields. The largest
// statsd reads whole, a cgroup v1 guest under CFQ filling all eight blkio
// lists for 64 devices (convert reads at most 64) with 64 interfaces, 100
// memory.stat keys and 256 CPUs, has 13,745 fields, 2,744 messages and
// 108 map entries (TestCountReply): the budget is about twice that, and
// four times the memory.stat of a cgroup v2 guest (about 50 keys) for map
// entries, which cost the most each (a string key, a map insert, then
// convert's pass over the keys: 4,000 keys in each of 25 replies cost
// statsd 98 ms a poll, against 2.5 ms for ordinary replies).
var statsReplyBudget = replyBudget{fields: 32768, messages: 4096, mapEntries: 512}

// envelopeBudget bounds ttrpc's Response around a payload: a status code
// and message, the payload as one opaque field. No Kata agent sends status
// details; a few are allowed.
var envelopeBudget = replyBudget{fields: 64, messages: 8, mapEntries: 0}

// errOverBudget marks a reply refused undecoded for what it holds.
var errOverBudget = errors.New("reply holds more than statsd decodes")

var (
	statsReplyDescriptor = (&katagrpc.StatsContainerResponse{}).ProtoReflect().Descriptor()
	envelopeDescriptor   = (&ttrpc.Response{}).ProtoReflect().Descriptor()
)

// payloadBudget is a ttrpc client interceptor that checks a StatsContainer
// reply's payload against statsReplyBudget before the client decodes it.
// Other methods pass through.
func payloadBudget() ttrpc.UnaryClientInterceptor {
	full := "/" + agentService + "/" + statsMethod
	return func(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, info *ttrpc.UnaryClientInfo, invoke ttrpc.Invoker) error {
		if err := invoke(ctx, req, resp); err != nil || info.FullMethod != full {
			return err
		}
		_, err := countReply(resp.Payload, statsReplyDescriptor, statsReplyBudget)
		return err
	}
}

// replyCounts is what countReply found.
type replyCounts struct{ fields, messages, mapEntries int }

// countReply counts what b, a message md on the wire, holds (see
// replyBudget), stopping with errOverBudget, naming the field, once a count
// passes its limit or at a group (proto3 has none). It allocates nothing but
// that error. Bytes that are not valid wire format are left for the decoder
// to refuse: they count what was read.
func countReply(b []byte, md protoreflect.MessageDescriptor, limit replyBudget) (replyCounts, error) {
	c := replyCounter{limit: limit}
	err := c.walk(b, schemaOf(md))
	return c.n, err
}

// msgSchema is what walk needs of a message's fields, indexed by number:
// made once per descriptor (a reply's schema is fixed), so a field costs
// walk an index, not a descriptor lookup.
type msgSchema struct {
	md     protoreflect.MessageDescriptor
	fields []*fieldSchema // by number; nil: not a field of md
}

type fieldSchema struct {
	msg   *msgSchema // set for a message field (a map's entry, a list's element)
	isMap bool
	list  bool
	kind  protoreflect.Kind
}

// maxIndexedField bounds msgSchema.fields: a field numbered above it is
// looked up in the descriptor (no Kata message has one).
const maxIndexedField = 1024

// field is num's schema, nil when md has no such field.
func (s *msgSchema) field(num protowire.Number) *fieldSchema {
	if num >= 0 && int(num) < len(s.fields) {
		return s.fields[num]
	}
	fd := s.md.Fields().ByNumber(num)
	if fd == nil {
		return nil
	}
	return newFieldSchema(fd, map[protoreflect.MessageDescriptor]*msgSchema{})
}

// schemas holds the msgSchema of each descriptor counted so far.
var schemas sync.Map // protoreflect.MessageDescriptor -> *msgSchema

// schemaOf is md's msgSchema.
func schemaOf(md protoreflect.MessageDescriptor) *msgSchema {
	if s, ok := schemas.Load(md); ok {
		return s.(*msgSchema)
	}
	s, _ := schemas.LoadOrStore(md, buildSchema(md, map[protoreflect.MessageDescriptor]*msgSchema{}))
	return s.(*msgSchema)
}

// buildSchema makes md's msgSchema and those of the messages it holds
// (made: the ones made so far, for recursive messages).
func buildSchema(md protoreflect.MessageDescriptor, made map[protoreflect.MessageDescriptor]*msgSchema) *msgSchema {
	if s, ok := made[md]; ok {
		return s
	}
	s := &msgSchema{md: md}
	made[md] = s
	fds := md.Fields()
	top := 0
	for i := range fds.Len() {
		if n := int(fds.Get(i).Number()); n <= maxIndexedField {
			top = max(top, n)
		}
	}
	s.fields = make([]*fieldSchema, top+1)
	for i := range fds.Len() {
		if fd := fds.Get(i); int(fd.Number()) <= maxIndexedField {
			s.fields[fd.Number()] = newFieldSchema(fd, made)
		}
	}
	return s
}

func newFieldSchema(fd protoreflect.FieldDescriptor, made map[protoreflect.MessageDescriptor]*msgSchema) *fieldSchema {
	f := &fieldSchema{isMap: fd.IsMap(), list: fd.IsList(), kind: fd.Kind()}
	if m := fd.Message(); m != nil {
		f.msg = buildSchema(m, made)
	}
	return f
}

type replyCounter struct {
	n     replyCounts
	limit replyBudget
}

// walk counts the fields of b, a message of schema s.
func (c *replyCounter) walk(b []byte, s *msgSchema) error {
	md := s.md
	for len(b) > 0 {
		num, typ, tagLen := protowire.ConsumeTag(b)
		if tagLen < 0 {
			return nil
		}
		if typ == protowire.StartGroupType {
			// proto3 has no groups and no agent sends one. Skipping one
			// scans it whole, and each group within it again: nested
			// 10,000 deep in 64 KiB, that took seconds a reply.
			return fmt.Errorf("%w: a group (at %s): no agent sends one", errOverBudget, fieldName(md, num))
		}
		valLen := protowire.ConsumeFieldValue(num, typ, b[tagLen:])
		if valLen < 0 {
			return nil
		}
		fd := s.field(num)
		elems := 1
		switch typ {
		case protowire.BytesType:
			v, _ := protowire.ConsumeBytes(b[tagLen:])
			switch {
			case fd == nil:
			case fd.msg != nil:
				if c.n.messages++; c.n.messages > c.limit.messages {
					return over("messages", c.limit.messages, md, num)
				}
				if fd.isMap {
					if c.n.mapEntries++; c.n.mapEntries > c.limit.mapEntries {
						return over("map entries", c.limit.mapEntries, md, num)
					}
				}
				if c.n.fields++; c.n.fields > c.limit.fields {
					return over("fields", c.limit.fields, md, num)
				}
				if err := c.walk(v, fd.msg); err != nil {
					return err
				}
				elems = 0 // counted before its fields
			case fd.list:
				elems = packedElements(v, fd.kind)
			}
		}
		if c.n.fields += elems; c.n.fields > c.limit.fields {
			return over("fields", c.limit.fields, md, num)
		}
		b = b[tagLen+valLen:]
	}
	return nil
}

// over is errOverBudget for a count that passed its limit at field num of
// md.
func over(what string, limit int, md protoreflect.MessageDescriptor, num protowire.Number) error {
	return fmt.Errorf("%w: over %d %s (at %s)", errOverBudget, limit, what, fieldName(md, num))
}

// fieldName is field num of md as the schema names it.
func fieldName(md protoreflect.MessageDescriptor, num protowire.Number) string {
	if fd := md.Fields().ByNumber(num); fd != nil {
		return string(fd.FullName())
	}
	return fmt.Sprintf("field %d of %s", num, md.FullName())
}

// packedElements is the number of elements of a packed list of kind k: one
// per varint, or per fixed-size value. A repeated string or bytes field is
// one element per field.
func packedElements(v []byte, k protoreflect.Kind) int {
	switch k {
	case protoreflect.StringKind, protoreflect.BytesKind:
		return 1
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return max(1, len(v)/4)
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return max(1, len(v)/8)
	}
	n := 0
	for _, x := range v {
		if x < 0x80 {
			n++
		}
	}
	return max(1, n)
}
