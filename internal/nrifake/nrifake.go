// Package nrifake runs the runtime side of NRI for tests of an NRI
// plugin (the bridge, cmd/statsnri): containerd's own NRI adaptation
// (github.com/containerd/nri/pkg/adaptation) on a Unix socket, behind a
// proxy so that Stop closes the plugins' connections as a containerd that
// exits does. The adaptation logs through NRI's global logger
// (nri/pkg/log.Set). No binary links it (internal/deptest).
package nrifake

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
)

// Runtime is the runtime side of NRI as containerd embeds it
// (nri/pkg/adaptation), on a socket in a test directory: it relays pod
// events to the plugins connected (RunPodSandbox and the rest, waiting
// for each plugin as containerd does) and synchronizes each new one with
// the pods it is given.
type Runtime struct {
	*adaptation.Adaptation
	// Socket is where plugins connect: a proxy to the adaptation's own,
	// so that Stop can close their connections as a containerd that exits
	// does (the adaptation's Stop leaves external plugins connected).
	Socket string
	proxy  *proxy

	mu      sync.Mutex
	pods    []*api.PodSandbox
	ctrs    []*api.Container
	plugins int
}

// Start starts the NRI runtime side on dir/nri.sock (Socket), its
// Synchronize listing pods, until the test ends or Stop.
func Start(t testing.TB, dir string, pods ...*api.PodSandbox) *Runtime {
	t.Helper()
	rt := &Runtime{Socket: filepath.Join(dir, "nri.sock"), pods: pods}
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
		adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")), adaptation.WithMetrics(counter{rt}))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	rt.Adaptation = a
	rt.proxy = startProxy(t, rt.Socket, inner)
	t.Cleanup(rt.Stop)
	return rt
}

// counter keeps the adaptation's count of plugins registered.
type counter struct{ rt *Runtime }

func (c counter) RecordPluginInvocation(string, string, error)                               {}
func (c counter) RecordPluginLatency(string, string, time.Duration)                          {}
func (c counter) RecordPluginAdjustments(string, string, *api.ContainerAdjustment, int, int) {}
func (c counter) UpdatePluginCount(n int) {
	c.rt.mu.Lock()
	defer c.rt.mu.Unlock()
	c.rt.plugins = n
}

// WaitPlugins waits up to 10s until n plugins are registered: connected and
// synchronized, so that the events relayed from now on reach them.
// (containerd holds the pod events of its CRI service while a plugin
// synchronizes; the adaptation alone relays them to the plugins registered
// so far.)
func (rt *Runtime) WaitPlugins(t testing.TB, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rt.mu.Lock()
		got := rt.plugins
		rt.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nrifake: %d plugins registered after 10s, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// SetContainers sets the containers the next Synchronize lists.
func (rt *Runtime) SetContainers(ctrs ...*api.Container) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.ctrs = ctrs
}

// Stop stops the runtime side as containerd exiting does: the plugins'
// connections close.
func (rt *Runtime) Stop() {
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

func startProxy(t testing.TB, from, to string) *proxy {
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

// SetPods sets what the Synchronize of the next plugin to connect lists.
func (rt *Runtime) SetPods(pods ...*api.PodSandbox) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.pods = pods
}
