package nribridge

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Statsd names one statsd the bridge drives.
type Statsd struct {
	// Lifecycle is its lifecycle socket (RunWorkload, CheckpointWorkload).
	Lifecycle string
	// Stats is its stats socket (StatsActiveWorkloads: what it holds).
	Stats string
}

// Options configure a Bridge. Zero durations and counts take the defaults
// named.
type Options struct {
	Mapping Config
	Kata    KataLayout
	// Statsd are the daemons pods are spread over, by a hash of the pod
	// uid: their order is part of the placement (a pod is found where it
	// was bound only while the list is the same).
	Statsd []Statsd
	// CallTimeout bounds every call to a statsd (default 10s).
	CallTimeout time.Duration
	// Resync is how often every statsd is listed and made to hold exactly
	// the running pods placed on it (default 5m; negative: only after each
	// Synchronize).
	Resync time.Duration
	// MaxPods bounds the pods tracked (default 1024).
	MaxPods int
	// Workers per statsd (default 2): a hung statsd holds only its own.
	Workers int
	// Settle: a Kata pod's changed container set is bound once it has not
	// changed for this long (default 2s), so that a pod's start or
	// teardown is not a new activation per container.
	Settle time.Duration
	// MinBackoff and MaxBackoff bound the retries of a failed call
	// (defaults 500ms, 1m), doubling from one to the other.
	MinBackoff, MaxBackoff time.Duration
	// PlacementKey keys the placement of pods on the statsd (ShardOrder;
	// statsnri's --placement-key-file): the same on every start. Nil: a
	// random one (tests).
	PlacementKey []byte
	// NamespaceCap bounds the pods of one namespace placed on one statsd
	// (0: no bound): one tenant cannot fill a statsd its neighbours are
	// placed on.
	NamespaceCap int
	// AllowUIDs are the uids a statsd socket's server may run as (default:
	// root and the bridge's own euid).
	AllowUIDs []uint32
	Logger    *slog.Logger
	// Registerer, if set, gets the bridge's metrics.
	Registerer prometheus.Registerer
}

const (
	defaultCallTimeout = 10 * time.Second
	defaultResync      = 5 * time.Minute
	defaultMaxPods     = 1024
	defaultWorkers     = 2
	defaultSettle      = 2 * time.Second
	defaultMinBackoff  = 500 * time.Millisecond
	defaultMaxBackoff  = time.Minute
)

// Bridge keeps statsd's bindings equal to the running pods of the watched
// handlers. Its event methods (RunPodSandbox, ..., Synchronize) never block
// on statsd and never fail; Run does the work.
type Bridge struct {
	opt    Options
	log    *slog.Logger
	notes  *notes
	m      *metrics
	shards []*shard
	key    []byte

	mu   sync.Mutex
	pods map[string]*pod
	// running holds the watched pods the runtime runs, by uid, with their
	// sandbox id: those its last Synchronize listed with a task, then
	// RunPodSandbox adds one and StopPodSandbox and RemovePodSandbox of that
	// sandbox take it out. It is a superset of pods (a running pod may be
	// left out of them: too many, not mappable); a binding checkpointed
	// whose pod is not here was stopped by its runtime (runtime_stopped).
	// At most the watched pods of the node: a Synchronize replaces it.
	running map[string]string
	// seq numbers the containers in the order the bridge learns of them.
	seq       uint64
	connected bool
	synced    bool
	// everSynced: a Synchronize has said which pods run. Until then the
	// bridge knows none, and a listing would checkpoint every binding.
	everSynced bool
	since      time.Time
	reason     string
	// unannounced are the pods (uid -> sandbox id) the bridge knows from a
	// Synchronize only: the runtime may never tell of their end. Containerd
	// relays StopPodSandbox and RemovePodSandbox only for the pods whose
	// RunPodSandbox it relayed since it started; a pod that predates its
	// restart ends unannounced (containerd#8426). While any is tracked,
	// every --resync reconnects to NRI for a fresh Synchronize (refresh).
	unannounced map[string]string
	refresh     chan struct{}
	// refreshing: the next Synchronize is a refresh's, from the same
	// runtime, which still relays the end of the pods it announced.
	refreshing bool
	// placed: where each tracked pod is placed (placement.go); unplaced
	// counts those placed nowhere; nsOn[i] counts the pods of each
	// namespace placed on statsd i.
	placed   map[string]*placement
	unplaced int
	nsOn     []map[string]int
	// census counts the statsd listed (or tried) once since the first
	// Synchronize; heldBack are the pods whose binding waits for all.
	census   int
	heldBack map[string]bool
}

// pod is a running pod of a watched handler: what its binding should be.
type pod struct {
	uid      string
	identity *sandboxstatsv1.WorkloadIdentity
	sandbox  Sandbox
	// containers are the pod's live application containers (created, not
	// stopped nor removed) by id; changed is when that set last changed.
	containers map[string]ctr
	changed    time.Time
}

// ctr is a live container of a pod: its name, and seq, the order the
// bridge learnt of it (the first 25 are passed; a container that comes
// later never pushes out one passed before).
type ctr struct {
	name string
	seq  uint64
}

// containerList is p's containers in the order the bridge learnt of them.
func (p *pod) containerList() []Container {
	ids := slices.SortedFunc(maps.Keys(p.containers), func(a, b string) int {
		if c := cmp.Compare(p.containers[a].seq, p.containers[b].seq); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	out := make([]Container, 0, len(ids))
	for _, id := range ids {
		out = append(out, Container{ID: id, Name: p.containers[id].name})
	}
	return out
}

// New makes a Bridge; Run starts it.
func New(opt Options) (*Bridge, error) {
	if len(opt.Statsd) == 0 {
		return nil, errors.New("nribridge: no statsd to drive")
	}
	if err := opt.Mapping.Validate(); err != nil {
		return nil, fmt.Errorf("nribridge: %w", err)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&opt.CallTimeout, defaultCallTimeout)
	def(&opt.Resync, defaultResync)
	def(&opt.Settle, defaultSettle)
	def(&opt.MinBackoff, defaultMinBackoff)
	def(&opt.MaxBackoff, defaultMaxBackoff)
	if opt.MaxPods <= 0 {
		opt.MaxPods = defaultMaxPods
	}
	if opt.Workers <= 0 {
		opt.Workers = defaultWorkers
	}
	if opt.AllowUIDs == nil {
		opt.AllowUIDs = []uint32{0, uint32(os.Geteuid())}
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	b := &Bridge{
		opt:         opt,
		log:         opt.Logger,
		pods:        map[string]*pod{},
		running:     map[string]string{},
		reason:      "not connected to NRI yet",
		unannounced: map[string]string{},
		refresh:     make(chan struct{}, 1),
	}
	b.key = opt.PlacementKey
	if b.key == nil {
		b.key = make([]byte, PlacementKeySize)
		_, _ = rand.Read(b.key)
	}
	b.placed, b.heldBack = map[string]*placement{}, map[string]bool{}
	b.m = newMetrics(b)
	b.notes = newNotes(opt.Logger, b.m.logDropped)
	for i, sd := range opt.Statsd {
		s, err := newShard(b, i, sd)
		if err != nil {
			b.closeShards()
			return nil, err
		}
		b.shards = append(b.shards, s)
		b.nsOn = append(b.nsOn, map[string]int{})
	}
	if opt.Registerer != nil {
		if err := b.m.register(opt.Registerer); err != nil {
			b.closeShards()
			return nil, fmt.Errorf("nribridge: metrics: %w", err)
		}
	}
	return b, nil
}

func (b *Bridge) closeShards() {
	for _, s := range b.shards {
		s.close()
	}
}

// Run runs the workers, the listings and the log until ctx ends, then
// closes the connections to statsd.
func (b *Bridge) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { b.notes.run(ctx) })
	for _, s := range b.shards {
		for range b.opt.Workers {
			wg.Go(func() { s.work(ctx) })
		}
		wg.Go(func() { s.lister(ctx) })
	}
	if b.opt.Resync > 0 {
		wg.Go(func() {
			t := time.NewTicker(b.opt.Resync)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					for _, s := range b.shards {
						s.requestList()
					}
					b.requestRefresh()
				}
			}
		})
	}
	<-ctx.Done()
	wg.Wait()
	b.mu.Lock()
	for _, s := range b.shards {
		s.stopTimers()
	}
	b.mu.Unlock()
	b.closeShards()
	return nil
}

// requestRefresh asks the NRI connection for a fresh Synchronize
// (Connect reconnects) when pods known from a Synchronize only are
// tracked: their end may never be relayed.
func (b *Bridge) requestRefresh() {
	b.mu.Lock()
	n := len(b.unannounced)
	b.mu.Unlock()
	if n == 0 {
		return
	}
	select {
	case b.refresh <- struct{}{}:
	default:
	}
}

// touch makes every statsd concerned look at uid again (where it is
// placed or was, any that holds it or is binding it), forgetting its
// backoff: its desired state changed. b.mu is held.
func (b *Bridge) touch(uid string) {
	was := -1
	if pl := b.placed[uid]; pl != nil {
		was = pl.shard
	}
	home := b.placeOf(uid)
	for i, s := range b.shards {
		if _, held := s.known[uid]; held || i == home || i == was || s.busy[uid] {
			s.resetRetry(uid)
			s.enqueue(uid)
		}
	}
	b.replaceUnplaced()
}

// SetConnected records the NRI connection's state (reason: why not).
func (b *Bridge) SetConnected(connected bool, reason string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if connected != b.connected {
		b.since = time.Now()
	}
	b.connected, b.reason = connected, reason
	if !connected {
		b.synced = false
	} else {
		b.m.connections.Inc()
	}
}

// Health says whether the bridge is connected to NRI and synchronized, and
// why not.
func (b *Bridge) Health() (ok bool, detail string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.connected && b.synced:
		return true, fmt.Sprintf("connected to NRI and synchronized since %s; %d pods tracked", b.since.UTC().Format(time.RFC3339), len(b.pods))
	case b.connected:
		return false, "connected to NRI, not synchronized yet"
	default:
		return false, "not connected to NRI: " + b.reason
	}
}

// request builds the RunWorkloadRequest of a pod (reading Kata's layout
// for a Kata pod); left is how many of its containers it leaves out (over
// 25, or an id statsd would refuse).
func (b *Bridge) request(p *pod) (req *sandboxstatsv1.RunWorkloadRequest, left int, err error) {
	var kata Kata
	containers := p.containerList()
	if p.sandbox.Kind == KindKata {
		if kata, err = b.opt.Kata.Resolve(p.sandbox.ID); err != nil {
			return nil, 0, err
		}
	}
	if _, left, err = ContainerRefs(p.sandbox, containers); err != nil {
		return nil, 0, err
	}
	ref, err := RefOf(p.sandbox, containers, kata)
	if err != nil {
		return nil, 0, err
	}
	return &sandboxstatsv1.RunWorkloadRequest{Identity: p.identity, Sandbox: ref}, left, nil
}

// backoff is the delay before attempt n (from 1), jittered by ±20%.
func (b *Bridge) backoff(n int) time.Duration {
	d := b.opt.MinBackoff
	for i := 1; i < n && d < b.opt.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, b.opt.MaxBackoff)
	return time.Duration(float64(d) * (0.8 + 0.4*mrand.Float64()))
}
