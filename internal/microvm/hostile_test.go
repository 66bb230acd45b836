package microvm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/source"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// pollUntil samples every 5 ms until ok(err) or the deadline, and returns
// how many samples it took and the last error.
func pollUntil(t *testing.T, s *guestSource, within time.Duration, ok func(error) bool) (int, error) {
	t.Helper()
	var err error
	n := 0
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = s.Sample(ctx)
		cancel()
		n++
		if ok(err) {
			return n, err
		}
	}
	t.Fatalf("after %v and %d samples: last err %v", within, n, err)
	return n, err
}

// An agent streaming frames on stream ids no call opened (ttrpc logs and
// drops each one: 85 MB of logs and 7.6 s of CPU in 10 s) has its
// connection cut at the first such frame; the source redials only after a
// backoff, and reads again once the agent behaves.
func TestHostileAgentFloodsInactiveStreams(t *testing.T) {
	h := kataagentfake.NewHostile(t, t.TempDir(), kataagentfake.FloodInactiveStreams, kataagentfake.V2(v2a))
	cfg := testConfig()
	cfg.MinBackoff, cfg.MaxBackoff = 50*time.Millisecond, 200*time.Millisecond
	s := mustOpen(t, h.Address(), cfg, "a")

	_, err := pollUntil(t, s, 5*time.Second, func(err error) bool { return err != nil && strings.Contains(err.Error(), "no request outstanding") })
	if !errors.Is(err, source.ErrMalformed) {
		t.Fatalf("err = %v, want ErrMalformed (the agent answered, wrongly)", err)
	}
	// Keep polling hard for a second: redials are paced by the backoff.
	dials0, flooded0 := h.Dials(), h.Flooded()
	start := time.Now()
	for time.Since(start) < time.Second {
		s.Sample(context.Background())
		time.Sleep(time.Millisecond)
	}
	dials, flooded := h.Dials()-dials0, h.Flooded()-flooded0
	t.Logf("measured: in 1 s of polling every 1 ms, %d redials, %d frames on inactive streams sent by the agent", dials, flooded)
	// Paced: never more than one redial per MinBackoff (a loaded machine
	// may reset the doubling: a cut connection that lived longer than
	// MaxBackoff starts it over).
	if limit := int(time.Second/cfg.MinBackoff) + 2; dials > limit {
		t.Errorf("%d redials in 1 s with a %v-%v backoff, want at most %d", dials, cfg.MinBackoff, cfg.MaxBackoff, limit)
	}
	h.SetMode(kataagentfake.Behave)
	pollUntil(t, s, 3*time.Second, func(err error) bool { return err == nil })
}

// A frame header announcing 100 MiB, then silence: ttrpc would wait for
// the 100 MiB forever and every later call on the connection would time
// out. The header alone cuts the connection; polls recover once the agent
// is healthy again.
func TestHostileAgentHugeFrameHeaderThenSilence(t *testing.T) {
	h := kataagentfake.NewHostile(t, t.TempDir(), kataagentfake.HugeHeader, kataagentfake.V2(v2a))
	cfg := testConfig()
	s := mustOpen(t, h.Address(), cfg, "a")
	start := time.Now()
	_, err := s.Sample(context.Background())
	if err == nil || !strings.Contains(err.Error(), "104857600 bytes") {
		t.Fatalf("err = %v, want the connection cut for a 104857600-byte frame", err)
	}
	if took := time.Since(start); took >= cfg.CallTimeout {
		t.Errorf("took %v: the header alone should cut the connection, not the call timeout (%v)", took, cfg.CallTimeout)
	}
	h.SetMode(kataagentfake.Behave)
	n, _ := pollUntil(t, s, 3*time.Second, func(err error) bool { return err == nil })
	if h.Dials() < 2 {
		t.Errorf("%d dials: the wedged connection was not replaced", h.Dials())
	}
	t.Logf("measured: the 100 MiB header cut the connection in %v; recovered after %d polls, %d dials", time.Since(start).Round(time.Millisecond), n, h.Dials())
}

// An agent that stops answering: after 3 calls in a row time out the
// connection is replaced (the calls' timeout counts as a failure), and
// polls read again when the agent answers again. A single timeout between
// answers keeps the connection.
func TestSilentAgentConnectionReplacedAfterTimeouts(t *testing.T) {
	h := kataagentfake.NewHostile(t, t.TempDir(), kataagentfake.Behave, kataagentfake.V2(v2a))
	cfg := testConfig()
	cfg.CallTimeout = 50 * time.Millisecond
	s := mustOpen(t, h.Address(), cfg, "a")
	sample(t, s)

	h.SetMode(kataagentfake.Silent)
	if _, err := s.Sample(context.Background()); !errors.Is(err, source.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	h.SetMode(kataagentfake.Behave)
	sample(t, s)
	if d := h.Dials(); d != 1 {
		t.Fatalf("%d dials after one timeout between answers; want the connection kept", d)
	}

	h.SetMode(kataagentfake.Silent)
	for range maxTimeoutsInARow {
		if _, err := s.Sample(context.Background()); !errors.Is(err, source.ErrTimeout) {
			t.Fatalf("err = %v, want ErrTimeout", err)
		}
	}
	h.SetMode(kataagentfake.Behave)
	pollUntil(t, s, 3*time.Second, func(err error) bool { return err == nil })
	if d := h.Dials(); d != 2 {
		t.Fatalf("%d dials; want the silent connection replaced once", d)
	}
}

// An agent that answers every call with an error status did answer: the
// error says so (the drift check tells it from silence), and its message
// is quoted and cut where it enters.
func TestAgentErrorStatusIsAnAnswer(t *testing.T) {
	h := kataagentfake.NewHostile(t, t.TempDir(), kataagentfake.ErrorStatus, nil)
	h.SetErrorMessage(strings.Repeat("E", 100<<10) + "\x1b]0;pwned\x07")
	s := mustOpen(t, h.Address(), testConfig(), "a", "b")
	_, err := s.Sample(context.Background())
	if !errors.Is(err, source.ErrAnswered) || !errors.Is(err, source.ErrNotMeasurable) {
		t.Fatalf("err = %v, want ErrAnswered and ErrNotMeasurable", err)
	}
	if msg := err.Error(); len(msg) > 4<<10 || strings.ContainsRune(msg, 0x1b) {
		t.Fatalf("error is %d bytes (raw ESC: %v), want the agent's message quoted and cut", len(msg), strings.ContainsRune(msg, 0x1b))
	}
	var unread *source.UnreadError
	if !errors.As(err, &unread) || len(unread.Containers) != 2 {
		t.Fatalf("err = %#v, want an UnreadError for both containers", err)
	}
	for _, c := range unread.Containers {
		if len(c.Reason) > 1<<10 {
			t.Errorf("container %s reason is %d bytes", c.ID, len(c.Reason))
		}
	}
}

// With the default frame cap a reply of 300 KiB cuts the connection (a
// StatsContainer reply is a few KiB; 25 replies of 4 MiB held statsd at
// hundreds of MiB), and the source reads again once the reply is small.
func TestReplyOverDefaultFrameCap(t *testing.T) {
	big := kataagentfake.V2(v2a)
	big.CgroupStats.MemoryStats.Stats["padding_"+strings.Repeat("x", 300<<10)] = 1
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("a", big))
	s := mustOpen(t, agent.Address(), testConfig(), "a")
	_, err := s.Sample(context.Background())
	if !errors.Is(err, source.ErrMalformed) || !strings.Contains(err.Error(), "at most 262144 accepted") {
		t.Fatalf("err = %v, want the connection cut at the 256 KiB frame cap", err)
	}
	agent.SetContainer("a", kataagentfake.V2(v2b))
	pollUntil(t, s, 3*time.Second, func(err error) bool { return err == nil })
}

// What the guest names (interfaces, devices) is cut, cleaned and counted
// where it enters: a reply naming thousands would fill the answer.
func TestGuestChosenNamesAndCounts(t *testing.T) {
	many := func(n int) []*katagrpc.NetworkStats {
		var out []*katagrpc.NetworkStats
		for i := range n {
			out = append(out, kataagentfake.Iface(fmt.Sprintf("eth%d", i), 1, 1, 1, 1))
		}
		return out
	}
	devices := func(n int) []kataagentfake.Device {
		var out []kataagentfake.Device
		for i := range n {
			out = append(out, kataagentfake.Device{Major: 8, Minor: uint64(i), ReadBytes: 1})
		}
		return out
	}
	for _, tc := range []struct {
		name       string
		c          kataagentfake.Container
		wantIfaces []string // nil: network absent
		absent     map[string]string
	}{
		{"escape in an interface name", kataagentfake.Container{Network: []*katagrpc.NetworkStats{kataagentfake.Iface("eth0\x1b]0;x\x07", 1, 1, 1, 1)}},
			[]string{"eth0\uFFFD]0;x\uFFFD"}, nil},
		{"a long interface name is cut", kataagentfake.Container{Network: []*katagrpc.NetworkStats{kataagentfake.Iface(strings.Repeat("n", 300), 1, 1, 1, 1)}},
			[]string{strings.Repeat("n", 64) + "...(+236 bytes)"}, nil},
		{"64 interfaces are read", kataagentfake.Container{Network: many(64)}, nil, nil},
		{"65 interfaces are not", kataagentfake.Container{Network: many(65)}, nil,
			map[string]string{"network": "more than 64 interfaces"}},
		{"1000 entries are not even merged", kataagentfake.Container{Network: many(1000)}, nil,
			map[string]string{"network": "1000 entries"}},
		{"65 devices are not read", kataagentfake.Container{Devices: devices(65)}, nil,
			map[string]string{"block_io": "more than 64 devices"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("a", kataagentfake.V2(tc.c)))
			r := sample(t, mustOpen(t, agent.Address(), testConfig(), "a"))
			if tc.wantIfaces != nil {
				var got []string
				for _, i := range r.Network.Interfaces {
					got = append(got, i.Name)
				}
				if diff := cmp.Diff(tc.wantIfaces, got); diff != "" {
					t.Errorf("interfaces (-want +got):\n%s", diff)
				}
			}
			if len(tc.c.Network) == 64 && (r.Network == nil || len(r.Network.Interfaces) != 64) {
				t.Errorf("64 interfaces: network %v", r.Network)
			}
			for field, frag := range tc.absent {
				i := slices.IndexFunc(r.Absent, func(a source.Absent) bool { return a.Field == field })
				if i < 0 || !strings.Contains(r.Absent[i].Reason, frag) {
					t.Errorf("absent %s: %v, want a reason with %q", field, r.Absent, frag)
				}
			}
		})
	}
}

// FuzzFrameParser: however the byte stream is split, the parser sees the
// same frame headers and the same payloads (each whole payload once, ended
// once, empty ones too), and never more headers than the stream holds.
func FuzzFrameParser(f *testing.F) {
	frame := func(length, stream uint32, typ byte) []byte {
		b := make([]byte, frameHeaderBytes+int(min(length, 64)))
		binary.BigEndian.PutUint32(b[0:4], length)
		binary.BigEndian.PutUint32(b[4:8], stream)
		b[8] = typ
		return b
	}
	f.Add(append(frame(3, 1, 2), frame(0, 3, 2)...), uint8(1))
	f.Add(frame(100<<20, 1, 2), uint8(4))
	f.Add([]byte{0, 0, 0}, uint8(2))
	type seen struct {
		headers []frameHeader
		bodies  []string // each payload ended, as it passed
		open    string   // the payload passing, not ended
	}
	f.Fuzz(func(t *testing.T, stream []byte, chunk uint8) {
		read := func(step int) seen {
			var s seen
			var p frameParser
			for i := 0; i < len(stream); i += step {
				p.feed(stream[i:min(i+step, len(stream))],
					func(h frameHeader) error { s.headers = append(s.headers, h); return nil },
					func(h frameHeader, b []byte, last bool) error {
						if h != s.headers[len(s.headers)-1] {
							t.Fatalf("payload of %+v while %+v passes", h, s.headers[len(s.headers)-1])
						}
						if s.open += string(b); last {
							s.bodies, s.open = append(s.bodies, s.open), ""
						}
						return nil
					})
			}
			return s
		}
		step := int(chunk%16) + 1
		whole, split := read(max(1, len(stream))), read(step)
		if diff := cmp.Diff(whole, split, cmp.AllowUnexported(frameHeader{}, seen{})); diff != "" {
			t.Fatalf("split by %d (-whole +split):\n%s", step, diff)
		}
		if len(whole.headers) > len(stream)/frameHeaderBytes {
			t.Fatalf("%d headers from %d bytes", len(whole.headers), len(stream))
		}
	})
}

// An agent that answers Version and then takes no request bytes (a vsock
// guest that gives no credit): the request's write times out at
// CallTimeout, the connection is cut, and the read ends then, even for a
// caller with no deadline of its own; the source redials only after a
// backoff.
func TestAgentTakesNoRequests(t *testing.T) {
	cfg := testConfig()
	cfg.CallTimeout = 100 * time.Millisecond
	cfg.MinBackoff, cfg.MaxBackoff = time.Minute, time.Minute
	dials := 0
	cfg.DialVsock = func(context.Context, uint32, uint32) (net.Conn, error) {
		dials++
		ours, agents := net.Pipe() // a write blocks until the other end reads
		done := make(chan struct{})
		go answerVersionThenDeaf(agents, done)
		t.Cleanup(func() { close(done); agents.Close() })
		return ours, nil
	}
	s := mustOpen(t, "vsock://3:1024", cfg, "a")
	start := time.Now()
	_, err := s.Sample(context.Background())
	if took := time.Since(start); !errors.Is(err, source.ErrTimeout) || !strings.Contains(err.Error(), "took no request bytes") || took > 2*time.Second {
		t.Fatalf("Sample = %v after %v; want ErrTimeout naming the untaken request at about %v", err, took, cfg.CallTimeout)
	}
	if _, err := s.Sample(context.Background()); !errors.Is(err, source.ErrTimeout) || !strings.Contains(err.Error(), "next dial in") || dials != 1 {
		t.Fatalf("second Sample = %v after %d dials; want ErrTimeout in the backoff, no redial", err, dials)
	}
}

// answerVersionThenDeaf answers the first request on c (Version) and reads
// nothing more until done.
func answerVersionThenDeaf(c net.Conn, done <-chan struct{}) {
	var hdr [frameHeaderBytes]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return
	}
	if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(hdr[0:4]))); err != nil {
		return
	}
	p, _ := proto.Marshal(&katagrpc.VersionCheckResponse{GrpcVersion: "0.0.1", AgentVersion: "3.9.0"})
	b, _ := proto.Marshal(&ttrpc.Response{Payload: p})
	binary.BigEndian.PutUint32(hdr[0:4], uint32(len(b)))
	hdr[8] = frameTypeResponse
	if _, err := c.Write(append(hdr[:], b...)); err != nil {
		return
	}
	<-done
}
