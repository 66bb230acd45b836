package microvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

const mib = 1 << 20

// testConfig keeps every bound short so fault tests stay fast.
func testConfig() Config {
	return Config{CallTimeout: 500 * time.Millisecond, MinBackoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond}
}

func mustOpen(t testing.TB, addr string, cfg Config, ids ...string) *guestSource {
	t.Helper()
	s, err := open(source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: addr, ContainerIDs: ids}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func sample(t testing.TB, s *guestSource) source.Reading {
	t.Helper()
	r, err := s.Sample(context.Background())
	if err != nil {
		t.Fatalf("Sample: %v", err)
	}
	return r
}

var (
	v2a = kataagentfake.Container{UsageBytes: 300 * mib, MaxUsageBytes: 350 * mib, InactiveFileBytes: 100 * mib,
		CPUTotal: 2_500_000_000, CPUUser: 2_000_000_000, CPUSystem: 500_000_000}
	v2b = kataagentfake.Container{UsageBytes: 50 * mib, MaxUsageBytes: 60 * mib, InactiveFileBytes: 10 * mib, CPUTotal: 500_000_000}
	v2c = kataagentfake.Container{UsageBytes: 8 * mib, MaxUsageBytes: 9 * mib, CPUTotal: 7_000_000}
)

// The scripted guests, through the real handshake, ttrpc and conversion.
func TestSampleScriptedGuests(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    []kataagentfake.Option
		ids     []string
		want    source.Reading
		wantCPU string // Detail fragment
	}{
		{
			name: "v2 guest, agent 4.1.0",
			opts: []kataagentfake.Option{kataagentfake.WithVersion("4.1.0"), kataagentfake.WithContainer("a", kataagentfake.V2(v2a))},
			ids:  []string{"a"},
			want: source.Reading{Kind: source.KindGuestAgent, MemoryCurrentBytes: 300 * mib, MemoryPeakBytes: ptr[uint64](350 * mib),
				MemoryWorkingSetBytes: 200 * mib, CPUUsageUsec: cpuUsec(2_500_000)},
			wantCPU: `agent_version "4.1.0"; guest cgroup v2; 1 container(s) summed; memory limit: unlimited`,
		},
		{
			name: "v1 guest",
			opts: []kataagentfake.Option{kataagentfake.WithVersion("3.2.0"), kataagentfake.WithContainer("a", kataagentfake.V1(kataagentfake.Container{
				UsageBytes: 1024 * mib, MaxUsageBytes: 1500 * mib, InactiveFileBytes: 1 * mib, TotalInactiveFileBytes: 24 * mib, CPUTotal: 9_000_000_000}))},
			ids: []string{"a"},
			want: source.Reading{Kind: source.KindGuestAgent, MemoryCurrentBytes: 1024 * mib, MemoryPeakBytes: ptr[uint64](1500 * mib),
				MemoryWorkingSetBytes: 1000 * mib, CPUUsageUsec: cpuUsec(9_000_000)},
			wantCPU: `agent_version "3.2.0"; guest cgroup v1; 1 container(s) summed; memory limit: unlimited`,
		},
		{
			name: "old agent on a v2 guest sends us",
			opts: []kataagentfake.Option{kataagentfake.WithVersion("3.8.0"), kataagentfake.WithContainer("a", kataagentfake.V2(kataagentfake.Container{
				UsageBytes: 4 * mib, MaxUsageBytes: 4 * mib, CPUTotal: 2_500_000}))},
			ids: []string{"a"},
			want: source.Reading{Kind: source.KindGuestAgent, MemoryCurrentBytes: 4 * mib, MemoryPeakBytes: ptr[uint64](4 * mib),
				MemoryWorkingSetBytes: 4 * mib, CPUUsageUsec: cpuUsec(2_500_000)},
			wantCPU: `agent_version "3.8.0"; guest cgroup v2; 1 container(s) summed; CPU corrected from us (agent < 3.9.0 on a cgroup v2 guest)`,
		},
		{
			name: "three containers summed",
			opts: []kataagentfake.Option{kataagentfake.WithContainer("a", kataagentfake.V2(v2a)), kataagentfake.WithContainer("b", kataagentfake.V2(v2b)),
				kataagentfake.WithContainer("c", kataagentfake.V2(v2c))},
			ids: []string{"a", "b", "c"},
			want: source.Reading{Kind: source.KindGuestAgent, MemoryCurrentBytes: 358 * mib, MemoryPeakBytes: ptr[uint64](419 * mib),
				MemoryWorkingSetBytes: 248 * mib, CPUUsageUsec: cpuUsec(3_007_000)},
			wantCPU: "3 container(s) summed; memory peak is the sum of per-container peaks, an upper bound",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agent := kataagentfake.New(t, t.TempDir(), tc.opts...)
			s := mustOpen(t, agent.Address(), testConfig(), tc.ids...)
			got := sample(t, s)
			if !strings.Contains(got.Detail, tc.wantCPU) || !strings.Contains(got.Detail, agent.Address()) {
				t.Errorf("Detail = %q; want the address and %q", got.Detail, tc.wantCPU)
			}
			got.Detail = ""
			if diff := cmp.Diff(tc.want, withoutSignals(got)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// An agent that refuses Version is still read; its version is unknown, so
// a v2 guest's CPU is absent (unit unverified) rather than guessed.
func TestVersionRefused(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithVersionError(status.Error(codes.PermissionDenied, "denied by policy")),
		kataagentfake.WithContainer("a", kataagentfake.V2(v2a)))
	s := mustOpen(t, agent.Address(), testConfig(), "a")
	r := withoutSignals(sample(t, s))
	if !strings.Contains(r.Detail, `agent_version "unavailable: Version answered PermissionDenied"`) {
		t.Errorf("Detail = %q", r.Detail)
	}
	if r.MemoryWorkingSetBytes != 200*mib || r.CPUUsageUsec != nil || len(r.Absent) != 1 || r.Absent[0].Field != "cpu_usage_usec" {
		t.Errorf("reading %+v; want memory and an absent cpu_usage_usec", r)
	}
}

// One connection, one Version call, however many polls.
func TestPersistentConnection(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("a", kataagentfake.V2(v2a)), kataagentfake.WithContainer("b", kataagentfake.V2(v2b)))
	s := mustOpen(t, agent.Address(), testConfig(), "a", "b")
	for range 20 {
		sample(t, s)
	}
	accepted, closed, stats, versions := agent.Counts()
	if accepted != 1 || closed != 0 || stats != 40 || versions != 1 {
		t.Fatalf("accepted %d closed %d stats %d versions %d; want 1 0 40 1", accepted, closed, stats, versions)
	}
}

func TestUnknownAndFailingContainers(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(),
		kataagentfake.WithContainer("a", kataagentfake.V2(v2a)),
		kataagentfake.WithContainer("c", kataagentfake.V2(v2c)),
		kataagentfake.WithContainerError("b", status.Error(codes.Internal, "read memory.stat: no such device")))

	t.Run("one of three failing: partial", func(t *testing.T) {
		s := mustOpen(t, agent.Address(), testConfig(), "a", "b", "c")
		got := withoutSignals(sample(t, s))
		if len(got.UnreadContainers) != 1 || got.UnreadContainers[0].ID != "b" || !strings.Contains(got.UnreadContainers[0].Reason, "no such device") {
			t.Fatalf("UnreadContainers = %+v; want b with the agent's error", got.UnreadContainers)
		}
		if got.MemoryCurrentBytes != 308*mib || got.MemoryWorkingSetBytes != 208*mib {
			t.Fatalf("memory %d / %d; want a+c = %d / %d", got.MemoryCurrentBytes, got.MemoryWorkingSetBytes, 308*mib, 208*mib)
		}
		if got.MemoryPeakBytes != nil || got.CPUUsageUsec != nil || len(got.Absent) != 2 {
			t.Fatalf("partial sample: peak %v cpu %v absent %+v; want peak and cpu absent", got.MemoryPeakBytes, got.CPUUsageUsec, got.Absent)
		}
	})
	t.Run("unknown id", func(t *testing.T) {
		s := mustOpen(t, agent.Address(), testConfig(), "a", "ghost")
		got := sample(t, s)
		want := []source.ContainerError{{ID: "ghost", Reason: "unknown container"}}
		if diff := cmp.Diff(want, got.UnreadContainers); diff != "" {
			t.Fatalf("UnreadContainers (-want +got):\n%s", diff)
		}
	})
	t.Run("nothing readable: UNAVAILABLE", func(t *testing.T) {
		s := mustOpen(t, agent.Address(), testConfig(), "ghost", "b")
		_, err := s.Sample(context.Background())
		if !errors.Is(err, source.ErrNotMeasurable) || !strings.Contains(err.Error(), "ghost: unknown container") {
			t.Fatalf("err = %v; want ErrNotMeasurable listing ghost as unknown", err)
		}
	})
}

// clientGoroutines counts the goroutines of the client side (the source,
// bounded calls, the ttrpc client), not the fake agent's.
func clientGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "kataagentfake.") || strings.Contains(g, "ttrpc.(*serverConn)") || strings.Contains(g, "ttrpc.(*Server)") {
			continue
		}
		if strings.Contains(g, "ttrpc.(*Client)") || strings.Contains(g, "internal/microvm.") || strings.Contains(g, "internal/bounded.") {
			n++
		}
	}
	return n
}

// An agent that accepts a call and never answers costs each poll the call
// deadline and nothing more: no goroutine is left behind per poll.
func TestAgentNeverAnswers(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("a", kataagentfake.V2(v2a)), kataagentfake.WithContainer("b", kataagentfake.V2(v2b)))
	cfg := testConfig()
	cfg.CallTimeout = 30 * time.Millisecond
	s := mustOpen(t, agent.Address(), cfg, "a", "b")
	sample(t, s)
	base := clientGoroutines()
	agent.SetStatsHang(true)

	for i := range 30 {
		start := time.Now()
		_, err := s.Sample(context.Background())
		if !errors.Is(err, source.ErrTimeout) {
			t.Fatalf("poll %d: err = %v; want ErrTimeout", i, err)
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("poll %d took %s; the call deadline is %s", i, took, cfg.CallTimeout)
		}
	}
	// At most one call per container is ever in flight, so even right after
	// the polls only a handful of goroutines (two containers) can be busy.
	if got := clientGoroutines(); got > base+6 {
		t.Fatalf("client goroutines %d right after 30 hung polls; %d before", got, base)
	}
	// Each hung call ends at its own deadline; give a loaded machine time.
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got := clientGoroutines()
		if got <= base+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("client goroutines %d after 30 hung polls; %d before", got, base)
		}
	}
	// maxTimeoutsInARow unanswered calls in a row cost the connection (a
	// wedged one is never replaced otherwise: issue 16): the agent
	// recovers, a poll after the backoff reads on a new connection.
	agent.SetStatsHang(false)
	pollUntil(t, s, 3*time.Second, func(err error) bool { return err == nil })
	if accepted, _, _, _ := agent.Counts(); accepted < 2 {
		t.Fatalf("accepted %d connections; the hung connection was not replaced", accepted)
	}
}

// Sample honours the caller's deadline when it is shorter than CallTimeout.
func TestSampleHonoursCallerDeadline(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("a", kataagentfake.V2(v2a)))
	cfg := testConfig()
	cfg.CallTimeout = 10 * time.Second
	s := mustOpen(t, agent.Address(), cfg, "a")
	sample(t, s)
	agent.SetStatsHang(true)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Sample(ctx)
	if !errors.Is(err, source.ErrTimeout) || time.Since(start) > 2*time.Second {
		t.Fatalf("Sample = %v after %s; want ErrTimeout at the caller's 50ms deadline", err, time.Since(start))
	}
}

// At most one StatsContainer per container is in flight, however many
// callers poll at once; concurrent callers share it.
func TestOneCallInFlightPerContainer(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("a", kataagentfake.V2(v2a)))
	s := mustOpen(t, agent.Address(), testConfig(), "a")
	sample(t, s)
	agent.SetStatsDelay(100 * time.Millisecond)
	_, _, before, _ := agent.Counts()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := s.Sample(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	_, _, after, _ := agent.Counts()
	if got := agent.MaxConcurrentStats(); got != 1 {
		t.Fatalf("%d StatsContainer calls ran at once; want 1", got)
	}
	if after-before >= 8 {
		t.Fatalf("8 concurrent polls made %d calls; they should share the in-flight one", after-before)
	}
}

func TestHandshakeFaultsThroughSource(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    kataagentfake.Handshake
		want error
		text string
	}{
		{"garbage", kataagentfake.HandshakeGarbage, source.ErrMalformed, `does not start with "OK "`},
		{"closed", kataagentfake.HandshakeClose, source.ErrNotMeasurable, "closed the connection after CONNECT"},
		{"hang", kataagentfake.HandshakeHang, source.ErrTimeout, "i/o timeout"},
		{"silent after OK: Version never answered", kataagentfake.HandshakeSilent, source.ErrTimeout, "Version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithHandshake(tc.h), kataagentfake.WithContainer("a", kataagentfake.V2(v2a)))
			cfg := testConfig()
			cfg.CallTimeout = 100 * time.Millisecond
			cfg.MinBackoff, cfg.MaxBackoff = time.Hour, time.Hour
			s := mustOpen(t, agent.Address(), cfg, "a")
			_, err := s.Sample(context.Background())
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("err = %v; want %v with %q", err, tc.want, tc.text)
			}
			// The next poll does not redial within the backoff: it fails
			// at once and says why.
			dials := agent.Dials()
			_, err = s.Sample(context.Background())
			if !errors.Is(err, source.ErrNotMeasurable) || !strings.Contains(err.Error(), "next dial in") {
				t.Fatalf("second poll: %v; want ErrNotMeasurable during backoff", err)
			}
			if agent.Dials() != dials || dials != 1 {
				t.Fatalf("%d dials before the second poll, %d after; want 1 and no redial during backoff", dials, agent.Dials())
			}
		})
	}
}

// A killed agent fails the polls while it is gone; once it is back the next
// poll (after the capped backoff) reconnects.
func TestAgentKilledAndRestarted(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("a", kataagentfake.V2(v2a)))
	s := mustOpen(t, agent.Address(), testConfig(), "a")
	sample(t, s)

	agent.Stop()
	for range 3 {
		if _, err := s.Sample(context.Background()); !errors.Is(err, source.ErrNotMeasurable) {
			t.Fatalf("agent down: err = %v; want ErrNotMeasurable", err)
		}
		time.Sleep(15 * time.Millisecond)
	}
	agent.Restart()
	agent.SetContainer("a", kataagentfake.V2(v2b))
	deadline := time.Now().Add(2 * time.Second)
	for {
		r, err := s.Sample(context.Background())
		if err == nil {
			if r.MemoryCurrentBytes != 50*mib {
				t.Fatalf("after restart: memory %d, want %d", r.MemoryCurrentBytes, 50*mib)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reconnect within 2s of the restart (backoff capped at 40ms): %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if accepted, _, _, versions := agent.Counts(); accepted != 2 || versions != 2 {
		t.Fatalf("accepted %d, versions %d; want a second connection that asked Version again", accepted, versions)
	}
}

// Backoff doubles per failed dial and is capped.
func TestBackoffCapped(t *testing.T) {
	cfg := Config{MinBackoff: 100 * time.Millisecond, MaxBackoff: 300 * time.Millisecond}.withDefaults()
	s := mustOpen(t, "hvsock:///nonexistent/agent.sock:1024", cfg, "a")
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	var waits []time.Duration
	for range 5 {
		if _, err := s.Sample(context.Background()); !errors.Is(err, source.ErrNotMeasurable) {
			t.Fatalf("err = %v", err)
		}
		waits = append(waits, s.retryAt.Sub(now))
		now = s.retryAt
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond}
	if diff := cmp.Diff(want, waits); diff != "" {
		t.Fatalf("backoff (-want +got):\n%s", diff)
	}
}

// A reply just under ttrpc's 4 MiB frame limit is read (with the frame cap
// raised to that limit: the default cap is 256 KiB, see
// TestReplyOverDefaultFrameCap); one over it fails that poll cleanly and the
// next poll reconnects.
func TestReplyNearFrameLimit(t *testing.T) {
	big := kataagentfake.V2(v2a)
	stats := big.CgroupStats.MemoryStats.Stats
	// A few long keys: the agent copies memory.stat keys verbatim.
	for i := range 4 {
		stats[fmt.Sprintf("padding_%d_%s", i, strings.Repeat("x", 1<<20-32<<10))] = uint64(i)
	}
	if n := protoSize(big); n > 4<<20 || n < 4<<20-256<<10 {
		t.Fatalf("reply is %d bytes; want just under 4 MiB", n)
	}
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("a", big))
	cfg := testConfig()
	cfg.CallTimeout = 10 * time.Second // the race detector makes 4 MiB slow
	cfg.MaxFrameBytes = 4 << 20
	s := mustOpen(t, agent.Address(), cfg, "a")
	if r := sample(t, s); r.MemoryWorkingSetBytes != 200*mib {
		t.Fatalf("working set %d from the big reply", r.MemoryWorkingSetBytes)
	}

	stats["over"] = 1
	stats["padding_0_"+strings.Repeat("x", 1<<20-32<<10)+"y"] = 1
	stats["padding_5_"+strings.Repeat("x", 1<<20-32<<10)] = 1
	if n := protoSize(big); n <= 4<<20 {
		t.Fatalf("oversized reply is only %d bytes", n)
	}
	agent.SetContainer("a", big)
	if _, err := s.Sample(context.Background()); err == nil {
		t.Fatal("a reply over 4 MiB was read")
	} else if t.Logf("oversized reply: %v", err); !errors.Is(err, source.ErrNotMeasurable) && !errors.Is(err, source.ErrMalformed) {
		t.Fatalf("oversized reply: %v", err)
	}
	agent.SetContainer("a", kataagentfake.V2(v2b))
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := s.Sample(context.Background()); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no recovery after the oversized reply: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Close (the server calls it on CheckpointWorkload) ends the connection the
// agent sees; it is idempotent; a closed source is not measurable.
func TestCloseClosesConnection(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithContainer("a", kataagentfake.V2(v2a)))
	s := mustOpen(t, agent.Address(), testConfig(), "a")
	sample(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-agent.Disconnected():
	case <-time.After(2 * time.Second):
		t.Fatal("the agent did not see the connection close")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.Sample(context.Background()); !errors.Is(err, source.ErrNotMeasurable) {
		t.Fatalf("Sample after Close: %v", err)
	}
	if accepted, closed, _, _ := agent.Counts(); accepted != 1 || closed != 1 {
		t.Fatalf("accepted %d closed %d", accepted, closed)
	}
}

// vsock://cid:port reaches the injected dialer with that cid and port; here
// it hands back a plain Unix connection to the fake agent (no handshake, as
// on a real vsock), so the whole read path runs without AF_VSOCK.
func TestVsockAddressThroughInjectedDialer(t *testing.T) {
	agent := kataagentfake.New(t, t.TempDir(), kataagentfake.WithHandshake(kataagentfake.HandshakeNone), kataagentfake.WithContainer("a", kataagentfake.V2(v2a)))
	var mu sync.Mutex
	var dialled []string
	cfg := testConfig()
	cfg.DialVsock = func(ctx context.Context, cid, port uint32) (net.Conn, error) {
		mu.Lock()
		dialled = append(dialled, fmt.Sprintf("%d:%d", cid, port))
		mu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, "unix", agent.SocketPath())
	}
	s := mustOpen(t, "vsock://16187:1024", cfg, "a")
	r := sample(t, s)
	sample(t, s)
	if diff := cmp.Diff([]string{"16187:1024"}, dialled); diff != "" {
		t.Fatalf("dials (-want +got):\n%s", diff)
	}
	if r.MemoryWorkingSetBytes != 200*mib || !strings.Contains(r.Detail, "vsock://16187:1024") {
		t.Fatalf("reading %+v", r)
	}
}

// TestOpenRejects: Open trusts lifecycle validation (identity.ValidateRef,
// which tests the container rules) and only parses the address it dials.
func TestOpenRejects(t *testing.T) {
	if _, err := Open(source.SandboxRef{AgentAddress: "mock:///x", ContainerIDs: []string{"a"}}, Config{}); !errors.Is(err, ErrAddress) {
		t.Fatalf("bad address: err = %v, want ErrAddress", err)
	}
}

func testRef(addr string, ids ...string) source.SandboxRef {
	return source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: addr, ContainerIDs: ids}
}
