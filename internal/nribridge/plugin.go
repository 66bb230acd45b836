package nribridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

// The NRI plugin: its name and index (the order among plugins: the bridge
// adjusts nothing, so late).
const (
	PluginName  = "sandboxstats"
	PluginIndex = "90"
)

// plugin is the stub's view of the bridge: every handler records the event
// and answers at once, always without an error (an error returned by a
// plugin fails the pod's request). abandoned, set when its connection
// attempt was given up, makes its Configure fail (see connectOnce).
type plugin struct {
	b         *Bridge
	abandoned *atomic.Bool
}

var (
	_ stub.ConfigureInterface           = plugin{}
	_ stub.SynchronizeInterface         = plugin{}
	_ stub.RunPodInterface              = plugin{}
	_ stub.StopPodInterface             = plugin{}
	_ stub.RemovePodInterface           = plugin{}
	_ stub.PostCreateContainerInterface = plugin{}
	_ stub.StopContainerInterface       = plugin{}
	_ stub.RemoveContainerInterface     = plugin{}
	_ stub.ShutdownInterface            = plugin{}
)

// errAbandoned: the Configure of a connection attempt given up.
var errAbandoned = errors.New("nri: connection attempt abandoned")

// Configure subscribes to the events the plugin handles (0: all of them),
// unless the attempt was abandoned.
func (p plugin) Configure(context.Context, string, string, string) (api.EventMask, error) {
	if p.abandoned != nil && p.abandoned.Load() {
		return 0, errAbandoned
	}
	return 0, nil
}

func (p plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, containers []*api.Container) ([]*api.ContainerUpdate, error) {
	p.b.Synchronize(pods, containers)
	return nil, nil
}

func (p plugin) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.b.RunPodSandbox(pod)
	return nil
}

func (p plugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.b.StopPodSandbox(pod)
	return nil
}

func (p plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.b.RemovePodSandbox(pod)
	return nil
}

func (p plugin) PostCreateContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) error {
	p.b.ContainerCreated(pod, c)
	return nil
}

func (p plugin) StopContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) ([]*api.ContainerUpdate, error) {
	p.b.ContainerStopped(pod, c)
	return nil, nil
}

func (p plugin) RemoveContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) error {
	p.b.ContainerRemoved(pod, c)
	return nil
}

func (p plugin) Shutdown(context.Context) {
	p.b.m.event("shutdown")
	p.b.notes.add(slog.LevelInfo, "nri: the runtime is shutting down", "")
}

// ConnectOptions configure Connect.
type ConnectOptions struct {
	// Socket is NRI's socket (default /var/run/nri/nri.sock).
	Socket string
	// MinBackoff and MaxBackoff bound the wait between connection attempts
	// (defaults 1s, 30s).
	MinBackoff, MaxBackoff time.Duration
	// ConfigureTimeout bounds how long a registration may wait for the
	// runtime's Configure (default 30s).
	ConfigureTimeout time.Duration
}

// Connect keeps the bridge connected to NRI until ctx ends: it registers
// the plugin (not required by the runtime: its failure policy lets every
// request proceed without it), and when the connection is lost (containerd
// restarting) or cannot be made (NRI disabled, the socket not there yet) it
// tries again after a backoff doubling from MinBackoff to MaxBackoff,
// reset once a connection has lasted a minute. Each connection begins with
// a Synchronize, which the Bridge reconciles. It returns nil once ctx
// ended.
func (b *Bridge) Connect(ctx context.Context, o ConnectOptions) error {
	if o.Socket == "" {
		o.Socket = api.DefaultSocketPath
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = time.Second
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 30 * time.Second
	}
	if o.ConfigureTimeout <= 0 {
		o.ConfigureTimeout = 30 * time.Second
	}
	wait := o.MinBackoff
	for {
		began := time.Now()
		err := b.connectOnce(ctx, o)
		if ctx.Err() != nil {
			b.SetConnected(false, "stopped")
			return nil
		}
		if errors.Is(err, errRefresh) {
			// Closed on purpose for a fresh Synchronize: at once, and
			// still counted connected and synchronized meanwhile.
			b.m.refreshes.Inc()
			b.mu.Lock()
			n := len(b.unannounced)
			b.refreshing = true
			b.mu.Unlock()
			b.notes.add(slog.LevelInfo, "nri: reconnecting for a fresh Synchronize", "refresh", "unannounced_pods", n)
			continue
		}
		b.SetConnected(false, err.Error())
		b.mu.Lock()
		b.refreshing = false // whoever answers next may have restarted
		b.mu.Unlock()
		if time.Since(began) > time.Minute {
			wait = o.MinBackoff
		}
		b.notes.add(slog.LevelWarn, "nri: not connected, trying again", "connect", "socket", o.Socket, "in", wait, "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, o.MaxBackoff)
	}
}

// errRefresh: connectOnce closed the connection for a fresh Synchronize.
var errRefresh = errors.New("closed for a fresh Synchronize")

// connectOnce makes one connection (a fresh stub: a stub whose start
// failed may keep its dead connection) and returns when it is lost, a
// refresh is asked (errRefresh) or ctx ends.
func (b *Bridge) connectOnce(ctx context.Context, o ConnectOptions) error {
	closed := make(chan struct{})
	var once sync.Once
	var conn net.Conn
	var connMu sync.Mutex
	abandoned := &atomic.Bool{}
	st, err := stub.New(plugin{b, abandoned},
		stub.WithPluginName(PluginName), stub.WithPluginIdx(PluginIndex),
		stub.WithSocketPath(o.Socket),
		stub.WithDialer(func(path string) (net.Conn, error) {
			c, err := net.DialTimeout("unix", path, 5*time.Second)
			connMu.Lock()
			conn = c
			connMu.Unlock()
			return c, err
		}),
		stub.WithOnClose(func() { once.Do(func() { close(closed) }) }),
		stub.WithFailurePolicy(&api.FailurePolicy{FailRequest: false, KeepConnected: false}),
		stub.WithLogger(nriLogger{b.notes}),
	)
	if err != nil {
		return fmt.Errorf("nri plugin: %w", err)
	}
	started := make(chan error, 1)
	go func() { started <- st.Start(ctx) }()
	select {
	case err = <-started:
	case <-time.After(o.ConfigureTimeout):
		// Registered but never configured: the stub is dropped with its
		// connection.
		abandonStart(st, abandoned, started, func() net.Conn { connMu.Lock(); defer connMu.Unlock(); return conn })
		return fmt.Errorf("connect %s: the runtime did not configure the plugin within %s", o.Socket, o.ConfigureTimeout)
	case <-ctx.Done():
		abandonStart(st, abandoned, started, func() net.Conn { connMu.Lock(); defer connMu.Unlock(); return conn })
		return ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("connect %s: %w", o.Socket, err)
	}
	b.SetConnected(true, "")
	b.log.Info("connected to NRI", "socket", o.Socket, "plugin", PluginIndex+"-"+PluginName, "runtime_nri_version", st.RuntimeNRIVersion())
	// A refresh asked before this connection's Synchronize is served by it.
	select {
	case <-b.refresh:
	default:
	}
	select {
	case <-closed:
		b.log.Warn("lost the NRI connection", "socket", o.Socket)
		return errors.New("connection lost")
	case <-b.refresh:
		st.Stop()
		return errRefresh
	case <-ctx.Done():
		st.Stop()
		return ctx.Err()
	}
}

// configurer is the stub's Configure request handler (the runtime's call).
type configurer interface {
	Configure(context.Context, *api.ConfigureRequest) (*api.ConfigureResponse, error)
}

// abandonStart ends a stub's Start that did not finish, with its
// goroutines, and returns once it returned (or after 5s, logged). It
// closes the connection, which fails a Start still registering. A Start
// registered waits for the runtime's Configure alone, holding the stub's
// lock, which the connection's close handler (the stub's connClosed) needs
// too: neither would ever return (nri v0.12.5, stub.Start). So the stub is
// given a Configure as the runtime would, which the abandoned plugin
// fails: Start returns its error and closes what it opened.
func abandonStart(st stub.Stub, abandoned *atomic.Bool, started <-chan error, conn func() net.Conn) {
	abandoned.Store(true)
	c := conn()
	if c != nil {
		c.Close()
	}
	select {
	case <-started:
		return
	case <-time.After(100 * time.Millisecond):
	}
	// Dialed (else the dial itself is bounded, and fails): the stub's
	// Configure has somewhere to answer Start.
	if cf, ok := st.(configurer); ok && c != nil {
		go func() { _, _ = cf.Configure(context.Background(), &api.ConfigureRequest{}) }()
	}
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		slog.Default().Warn("nri: an abandoned plugin stub did not stop within 5s")
	}
}

// nriLogger sends the stub's log to the bridge's log, through the bounded
// queue (the stub logs from its request handlers too); its Info is Debug.
type nriLogger struct{ n *notes }

func (l nriLogger) Debugf(_ context.Context, format string, args ...any) {
	l.n.add(slog.LevelDebug, "nri stub: "+fmt.Sprintf(format, args...), "")
}

func (l nriLogger) Infof(_ context.Context, format string, args ...any) {
	l.n.add(slog.LevelDebug, "nri stub: "+fmt.Sprintf(format, args...), "")
}

func (l nriLogger) Warnf(_ context.Context, format string, args ...any) {
	l.n.add(slog.LevelWarn, "nri stub: "+fmt.Sprintf(format, args...), format)
}

func (l nriLogger) Errorf(_ context.Context, format string, args ...any) {
	l.n.add(slog.LevelError, "nri stub: "+fmt.Sprintf(format, args...), format)
}
