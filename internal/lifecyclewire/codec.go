// Package lifecyclewire is the gRPC codec of statsd's lifecycle socket. It
// reads RunWorkload's and RestoreWorkload's requests and writes their
// usual answers (an epoch, no replaced activation) with protowire, by
// hand, and leaves every other message to grpc's proto codec.
//
// Why: protobuf-go builds a .proto file's full descriptors and its
// messages' reflection tables the first time one of its messages is
// marshalled or unmarshalled, and stats.proto holds the whole API. A
// statsd that a launcher bound and nothing has polled yet (an idle shard,
// a node whose agent has not swept) kept about 0.2 MiB of them for one
// RunWorkload (e2e TestIntegrationStatsdMemory; issue 33). The bytes are
// proto's own: TestMarshal compares them with proto.Marshal, and
// FuzzUnmarshal what both decode. A request holding anything this codec
// does not read (an unknown or repeated field, another wire type, text that
// is not UTF-8) goes to proto.Unmarshal whole, so what the server sees is
// what proto would give it.
package lifecyclewire

import (
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Codec is an encoding.CodecV2 named "proto" (the content subtype clients
// send): grpc.ForceServerCodecV2(lifecyclewire.Codec{}).
type Codec struct{}

var _ encoding.CodecV2 = Codec{}

// Name is the proto codec's: the wire is the same.
func (Codec) Name() string { return protocodec.Name }

// fallback is grpc's proto codec, registered by its package's init.
func fallback() encoding.CodecV2 { return encoding.GetCodecV2(protocodec.Name) }

// Marshal writes a RunWorkload or RestoreWorkload answer without a replaced
// activation by hand, anything else with proto. (A response statsd builds
// carries no unknown fields.)
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *sandboxstatsv1.RunWorkloadResponse:
		if m != nil && m.Replaced == nil {
			return epochOnly(m.EpochUnixNano), nil
		}
	case *sandboxstatsv1.RestoreWorkloadResponse:
		if m != nil && m.Replaced == nil {
			return epochOnly(m.EpochUnixNano), nil
		}
	}
	return fallback().Marshal(v)
}

// epochOnly is a response holding only field 1, epoch_unix_nano (left out
// when 0, as proto3 does).
func epochOnly(epoch int64) mem.BufferSlice {
	if epoch == 0 {
		return nil
	}
	b := protowire.AppendTag(make([]byte, 0, 11), 1, protowire.VarintType)
	return mem.BufferSlice{mem.SliceBuffer(protowire.AppendVarint(b, uint64(epoch)))}
}

// Unmarshal reads a RunWorkload or RestoreWorkload request by hand when it
// holds only what decodeRequest reads, anything else with proto.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *sandboxstatsv1.RunWorkloadRequest:
		if id, ref, ok := decodeRequest(bytesOf(data)); ok && m != nil {
			m.Reset()
			m.Identity, m.Sandbox = id, ref
			return nil
		}
	case *sandboxstatsv1.RestoreWorkloadRequest:
		if id, ref, ok := decodeRequest(bytesOf(data)); ok && m != nil {
			m.Reset()
			m.Identity, m.Sandbox = id, ref
			return nil
		}
	}
	return fallback().Unmarshal(data, v)
}

// bytesOf is data in one slice, copied only when it is in several.
func bytesOf(data mem.BufferSlice) []byte {
	if len(data) == 1 {
		return data[0].ReadOnlyData()
	}
	return data.Materialize()
}
