package nribridge

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
)

// runtime is the runtime side of NRI, as containerd embeds it
// (nri/pkg/adaptation), on a socket in a test directory: it relays pod
// events to the plugins connected and synchronizes each new one with the
// pods it is given.
type runtime struct {
	*adaptation.Adaptation
	// socket is where plugins connect: a proxy to the adaptation's own,
	// so that Stop can close their connections as a containerd that exits
	// does (the adaptation's Stop leaves external plugins connected).
	socket string
	proxy  *proxy

	mu   sync.Mutex
	pods []*api.PodSandbox
	ctrs []*api.Container
}

// startRuntime starts the NRI runtime side on dir/nri.sock, its
// Synchronize listing pods, until the test ends or Stop.
func startRuntime(t *testing.T, dir string, pods []*api.PodSandbox) *runtime {
	t.Helper()
	rt := &runtime{socket: filepath.Join(dir, "nri.sock"), pods: pods}
	inner := filepath.Join(dir, "nri-runtime.sock")
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		rt.mu.Lock()
		pods, ctrs := slices.Clone(rt.pods), slices.Clone(rt.ctrs)
		rt.mu.Unlock()
		_, err := cb(ctx, pods, ctrs)
		return err
	}
	update := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
	a, err := adaptation.New("containerd", "v2.4.2", sync, update,
		adaptation.WithSocketPath(inner), adaptation.WithPluginPath(filepath.Join(dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	rt.Adaptation = a
	rt.proxy = startProxy(t, rt.socket, inner)
	t.Cleanup(rt.Stop)
	return rt
}

// Stop stops the runtime side as containerd exiting does: the plugins'
// connections close.
func (rt *runtime) Stop() {
	rt.proxy.close()
	rt.Adaptation.Stop()
}

// proxy forwards connections on a Unix socket to another.
type proxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	done  bool
}

func startProxy(t *testing.T, from, to string) *proxy {
	t.Helper()
	ln, err := net.Listen("unix", from)
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("unix", to)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.done {
				p.mu.Unlock()
				c.Close()
				u.Close()
				return
			}
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); u.Close() }()
			go func() { _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
	return p
}

func (p *proxy) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	p.done = true
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
}

func (rt *runtime) setPods(pods ...*api.PodSandbox) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.pods = pods
}

// connect runs b.Connect to rt with short backoffs until the test ends,
// and waits until the bridge is connected and synchronized.
func connect(t *testing.T, b *testBridge, rt *runtime) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = b.Connect(ctx, ConnectOptions{Socket: rt.socket, MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	}()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, "connected", func() bool { ok, _ := b.Health(); return ok })
}

// TestReconnectAfterRuntimeRestart: containerd restarting closes the
// connection; the bridge reconnects with backoff, and the new
// connection's Synchronize binds the pods started and ends those gone
// while it was down.
func TestReconnectAfterRuntimeRestart(t *testing.T) {
	f := fakes(t, 1)[0]
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	dir := shortDir(t)
	rt := startRuntime(t, dir, []*api.PodSandbox{testPod(1), testPod(2)})
	connect(t, b, rt)
	eventually(t, "synchronized pods bound", func() bool { return slices.Equal(boundUIDs(f), uids(1, 2)) })
	ctx := context.Background()
	if err := rt.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: testPod(3)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pod 3 bound", func() bool { return slices.Equal(boundUIDs(f), uids(1, 2, 3)) })

	rt.Stop() // containerd stops
	eventually(t, "disconnected", func() bool { ok, _ := b.Health(); return !ok })
	if _, detail := b.Health(); detail == "" {
		t.Error("no reason given for not being connected")
	}
	// It comes back knowing pods 2, 3 and 4 (1 ended meanwhile).
	rt2 := startRuntime(t, dir, []*api.PodSandbox{testPod(2), testPod(3), testPod(4)})
	eventually(t, "reconnected", func() bool { ok, _ := b.Health(); return ok })
	eventually(t, "reconciled", func() bool { return slices.Equal(boundUIDs(f), uids(2, 3, 4)) })
	if err := rt2.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: testPod(2)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pod 2 checkpointed through the new connection", func() bool { return slices.Equal(boundUIDs(f), uids(3, 4)) })
	if n := b.m.connections; n == nil {
		t.Fatal("no connections counter")
	}
}

// TestConnectWithoutNRI: no NRI socket (NRI disabled, or containerd not up
// yet): the bridge says why and keeps trying; it connects once the socket
// is there.
func TestConnectWithoutNRI(t *testing.T) {
	f := fakes(t, 1)[0]
	b := startBridge(t, []*statsdfake.Lifecycle{f}, nil)
	dir := shortDir(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = b.Connect(ctx, ConnectOptions{Socket: filepath.Join(dir, "nri.sock"), MinBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	}()
	defer func() { cancel(); <-done }()
	time.Sleep(100 * time.Millisecond)
	if ok, detail := b.Health(); ok || !containsAll(detail, "not connected to NRI", "nri.sock") {
		t.Errorf("Health() = %v, %q", ok, detail)
	}
	startRuntime(t, dir, []*api.PodSandbox{testPod(1)})
	eventually(t, "connected", func() bool { ok, _ := b.Health(); return ok })
	eventually(t, "bound", func() bool { return slices.Equal(boundUIDs(f), uids(1)) })
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
