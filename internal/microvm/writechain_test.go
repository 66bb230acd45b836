package microvm

// Hostile agents that slow the request writes (a review of s6's call on
// the caller's goroutine): every caller leaves at its deadline.

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// dripAgent answers Version at once, then takes each later request's bytes
// only drip after it last took one (a guest granting vsock credit for one
// request at a time), answering each at once.
func dripAgent(c net.Conn, drip time.Duration, done <-chan struct{}, taken *atomic.Int32) {
	var hdr [frameHeaderBytes]byte
	first := true
	for {
		if !first {
			select {
			case <-done:
				return
			case <-time.After(drip):
			}
		}
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(hdr[0:4]))); err != nil {
			return
		}
		var p []byte
		if first {
			p, _ = proto.Marshal(&katagrpc.VersionCheckResponse{GrpcVersion: "0.0.1", AgentVersion: "3.9.0"})
		} else {
			taken.Add(1)
			p, _ = proto.Marshal(&katagrpc.StatsContainerResponse{})
		}
		first = false
		b, _ := proto.Marshal(&ttrpc.Response{Payload: p})
		var out [frameHeaderBytes]byte
		binary.BigEndian.PutUint32(out[0:4], uint32(len(b)))
		copy(out[4:8], hdr[4:8])
		out[8] = frameTypeResponse
		if _, err := c.Write(append(out[:], b...)); err != nil {
			return
		}
	}
}

// agentSource opens a source of ids whose every dial reaches a fake agent
// run by agent on the other end of a pipe (done closed at the test's end),
// with CallTimeout ct and no redial within the test; taken counts the
// requests the agent took.
func agentSource(t *testing.T, ct time.Duration, agent func(c net.Conn, done <-chan struct{}, taken *atomic.Int32), ids ...string) (*guestSource, *atomic.Int32) {
	cfg := testConfig()
	cfg.CallTimeout = ct
	cfg.MinBackoff, cfg.MaxBackoff = time.Minute, time.Minute
	taken := new(atomic.Int32)
	cfg.DialVsock = func(context.Context, uint32, uint32) (net.Conn, error) {
		ours, agents := net.Pipe()
		done := make(chan struct{})
		go agent(agents, done, taken)
		t.Cleanup(func() { close(done); agents.Close() })
		return ours, nil
	}
	return mustOpen(t, "vsock://3:1024", cfg, ids...), taken
}

func dripSource(t *testing.T, ct, drip time.Duration, ids ...string) (*guestSource, *atomic.Int32) {
	return agentSource(t, ct, func(c net.Conn, done <-chan struct{}, taken *atomic.Int32) { dripAgent(c, drip, done, taken) }, ids...)
}

// TestCancelledCallerLeavesAtOnce: a caller cancelled before or during a
// call to an agent that takes no request bytes returns at once (the call
// goes on on its worker, bounded by CallTimeout and the write deadline).
func TestCancelledCallerLeavesAtOnce(t *testing.T) {
	const ct = 300 * time.Millisecond
	for _, pre := range []bool{true, false} {
		t.Run(fmt.Sprint("precancelled=", pre), func(t *testing.T) {
			s, _ := dripSource(t, ct, time.Hour, "a") // takes no request bytes
			if _, err := s.connection(context.Background()); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			if pre {
				cancel()
			} else {
				time.AfterFunc(10*time.Millisecond, cancel)
			}
			defer cancel()
			start := time.Now()
			_, err := s.Sample(ctx)
			took := time.Since(start)
			t.Logf("took %v, err %v", took, err)
			if took > ct/2 {
				t.Errorf("a cancelled caller returned after %v (CallTimeout %v)", took, ct)
			}
		})
	}
}

// preAnswerAgent answers Version, then for each later request: answers it
// (the stream id is predictable) as soon as its write has begun, and takes
// its bytes only drip later.
func preAnswerAgent(c net.Conn, drip time.Duration, done <-chan struct{}, taken *atomic.Int32) {
	var hdr [frameHeaderBytes]byte
	answer := func(stream uint32, p []byte) error {
		b, _ := proto.Marshal(&ttrpc.Response{Payload: p})
		var out [frameHeaderBytes]byte
		binary.BigEndian.PutUint32(out[0:4], uint32(len(b)))
		binary.BigEndian.PutUint32(out[4:8], stream)
		out[8] = frameTypeResponse
		_, err := c.Write(append(out[:], b...))
		return err
	}
	read := func() (uint32, error) {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return 0, err
		}
		_, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(hdr[0:4])))
		return binary.BigEndian.Uint32(hdr[4:8]), err
	}
	id, err := read()
	if err != nil {
		return
	}
	p, _ := proto.Marshal(&katagrpc.VersionCheckResponse{GrpcVersion: "0.0.1", AgentVersion: "3.9.0"})
	if answer(id, p) != nil {
		return
	}
	sc, _ := proto.Marshal(&katagrpc.StatsContainerResponse{CgroupStats: &katagrpc.CgroupStats{CpuStats: &katagrpc.CpuStats{CpuUsage: &katagrpc.CpuUsage{TotalUsage: 1}}, MemoryStats: &katagrpc.MemoryStats{}}})
	next := id + 2
	for {
		select {
		case <-done:
			return
		case <-time.After(20 * time.Millisecond): // the next request's write has begun
		}
		if answer(next, sc) != nil {
			return
		}
		select {
		case <-done:
			return
		case <-time.After(drip - 20*time.Millisecond):
		}
		got, err := read()
		if err != nil {
			return
		}
		taken.Add(1)
		if got != next {
			return
		}
		next += 2
	}
}

// TestCallerLeavesAtItsDeadline: ttrpc writes a connection's requests one
// at a time, so a container's call can wait behind its siblings' writes,
// each up to the write deadline. An agent that answers each request as its
// write begins and takes its bytes just before that deadline holds the
// calls for seconds; the caller still returns at its own deadline (the call
// runs on a bounded worker, never on the caller's goroutine: a review of
// s6 measured 3 to 7.5 s when it did).
func TestCallerLeavesAtItsDeadline(t *testing.T) {
	const ct = 400 * time.Millisecond
	ids := make([]string, 25)
	for i := range ids {
		ids[i] = fmt.Sprintf("c%02d", i)
	}
	s, taken := agentSource(t, ct, func(c net.Conn, done <-chan struct{}, taken *atomic.Int32) {
		preAnswerAgent(c, 300*time.Millisecond, done, taken)
	}, ids...)
	if _, err := s.connection(context.Background()); err != nil {
		t.Fatal(err)
	}
	const deadline = ct + 10*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	_, err := s.Sample(ctx)
	took := time.Since(start)
	t.Logf("Sample: %v at a %v deadline, %d requests taken, err %v", took, deadline, taken.Load(), foreign.Bound(fmt.Sprint(err), 300))
	if took > deadline+200*time.Millisecond {
		t.Errorf("Sample returned after %v, want by its %v deadline", took, deadline)
	}
}
