package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

// The kinds of NRIEvent.
const (
	NRIConfigure        = "Configure"
	NRISynchronize      = "Synchronize"
	NRIRunPodSandbox    = "RunPodSandbox"
	NRIStopPodSandbox   = "StopPodSandbox"
	NRIRemovePodSandbox = "RemovePodSandbox"
	NRIShutdown         = "Shutdown"
	// NRIClosed is not a call: the connection was lost (containerd
	// stopped) or dropped by Disconnect.
	NRIClosed = "Closed"
)

// NRIEvent is one call an NRIRecorder's plugin received, or the end of its
// connection.
type NRIEvent struct {
	Kind    string
	Conn    int               // the connection it came on: 1 for the first
	Pod     *api.PodSandbox   // the pod of a pod event
	Pods    []*api.PodSandbox // Synchronize's pods
	Runtime string            // Configure's runtime name and version
	At      time.Time
}

// NRIRecorderOptions configure StartNRIRecorder; the zero value is fine.
type NRIRecorderOptions struct {
	// Name is the plugin's name; "" makes a unique one.
	Name string
	// Index is its two-digit index, its place in NRI's plugin order; "" is
	// "50".
	Index string
	// Reconnect makes the recorder dial the socket again, every 100 ms,
	// when its connection is lost, until that succeeds or the recorder is
	// closed. NRI's stub itself never redials: a lost connection closes the
	// stub (Run returns) and only calls the stub.WithOnClose function.
	Reconnect bool
}

// NRIRecorder is an NRI plugin (NRI's Go stub) that records the pod events
// it receives (Configure, Synchronize, RunPodSandbox, StopPodSandbox,
// RemovePodSandbox, Shutdown) and the loss of its connection, for a test to
// observe what containerd tells a plugin such as the statsd bridge. Each
// connection is a new stub.
type NRIRecorder struct {
	socket, name, idx string
	reconnect         bool
	ctx               context.Context
	cancel            context.CancelFunc
	log               *SyncBuffer // the stub's log

	mu           sync.Mutex
	events       []NRIEvent
	changed      chan struct{} // closed and replaced when events grows
	stub         stub.Stub     // the live connection's, or nil
	live         int           // the live connection's number, or 0
	conns        int           // connections made
	reconnecting bool
	closed       bool
}

var nriRecorders atomic.Int64

// StartNRIRecorder connects an NRIRecorder to the NRI socket and waits for
// containerd to configure it (Synchronize follows at once). The test's
// cleanup closes it and logs the stub's log when the test failed.
func StartNRIRecorder(t testing.TB, socket string, opts NRIRecorderOptions) *NRIRecorder {
	t.Helper()
	r := &NRIRecorder{socket: socket, name: opts.Name, idx: opts.Index, reconnect: opts.Reconnect,
		log: &SyncBuffer{}, changed: make(chan struct{})}
	if r.name == "" {
		r.name = fmt.Sprintf("sbstest-%d-%d", os.Getpid(), nriRecorders.Add(1))
	}
	if r.idx == "" {
		r.idx = "50"
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	t.Cleanup(func() {
		r.Close()
		if t.Failed() {
			t.Logf("NRI plugin %s-%s log:\n%s", r.idx, r.name, r.log.String())
		}
	})
	r.Connect(t)
	return r
}

// Connect connects the recorder again after Disconnect (or a lost
// connection when it does not reconnect by itself).
func (r *NRIRecorder) Connect(t testing.TB) {
	t.Helper()
	if err := r.connect(); err != nil {
		t.Fatalf("NRI plugin %s-%s: %v\n%s", r.idx, r.name, err, r.log.String())
	}
}

func (r *NRIRecorder) connect() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return errors.New("recorder closed")
	}
	if r.live != 0 {
		r.mu.Unlock()
		return nil
	}
	r.conns++
	n := r.conns
	r.mu.Unlock()
	s, err := stub.New(&nriPlugin{r: r, conn: n},
		stub.WithPluginName(r.name), stub.WithPluginIdx(r.idx), stub.WithSocketPath(r.socket),
		stub.WithLogger(nriLogger{r.log}), stub.WithOnClose(func() { r.lost(n) }))
	if err != nil {
		return fmt.Errorf("nri stub: %w", err)
	}
	// Start returns once containerd configured the plugin.
	if err := s.Start(r.ctx); err != nil {
		return fmt.Errorf("nri stub on %s: %w", r.socket, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		s.Stop()
		return errors.New("recorder closed")
	}
	r.stub, r.live = s, n
	return nil
}

// lost is the stub's OnClose: connection n is gone.
func (r *NRIRecorder) lost(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n != r.live { // a failed attempt, or Disconnect's
		return
	}
	r.stub, r.live = nil, 0
	r.addLocked(NRIEvent{Kind: NRIClosed, Conn: n})
	if r.reconnect && !r.closed && !r.reconnecting {
		r.reconnecting = true
		go r.redial()
	}
}

// redial connects again every 100 ms until it succeeds or the recorder is
// closed.
func (r *NRIRecorder) redial() {
	defer func() {
		r.mu.Lock()
		r.reconnecting = false
		r.mu.Unlock()
	}()
	for {
		if err := r.connect(); err == nil {
			return
		}
		select {
		case <-r.ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Disconnect closes the plugin's connection (stub.Stop); it does not
// reconnect by itself, even with Reconnect, until Connect.
func (r *NRIRecorder) Disconnect(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	s, n := r.stub, r.live
	r.stub, r.live = nil, 0
	r.mu.Unlock()
	if s == nil {
		t.Fatalf("NRI plugin %s-%s: not connected", r.idx, r.name)
	}
	s.Stop()
	r.add(NRIEvent{Kind: NRIClosed, Conn: n})
}

// Connected reports whether the plugin is connected now, and on which
// connection.
func (r *NRIRecorder) Connected() (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.live != 0, r.live
}

// Close ends the recorder: no reconnection, the live connection closed.
func (r *NRIRecorder) Close() {
	r.mu.Lock()
	r.closed = true
	s := r.stub
	r.stub, r.live = nil, 0
	r.mu.Unlock()
	r.cancel()
	if s != nil {
		s.Stop()
	}
}

func (r *NRIRecorder) add(e NRIEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addLocked(e)
}

func (r *NRIRecorder) addLocked(e NRIEvent) {
	e.At = time.Now()
	r.events = append(r.events, e)
	close(r.changed)
	r.changed = make(chan struct{})
}

// Events returns the events so far, oldest first.
func (r *NRIRecorder) Events() []NRIEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]NRIEvent(nil), r.events...)
}

// Wait waits up to timeout for an event at index from or later (0: any;
// len(Events()) before an action: one the action caused) that match
// accepts, and returns it with its index; none fails the test with what
// came.
func (r *NRIRecorder) Wait(t testing.TB, from int, timeout time.Duration, what string, match func(NRIEvent) bool) (NRIEvent, int) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		for i := from; i < len(r.events); i++ {
			if match(r.events[i]) {
				e := r.events[i]
				r.mu.Unlock()
				return e, i
			}
		}
		changed := r.changed
		r.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("NRI plugin %s-%s: no %s within %v; events from %d: %s", r.idx, r.name, what, timeout, from, r.describe(from))
		}
	}
}

// describe lists the events from index from, one line each.
func (r *NRIRecorder) describe(from int) string {
	var b []byte
	for i, e := range r.Events() {
		if i < from {
			continue
		}
		b = fmt.Appendf(b, "\n  %d conn %d %s", i, e.Conn, e.Kind)
		if e.Pod != nil {
			b = fmt.Appendf(b, " %s/%s %s", e.Pod.GetNamespace(), e.Pod.GetName(), e.Pod.GetId())
		}
		for _, p := range e.Pods {
			b = fmt.Appendf(b, " [%s/%s]", p.GetNamespace(), p.GetName())
		}
	}
	return string(b)
}

// IsPodEvent returns a Wait matcher for the event kind about the pod id.
func IsPodEvent(kind, id string) func(NRIEvent) bool {
	return func(e NRIEvent) bool { return e.Kind == kind && e.Pod.GetId() == id }
}

// nriPlugin is one connection's plugin: it records into r.
type nriPlugin struct {
	r    *NRIRecorder
	conn int
}

func (p *nriPlugin) Configure(_ context.Context, _, runtime, version string) (api.EventMask, error) {
	p.r.add(NRIEvent{Kind: NRIConfigure, Conn: p.conn, Runtime: runtime + " " + version})
	return 0, nil // the events this plugin implements
}

func (p *nriPlugin) Synchronize(_ context.Context, pods []*api.PodSandbox, _ []*api.Container) ([]*api.ContainerUpdate, error) {
	p.r.add(NRIEvent{Kind: NRISynchronize, Conn: p.conn, Pods: pods})
	return nil, nil
}

func (p *nriPlugin) Shutdown(context.Context) {
	p.r.add(NRIEvent{Kind: NRIShutdown, Conn: p.conn})
}

func (p *nriPlugin) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.r.add(NRIEvent{Kind: NRIRunPodSandbox, Conn: p.conn, Pod: pod})
	return nil
}

func (p *nriPlugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.r.add(NRIEvent{Kind: NRIStopPodSandbox, Conn: p.conn, Pod: pod})
	return nil
}

func (p *nriPlugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.r.add(NRIEvent{Kind: NRIRemovePodSandbox, Conn: p.conn, Pod: pod})
	return nil
}

// nriLogger is the stub's logger: a timestamped line per message into a
// buffer the recorder logs when the test fails.
type nriLogger struct{ b *SyncBuffer }

func (l nriLogger) logf(level, format string, args ...any) {
	fmt.Fprintf(l.b, "%s %s %s\n", time.Now().Format("15:04:05.000"), level, fmt.Sprintf(format, args...))
}

func (l nriLogger) Debugf(_ context.Context, format string, args ...any) {
	l.logf("debug", format, args...)
}
func (l nriLogger) Infof(_ context.Context, format string, args ...any) {
	l.logf("info", format, args...)
}
func (l nriLogger) Warnf(_ context.Context, format string, args ...any) {
	l.logf("warn", format, args...)
}
func (l nriLogger) Errorf(_ context.Context, format string, args ...any) {
	l.logf("error", format, args...)
}
