package nribridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/api"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// shard is one statsd: what it holds as far as the bridge knows, the queue
// of pods to look at, their backoff, and the workers and lister that serve
// them. Its maps are guarded by the Bridge's mu.
type shard struct {
	b     *Bridge
	idx   int
	label string
	cfg   Statsd
	conns []*grpc.ClientConn
	lc    sandboxstatsv1.WorkloadLifecycleServiceClient
	st    sandboxstatsv1.WorkloadStatsServiceClient

	// known: the actors this statsd holds as far as the bridge knows, with
	// the request that bound them (nil: bound by someone or something the
	// bridge does not remember, as a listing found it).
	known map[string]*sandboxstatsv1.RunWorkloadRequest
	// While a listing is in flight, gen counts the calls that changed
	// known and changed says when (in gen) each uid was last bound or
	// checkpointed by one, so that the listing, taken before, does not
	// undo it; both are reset when it is applied.
	listing bool
	gen     uint64
	changed map[string]uint64
	queue   []string
	queued  map[string]bool
	busy    map[string]bool
	dirty   map[string]bool
	retry   map[string]*retry
	wake    chan struct{}
	listC   chan struct{}
	// listedOnce: listed (or tried) since the first Synchronize.
	listedOnce bool
	// warnedOld: logged that it does not implement UpdateWorkloadContainers.
	warnedOld bool
}

type retry struct {
	attempts int
	timer    *time.Timer
}

func newShard(b *Bridge, idx int, cfg Statsd) (*shard, error) {
	s := &shard{
		b: b, idx: idx, cfg: cfg, label: cfg.Lifecycle,
		known: map[string]*sandboxstatsv1.RunWorkloadRequest{}, changed: map[string]uint64{}, queued: map[string]bool{}, busy: map[string]bool{},
		dirty: map[string]bool{}, retry: map[string]*retry{},
		wake: make(chan struct{}, 1), listC: make(chan struct{}, 1),
	}
	for _, path := range []string{cfg.Lifecycle, cfg.Stats} {
		cc, err := dial(path, b.opt.AllowUIDs)
		if err != nil {
			s.close()
			return nil, err
		}
		s.conns = append(s.conns, cc)
	}
	s.lc = sandboxstatsv1.NewWorkloadLifecycleServiceClient(s.conns[0])
	s.st = sandboxstatsv1.NewWorkloadStatsServiceClient(s.conns[1])
	return s, nil
}

func (s *shard) close() {
	for _, cc := range s.conns {
		cc.Close()
	}
}

// enqueue queues uid once; a uid being worked on is looked at again after.
// b.mu is held.
func (s *shard) enqueue(uid string) {
	switch {
	case s.busy[uid]:
		s.dirty[uid] = true
	case !s.queued[uid]:
		s.queued[uid] = true
		s.queue = append(s.queue, uid)
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// resetRetry forgets uid's backoff. b.mu is held.
func (s *shard) resetRetry(uid string) {
	if r := s.retry[uid]; r != nil {
		if r.timer != nil {
			r.timer.Stop()
		}
		delete(s.retry, uid)
	}
}

// later looks at uid again after d (its backoff, or a Kata pod's settling
// time). b.mu is held.
func (s *shard) later(uid string, d time.Duration, attempt bool) {
	r := s.retry[uid]
	if r == nil {
		r = &retry{}
		s.retry[uid] = r
	}
	if attempt {
		r.attempts++
		d = s.b.backoff(r.attempts)
	}
	if r.timer != nil {
		r.timer.Stop()
	}
	r.timer = time.AfterFunc(d, func() {
		s.b.mu.Lock()
		defer s.b.mu.Unlock()
		if s.retry[uid] == r {
			r.timer = nil
			s.enqueue(uid)
		}
	})
}

func (s *shard) stopTimers() {
	for uid := range s.retry {
		s.resetRetry(uid)
	}
}

// next takes the next uid to work on, waiting for one.
func (s *shard) next(ctx context.Context) (string, bool) {
	for {
		s.b.mu.Lock()
		if len(s.queue) > 0 {
			uid := s.queue[0]
			s.queue = s.queue[1:]
			delete(s.queued, uid)
			s.busy[uid] = true
			more := len(s.queue) > 0
			s.b.mu.Unlock()
			if more {
				select {
				case s.wake <- struct{}{}:
				default:
				}
			}
			return uid, true
		}
		s.b.mu.Unlock()
		select {
		case <-ctx.Done():
			return "", false
		case <-s.wake:
		}
	}
}

func (s *shard) work(ctx context.Context) {
	for {
		uid, ok := s.next(ctx)
		if !ok {
			return
		}
		s.process(ctx, uid)
		s.b.mu.Lock()
		delete(s.busy, uid)
		if s.dirty[uid] {
			delete(s.dirty, uid)
			s.enqueue(uid)
		}
		s.b.mu.Unlock()
	}
}

// process makes this statsd's binding of uid what it should be: bound with
// the pod's request when the pod runs and is placed here, else not bound.
func (s *shard) process(ctx context.Context, uid string) {
	b := s.b
	b.mu.Lock()
	p := b.pods[uid]
	if p != nil && b.holdBack(uid) {
		b.mu.Unlock()
		return
	}
	if p != nil && b.placeOf(uid) != s.idx {
		p = nil
	}
	_, runs := b.running[uid]
	have, held := s.known[uid]
	b.mu.Unlock()

	if p == nil {
		if held {
			s.checkpoint(ctx, uid, !runs)
		} else {
			b.mu.Lock()
			s.resetRetry(uid)
			b.mu.Unlock()
		}
		return
	}
	if p.sandbox.Kind == KindKata && held && !p.changed.IsZero() {
		if wait := b.opt.Settle - time.Since(p.changed); wait > 0 {
			b.mu.Lock()
			s.later(uid, wait, false)
			b.mu.Unlock()
			return
		}
	}
	req, left, err := b.request(p)
	if err != nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		if errors.Is(err, ErrKataNotYet) {
			b.m.unactionable.WithLabelValues("kata-not-yet").Inc()
			b.notes.add(slog.LevelInfo, "nri: kata sandbox not laid out yet, trying again", "kata-not-yet:"+s.label, "uid", uid, "err", err)
			s.later(uid, 0, true)
			return
		}
		// The pod cannot be bound as it is: not before it changes (an event)
		// or the next listing.
		b.unactionable(err, "uid", uid, "sandbox", p.sandbox.ID)
		s.resetRetry(uid)
		return
	}
	if left > 0 {
		// Counted at every sync that leaves some out, before the check
		// below: a container learnt past the cap changes nothing sent.
		b.m.unactionable.WithLabelValues("containers-left-out").Add(float64(left))
	}
	if held && have != nil && proto.Equal(have, req) {
		b.mu.Lock()
		s.resetRetry(uid)
		b.mu.Unlock()
		return
	}
	if held && (have == nil || sameSandbox(have, req)) && !s.updateContainers(ctx, uid, req, have != nil) {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, b.opt.CallTimeout)
	resp, err := s.lc.RunWorkload(cctx, req)
	cancel()
	if ctx.Err() != nil {
		return
	}
	b.m.call(s.label, "run", err)
	b.mu.Lock()
	if err != nil {
		if _, ok := s.known[uid]; !ok && mayHaveRun(err) {
			// statsd may still bind it (a call that timed out on our side
			// is run when statsd reads it): held, as far as we know, so a
			// later stop checkpoints it (NO_WORKLOAD if it never ran).
			s.known[uid] = nil
		}
		_, nowHeld := s.known[uid]
		if api.ReasonOf(err) == api.Reason(sandboxstatsv1.ErrorReason_ERROR_REASON_TOO_MANY_WORKLOADS) && !nowHeld && b.spill(uid, s.idx) {
			// Full: the pod goes to the next statsd of its order.
			b.mu.Unlock()
			return
		}
		s.failed(uid, "run", err)
		b.mu.Unlock()
		return
	}
	s.known[uid] = req
	s.noteChange(uid)
	s.resetRetry(uid)
	b.mu.Unlock()
	// Logged without b.mu: a log write that blocks (a stderr nobody
	// drains) must not hold up the NRI handlers, which take it.
	attrs := []any{"uid", uid, "namespace", req.GetIdentity().GetActorNamespace(), "name", req.GetIdentity().GetActorName(),
		"sandbox", p.sandbox.ID, "kind", p.sandbox.Kind.String(), "statsd", s.label, "epoch_unix_nano", resp.GetEpochUnixNano()}
	if r := resp.GetReplaced(); r != nil {
		attrs = append(attrs, "replaced_epoch_unix_nano", r.GetEpochUnixNano())
	}
	if !held || have == nil || !proto.Equal(have, req) {
		b.log.Info("bound pod", attrs...)
	}
}

// checkpoint ends uid's activation on this statsd. stopped: the runtime
// stopped the pod (a StopPodSandbox or RemovePodSandbox, or a Synchronize
// that no longer lists it running), so its sandbox found dead is its
// expected end; not when the pod runs on (placed on another statsd, or
// left out of the pods tracked).
func (s *shard) checkpoint(ctx context.Context, uid string, stopped bool) {
	b := s.b
	cctx, cancel := context.WithTimeout(ctx, b.opt.CallTimeout)
	resp, err := s.lc.CheckpointWorkload(cctx, &sandboxstatsv1.CheckpointWorkloadRequest{ActorUid: uid, RuntimeStopped: stopped})
	cancel()
	if ctx.Err() != nil {
		return
	}
	b.m.call(s.label, "checkpoint", err)
	r := api.ReasonOf(err)
	notBound := r == api.Reason(sandboxstatsv1.ErrorReason_ERROR_REASON_ACTOR_MISMATCH) || r == api.Reason(sandboxstatsv1.ErrorReason_ERROR_REASON_NO_WORKLOAD)
	b.mu.Lock()
	if err != nil && !notBound {
		s.failed(uid, "checkpoint", err)
		b.mu.Unlock()
		return
	}
	delete(s.known, uid)
	s.noteChange(uid)
	s.resetRetry(uid)
	b.mu.Unlock()
	// Logged without b.mu (see process).
	if notBound { // not bound there (any more): nothing to end
		b.log.Debug("pod was not bound", "uid", uid, "statsd", s.label, "reason", r)
		return
	}
	e := resp.GetEnded()
	b.log.Info("checkpointed pod", "uid", uid, "namespace", e.GetIdentity().GetActorNamespace(), "name", e.GetIdentity().GetActorName(),
		"statsd", s.label, "outcome", api.OutcomeName(e.GetOutcome()), "epoch_unix_nano", e.GetEpochUnixNano(), "end_unix_nano", e.GetEndUnixNano(),
		"final", api.ProvenanceName(e.GetFinalProvenance()), "runtime_stopped", stopped)
}

// noteChange records a call's change of uid for the listing in flight.
// b.mu is held.
func (s *shard) noteChange(uid string) {
	if s.listing {
		s.gen++
		s.changed[uid] = s.gen
	}
}

// failed schedules a retry of uid after a failed call, or parks it when
// statsd refused the request as invalid (until the pod changes or the next
// listing). b.mu is held.
func (s *shard) failed(uid, call string, err error) {
	reason := api.ReasonOf(err)
	if reason == "" {
		reason = status.Code(err).String()
	}
	if reason == api.Reason(sandboxstatsv1.ErrorReason_ERROR_REASON_INVALID_REQUEST) {
		s.b.m.unactionable.WithLabelValues("statsd-refused").Inc()
		s.b.notes.add(slog.LevelWarn, "nri: statsd refused a pod's binding", "statsd-refused:"+s.label, "uid", uid, "statsd", s.label, "err", err)
		s.resetRetry(uid)
		return
	}
	s.later(uid, 0, true)
	s.b.notes.add(slog.LevelWarn, "nri: statsd call failed, retrying", call+":"+reason+":"+s.label,
		"call", call, "uid", uid, "statsd", s.label, "reason", reason, "attempt", s.retry[uid].attempts, "err", err)
}

// mayHaveRun reports whether a failed call may still have reached statsd
// and taken effect: it timed out or was cut, or its outcome is unknown.
func mayHaveRun(err error) bool {
	switch status.Code(err) {
	case codes.DeadlineExceeded, codes.Canceled, codes.Unavailable, codes.Unknown:
		return true
	}
	return false
}

// requestList asks the lister for a listing (coalesced).
func (s *shard) requestList() {
	select {
	case s.listC <- struct{}{}:
	default:
	}
}

// lister lists what this statsd holds when asked (after each Synchronize,
// every Resync), retrying a failed listing with backoff.
func (s *shard) lister(ctx context.Context) {
	attempts := 0
	var retryC <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.listC:
		case <-retryC:
		}
		retryC = nil
		if err := s.list(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			attempts++
			s.b.notes.add(slog.LevelWarn, "nri: listing a statsd failed, retrying", "list:"+s.label, "statsd", s.label, "attempt", attempts, "err", err)
			retryC = time.After(s.b.backoff(attempts))
			continue
		}
		attempts = 0
	}
}

// list reads the actors this statsd holds and queues every difference
// from what it should hold. Before the first Synchronize it does nothing:
// which pods run is not known yet (a resync while NRI is not there), and
// every binding would look like a pod gone.
func (s *shard) list(ctx context.Context) error {
	b := s.b
	b.mu.Lock()
	if !b.everSynced {
		b.mu.Unlock()
		b.log.Debug("not listing statsd before the first Synchronize", "statsd", s.label)
		return nil
	}
	s.listing = true
	began := s.gen
	b.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, b.opt.CallTimeout)
	resp, err := s.st.StatsActiveWorkloads(cctx, &sandboxstatsv1.StatsActiveWorkloadsRequest{})
	cancel()
	b.m.call(s.label, "list", err)
	if err != nil {
		b.mu.Lock()
		s.listing = false
		clear(s.changed)
		s.censused() // a statsd down or hung holds the others back no longer
		b.mu.Unlock()
		return fmt.Errorf("list %s: %w", s.cfg.Stats, err)
	}
	held := map[string]bool{}
	for _, smp := range resp.GetSamples() {
		held[smp.GetActorUid()] = true
	}
	for _, p := range resp.GetPending() {
		held[p.GetIdentity().GetActorUid()] = true
	}
	b.mu.Lock()
	// A uid bound or checkpointed by a call since the listing began is as
	// that call left it; every other difference is looked at again.
	stale := func(uid string) bool { return s.changed[uid] <= began }
	for uid := range held {
		if _, ok := s.known[uid]; !ok && stale(uid) {
			s.known[uid] = nil
			// A pod placed elsewhere and not bound there yet stays where
			// it is bound (once every statsd was listed: censused).
			if pl := b.placed[uid]; pl != nil && b.census >= len(b.shards) && pl.shard != s.idx {
				if _, there := b.shards[max(pl.shard, 0)].known[uid]; pl.shard < 0 || !there {
					b.assign(pl, s.idx)
				}
			}
			s.enqueue(uid)
		}
	}
	for uid := range s.known {
		if !held[uid] && stale(uid) {
			delete(s.known, uid)
			s.enqueue(uid)
		}
	}
	for uid := range b.pods {
		if pl := b.placed[uid]; pl != nil && pl.shard == s.idx && !held[uid] && stale(uid) {
			s.enqueue(uid)
		}
	}
	s.listing = false
	clear(s.changed)
	s.censused()
	b.mu.Unlock()
	b.log.Debug("listed statsd", "statsd", s.label, "held", len(held))
	return nil
}
