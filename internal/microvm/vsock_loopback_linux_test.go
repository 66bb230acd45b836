package microvm

// The one test that opens a real AF_VSOCK socket, and only inside the VM
// lane's guest: there the vsock_loopback module keeps every connection inside
// the VM, which has no vsock device. On the host a vsock connect (to any CID)
// leaves the machine, so the test skips before anything else unless
// testenv.InVMLane.
//
// The seam is Config.DialVsock, which production never sets (cmd/statsd
// passes CallTimeout and Logger only): the source parses "vsock://3:<port>"
// with the production parser, which refuses every CID below 3, and dials it
// through loopbackDialer, which checks it was asked for cid 3 and that port
// and calls the production default dialVsock (mdlayher/vsock's DialContext)
// with VMADDR_CID_LOCAL instead. Everything else (the address, dial's error
// classification, the AF_VSOCK socket, the frame guard, ttrpc, conversion,
// reconnection) is production code.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/mdlayher/vsock"

	"github.com/sandboxstats/sandboxstats/internal/kataagentfake"
	"github.com/sandboxstats/sandboxstats/internal/source"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// loopbackPort is the vsock port the fake agent listens on in the guest: any
// free port; not the agent's 1024, so nothing takes it for a real agent.
const loopbackPort uint32 = 20007

// vsockModules give the guest its vsock loopback, in load order. The VM lane
// loads them with VMLane.Modules = []string{"vsock_loopback"} (modules.dep
// brings the other two).
var vsockModules = []string{"vsock", "vmw_vsock_virtio_transport_common", "vsock_loopback"}

// TestIntegrationVsockLoopback reads the fake agent over a real AF_VSOCK
// connection on the guest's loopback: the figures, a bounded error while the
// agent is gone, and a reconnect once it serves the same port again.
func TestIntegrationVsockLoopback(t *testing.T) {
	// First, before any socket: on the host AF_VSOCK leaves the machine.
	if !testenv.InVMLane() {
		t.Skipf("opens AF_VSOCK sockets: runs only inside the VM lane's guest (kernel command line %q; modules %s; no vsock device); on this machine a vsock connect would leave it",
			testenv.VMLaneMarker, strings.Join(vsockModules, ", "))
	}
	needVsockLoopback(t, loopbackPort)

	// Production still refuses the loopback CID (and the other two below
	// 3): only the test's dialer reaches it.
	for _, cid := range []uint32{vsock.Hypervisor, vsock.Local, vsock.Host} {
		if _, err := ParseAddress(fmt.Sprintf("vsock://%d:%d", cid, loopbackPort)); !errors.Is(err, ErrAddress) {
			t.Fatalf("ParseAddress of CID %d: err = %v; want ErrAddress", cid, err)
		}
	}
	runLoopbackScenario(t, loopbackScenario{
		listen: func() (net.Listener, error) { return listenVsockLoopback(loopbackPort) },
		addr:   fmt.Sprintf("vsock://%d:%d", minGuestCID, loopbackPort),
		dialer: &loopbackDialer{wantCID: minGuestCID, wantPort: loopbackPort, reach: func(ctx context.Context) (net.Conn, error) {
			return dialVsock(ctx, vsock.Local, loopbackPort) // the production default, CID swapped
		}},
	})
}

// TestVsockLoopbackScenarioOverUnix runs TestIntegrationVsockLoopback's
// scenario on the host over a Unix socket (no AF_VSOCK), through the same
// DialVsock seam, so that the guest-only test's own logic is checked on
// every run.
func TestVsockLoopbackScenarioOverUnix(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	runLoopbackScenario(t, loopbackScenario{
		listen: func() (net.Listener, error) {
			_ = os.Remove(path)
			return net.Listen("unix", path)
		},
		addr: "vsock://16187:1024",
		dialer: &loopbackDialer{wantCID: 16187, wantPort: 1024, reach: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}},
	})
}

// loopbackScenario is the transport the scenario runs over: the fake's
// listener, the vsock address the source parses, and the dialer the source
// is given.
type loopbackScenario struct {
	listen kataagentfake.ListenFunc
	addr   string
	dialer *loopbackDialer
}

// runLoopbackScenario: (1) a sample equals the fake's figures; (2) with the
// agent stopped, every sample fails within the call timeout (plus a margin
// for a TCG guest) as not measurable, the first after a real, failed dial;
// (3) once the agent serves again, a sample reads it on a new connection.
func runLoopbackScenario(t *testing.T, sc loopbackScenario) {
	t.Helper()
	const margin = time.Second // a TCG guest is slow; the bounds are seconds
	agent := kataagentfake.NewOn(t, sc.listen, kataagentfake.WithHandshake(kataagentfake.HandshakeNone),
		kataagentfake.WithVersion("4.1.0"), kataagentfake.WithContainer("a", kataagentfake.V2(v2a)))
	cfg := Config{CallTimeout: 2 * time.Second, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		DialVsock: sc.dialer.dial}
	s := mustOpen(t, sc.addr, cfg, "a")
	defer func() {
		if bad := sc.dialer.wrong(); len(bad) > 0 {
			t.Errorf("the source dialled %v; want only %d:%d", bad, sc.dialer.wantCID, sc.dialer.wantPort)
		}
	}()

	if !t.Run("read", func(t *testing.T) {
		got := sample(t, s)
		checkLoopbackReading(t, s, got, "a", kataagentfake.V2(v2a), source.Reading{Kind: source.KindGuestAgent,
			MemoryCurrentBytes: 300 * mib, MemoryPeakBytes: ptr[uint64](350 * mib), MemoryWorkingSetBytes: 200 * mib,
			CPUUsageUsec: cpuUsec(2_500_000)})
		if accepted, _, stats, versions := agent.Counts(); accepted != 1 || stats != 1 || versions != 1 {
			t.Errorf("agent saw %d connection(s), %d StatsContainer, %d Version; want 1 1 1", accepted, stats, versions)
		}
	}) {
		return
	}
	if !t.Run("agent down", func(t *testing.T) {
		agent.Stop()
		waitConnEnded(t, s, 5*time.Second)
		before := sc.dialer.count()
		var errs []error
		for start := time.Now(); len(errs) < 5 || sc.dialer.count() == before; time.Sleep(cfg.MinBackoff) {
			if time.Since(start) > 10*time.Second {
				t.Fatalf("no redial within 10s of the agent stopping (backoff at most %s); errors: %v", cfg.MaxBackoff, errs)
			}
			t0 := time.Now()
			_, err := s.Sample(context.Background())
			if took := time.Since(t0); took > cfg.CallTimeout+margin {
				t.Fatalf("Sample with the agent down took %s; the call timeout is %s: %v", took, cfg.CallTimeout, err)
			}
			if !errors.Is(err, source.ErrNotMeasurable) {
				t.Fatalf("Sample with the agent down: err = %v; want ErrNotMeasurable", err)
			}
			errs = append(errs, err)
		}
		// The dead connection was noticed, so the first poll redialled:
		// the real connect to a port nobody listens on failed at once.
		if !strings.Contains(errs[0].Error(), "dial "+sc.addr) {
			t.Errorf("first Sample with the agent down: %v; want the failed dial of %s", errs[0], sc.addr)
		}
		if err := sc.dialer.lastErr(); err == nil {
			t.Errorf("the last dial with the agent down succeeded")
		} else {
			t.Logf("dial with the agent down: %v", err)
		}
	}) {
		return
	}
	t.Run("agent back", func(t *testing.T) {
		agent.SetContainer("a", kataagentfake.V2(v2b))
		agent.Restart()
		var got source.Reading
		var err error
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(cfg.MinBackoff) {
			if got, err = s.Sample(context.Background()); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no reconnect within 10s of the agent serving again (backoff at most %s): %v", cfg.MaxBackoff, err)
			}
		}
		checkLoopbackReading(t, s, got, "a", kataagentfake.V2(v2b), source.Reading{Kind: source.KindGuestAgent,
			MemoryCurrentBytes: 50 * mib, MemoryPeakBytes: ptr[uint64](60 * mib), MemoryWorkingSetBytes: 40 * mib,
			CPUUsageUsec: cpuUsec(500_000)})
		if accepted, _, _, versions := agent.Counts(); accepted != 2 || versions != 2 {
			t.Errorf("agent saw %d connection(s), %d Version; want a second connection that asked Version again", accepted, versions)
		}
	})
}

// checkLoopbackReading compares a sample of one container with what its
// reply should give: the memory and CPU figures (CPU ns -> us) written out,
// and the whole reading, signals and detail included, as the conversion
// alone makes it from the reply with the version the connection learned.
func checkLoopbackReading(t *testing.T, s *guestSource, got source.Reading, id string, reply *katagrpc.StatsContainerResponse, want source.Reading) {
	t.Helper()
	s.mu.Lock()
	c := s.conn
	s.mu.Unlock()
	if c == nil {
		t.Fatal("no connection after a successful Sample")
	}
	if c.version.Raw != "4.1.0" {
		t.Errorf("agent version %q; want 4.1.0", c.version.Raw)
	}
	if !strings.Contains(got.Detail, s.addr.String()) || !strings.Contains(got.Detail, `agent_version "4.1.0"; guest cgroup v2`) {
		t.Errorf("Detail = %q; want the address and the agent version", got.Detail)
	}
	core := withoutSignals(got)
	core.Detail = ""
	if diff := cmp.Diff(want, core); diff != "" {
		t.Errorf("memory and CPU (-want +got):\n%s", diff)
	}
	full, err := aggregate(s.addr.String(), c.version, []containerResult{ok(id, reply, c.version)})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(full, got); diff != "" {
		t.Errorf("reading over the wire vs the reply converted in-process (-want +got):\n%s", diff)
	}
}

// waitConnEnded waits until the source's connection has ended (its ttrpc
// client read the peer's close), so that the next Sample dials.
func waitConnEnded(t *testing.T, s *guestSource, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		c := s.conn
		s.mu.Unlock()
		if c == nil || c.dead() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the source's connection still open %s after the agent closed it: the peer's close never arrived", within)
		}
	}
}

// loopbackDialer is the test's Config.DialVsock: it records what the source
// asked for (the cid and port it parsed) and reaches the listener through
// reach instead.
type loopbackDialer struct {
	wantCID, wantPort uint32
	reach             func(ctx context.Context) (net.Conn, error)

	mu    sync.Mutex
	dials int
	bad   []string // cid:port asked for other than want
	last  error    // the last dial's error
}

func (d *loopbackDialer) dial(ctx context.Context, cid, port uint32) (net.Conn, error) {
	d.mu.Lock()
	d.dials++
	if cid != d.wantCID || port != d.wantPort {
		d.bad = append(d.bad, fmt.Sprintf("%d:%d", cid, port))
		d.mu.Unlock()
		return nil, fmt.Errorf("test dialer: asked for %d:%d, want %d:%d", cid, port, d.wantCID, d.wantPort)
	}
	d.mu.Unlock()
	conn, err := d.reach(ctx)
	d.mu.Lock()
	d.last = err
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return conn, nil
}

func (d *loopbackDialer) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dials
}

func (d *loopbackDialer) lastErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last
}

func (d *loopbackDialer) wrong() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.bad...)
}

// listenVsockLoopback listens on VMADDR_CID_LOCAL:port. A restart may find
// the port still held for a moment by the closing listener: it retries
// EADDRINUSE for a few seconds.
func listenVsockLoopback(port uint32) (net.Listener, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := vsock.ListenContextID(vsock.Local, port, nil)
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return nil, fmt.Errorf("vsock listen on local(%d):%d: %w", vsock.Local, port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// needVsockLoopback fails the test, saying which module is missing, unless
// a listener can be bound on VMADDR_CID_LOCAL:port. (Inside the lane the
// modules are loaded; there is no skip.)
func needVsockLoopback(t *testing.T, port uint32) {
	t.Helper()
	l, err := vsock.ListenContextID(vsock.Local, port, nil)
	if err == nil {
		l.Close()
		return
	}
	switch {
	case errors.Is(err, syscall.EAFNOSUPPORT):
		t.Fatalf("the AF_VSOCK socket family is unavailable: the vsock module is not loaded (modules %s): %v", moduleState(), err)
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		t.Fatalf("CID %d (VMADDR_CID_LOCAL) cannot be bound: the vsock_loopback transport is not loaded (modules %s): %v", vsock.Local, moduleState(), err)
	default:
		t.Fatalf("vsock listen on local(%d):%d (modules %s): %v", vsock.Local, port, moduleState(), err)
	}
}

// moduleState says which of vsockModules /sys/module shows loaded.
func moduleState() string {
	var parts []string
	for _, m := range vsockModules {
		state := "loaded"
		if _, err := os.Stat(filepath.Join("/sys/module", m)); err != nil {
			state = "not loaded"
		}
		parts = append(parts, m+" "+state)
	}
	return strings.Join(parts, ", ")
}
