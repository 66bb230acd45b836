package microvm

// This file bounds the work an agent's reply can make statsd do before it
// is decoded. The frame guard bounds a reply's bytes (256 KiB); within
// them, a guest could pack 14,000 memory.stat keys per container, and 25
// such replies cost about 240 ms of statsd CPU per poll to decode: the
// decoder allocates per message (a map entry, a device's line, an
// interface). Counting the reply's messages on the wire first costs a scan
// without allocations, and a reply with more of them than any agent sends is
// refused undecoded.

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sandboxstats/sandboxstats/internal/source"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// maxReplyMessages bounds the messages, at every depth, of one
// StatsContainer reply: each map entry, block IO line, interface and
// nested message counts one. An ordinary reply has a few dozen. The largest
// statsd reads whole, a cgroup v1 guest under CFQ filling all eight blkio
// lists for 64 devices (convert reads at most 64) with 64 interfaces, has
// about 2,800 (TestCountMessages). Per-CPU usage is one packed field.
const maxReplyMessages = 4096

// maxReplyMapEntries bounds the map entries among them: memory.stat keys
// (about 50 on a cgroup v2 guest, 36 on v1) and huge page sizes. A map
// entry costs about four times a list entry to decode (a string key, a map
// insert, then convert's pass over the keys): 4,000 keys in each of 25
// replies cost statsd 98 ms a poll, against 2.5 ms for ordinary replies.
const maxReplyMapEntries = 512

// errTooManyMessages marks a reply refused undecoded for its message or
// map entry count; it also wraps source.ErrMalformed: the agent answered,
// wrongly.
var errTooManyMessages = errors.New("microvm: reply has more messages than statsd decodes")

// statsReplyDescriptor is the message a StatsContainer reply decodes into.
var statsReplyDescriptor = (&katagrpc.StatsContainerResponse{}).ProtoReflect().Descriptor()

// messageBudget is a ttrpc client interceptor that counts the messages of
// a StatsContainer reply on the wire and refuses one over limit before the
// client decodes it. Other methods pass through.
func messageBudget(limit replyBudget) ttrpc.UnaryClientInterceptor {
	full := "/" + agentService + "/" + statsMethod
	return func(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, info *ttrpc.UnaryClientInfo, invoke ttrpc.Invoker) error {
		if err := invoke(ctx, req, resp); err != nil {
			return err
		}
		if info.FullMethod != full {
			return nil
		}
		if _, err := countMessages(resp.Payload, statsReplyDescriptor, limit); err != nil {
			resp.Payload = nil // never decoded
			return err
		}
		return nil
	}
}

// replyBudget is what one reply may hold.
type replyBudget struct{ messages, mapEntries int }

// defaultReplyBudget is the budget of every StatsContainer reply.
var defaultReplyBudget = replyBudget{messages: maxReplyMessages, mapEntries: maxReplyMapEntries}

// countMessages counts the messages within b, a message md on the wire, at
// every depth, stopping with errTooManyMessages once the count of messages
// or of map entries passes its limit. It allocates nothing. Bytes that are
// not valid wire format are left for the decoder to refuse: they count what
// was read.
func countMessages(b []byte, md protoreflect.MessageDescriptor, limit replyBudget) (int, error) {
	c := messageCounter{limit: limit}
	err := c.walk(b, md)
	return c.messages, err
}

type messageCounter struct {
	messages, mapEntries int
	limit                replyBudget
}

func (c *messageCounter) walk(b []byte, md protoreflect.MessageDescriptor) error {
	for len(b) > 0 {
		num, typ, tagLen := protowire.ConsumeTag(b)
		if tagLen < 0 {
			return nil
		}
		valLen := protowire.ConsumeFieldValue(num, typ, b[tagLen:])
		if valLen < 0 {
			return nil
		}
		if typ == protowire.BytesType {
			if fd := md.Fields().ByNumber(num); fd != nil && fd.Message() != nil {
				if c.messages++; c.messages > c.limit.messages {
					return fmt.Errorf("%w: %w: over %d", source.ErrMalformed, errTooManyMessages, c.limit.messages)
				}
				if fd.IsMap() {
					if c.mapEntries++; c.mapEntries > c.limit.mapEntries {
						return fmt.Errorf("%w: %w: over %d map entries", source.ErrMalformed, errTooManyMessages, c.limit.mapEntries)
					}
				}
				v, _ := protowire.ConsumeBytes(b[tagLen:])
				if err := c.walk(v, fd.Message()); err != nil {
					return err
				}
			}
		}
		b = b[tagLen+valLen:]
	}
	return nil
}
