package drift

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/identity"
)

// comparison is one thing the check compares; each Kind belongs to one. When
// a comparison cannot run, its findings are kept as they are.
type comparison string

const (
	cmpCgroup          comparison = "sandbox cgroup"
	cmpSentry          comparison = "sentry process"
	cmpAgentAnswer     comparison = "agent answer"
	cmpAgentContainers comparison = "agent containers"
	cmpVMM             comparison = "vmm process"
	cmpStray           comparison = "stray vmm"
)

func comparisonOf(k Kind) comparison {
	switch k {
	case KindCgroupGone, KindSandboxDead, KindOOMKilled:
		return cmpCgroup
	case KindSentryGone, KindSentryMoved:
		return cmpSentry
	case KindAgentSilent:
		return cmpAgentAnswer
	case KindContainerUnknown:
		return cmpAgentContainers
	case KindVMMGone:
		return cmpVMM
	case KindStrayVMM:
		return cmpStray
	default:
		return ""
	}
}

// Finding is one open disagreement.
type Finding struct {
	Kind      Kind      `json:"kind"`
	Subject   string    `json:"subject"`
	ActorUID  string    `json:"actor_uid"`
	Detail    string    `json:"detail,omitempty"`
	FirstSeen time.Time `json:"first_seen"`
	// Epoch is the activation it was found in; a new Run/Restore drops it.
	Epoch int64 `json:"epoch_unix_nano"`
}

func (f Finding) key() string { return f.ActorUID + "\x00" + f.Kind.String() + "\x00" + f.Subject }

// Event is one change to the open findings.
type Event struct {
	At      time.Time `json:"at"`
	Type    EventType `json:"type"`
	Finding Finding   `json:"finding"`
	Message string    `json:"message"`
}

// Observation is what one look at the sandbox found.
type Observation struct {
	// Ran lists the comparisons that could be made: their findings are
	// authoritative (an open finding missing from Findings is cleared).
	Ran map[comparison]bool
	// Skipped lists the comparisons that could not be made, with why.
	Skipped map[comparison]string
	// Findings are the disagreements seen by the comparisons that ran.
	Findings []Finding
}

func newObservation() Observation {
	return Observation{Ran: map[comparison]bool{}, Skipped: map[comparison]string{}}
}

func (o *Observation) ran(c comparison) { o.Ran[c] = true }

func (o *Observation) skip(c comparison, why string) {
	delete(o.Ran, c)
	o.Skipped[c] = why
}

func (o *Observation) find(c comparison, k Kind, subject, detail string) {
	o.Ran[c] = true
	o.Findings = append(o.Findings, Finding{Kind: k, Subject: subject, Detail: detail})
}

// Observer looks at the sandbox a binding names. It must only read.
type Observer interface {
	Observe(ctx context.Context, b *identity.Binding) Observation
}

// pruner is an Observer that remembers something per actor's epoch: each
// cycle tells it the bound actors and their epochs, so it forgets the rest.
type pruner interface {
	Prune(bound map[string]int64)
}

// Config configures a Checker.
type Config struct {
	Store    *identity.Store
	Observer Observer
	// Interval between cycles; 0 turns the check off (Run returns at once
	// and nothing is ever read).
	Interval time.Duration
	// Grace after a Run/Restore during which the workload is not checked.
	Grace time.Duration
	// StateDir holds drift.json beside the identity; empty keeps findings in
	// memory only.
	StateDir string
	Now      func() time.Time
	Logger   *slog.Logger
	// MaxEvents bounds the recent events kept (default 100).
	MaxEvents int
}

// Bounds of what the check keeps: a detail or a skipped reason may carry a
// guest's or a file's words (each source cuts them; this is the backstop),
// and a comparison may see many subjects (STRAY_VMM: any local user can
// start processes claiming a guest name).
const (
	maxDetailBytes  = 512
	maxSubjectBytes = 256
	// maxOpenFindings bounds one workload's open findings, and
	// maxOpenFindingsTotal all of them (what a node agent takes from one
	// ListDriftFindings answer, sweep.DefaultLimits.MaxFindings): with
	// several workloads bound each gets an equal share of the total, at
	// least minOpenFindings.
	maxOpenFindings      = 64
	maxOpenFindingsTotal = 256
	minOpenFindings      = 4
)

// openCap is each workload's cap on open findings with n bound.
func openCap(n int) int {
	return min(maxOpenFindings, max(minOpenFindings, maxOpenFindingsTotal/max(n, 1)))
}

// Status describes the last cycle.
type Status struct {
	Enabled   bool
	LastCycle time.Time
	Outcome   string
	Skipped   []string
}

// Checker runs the periodic drift check.
type Checker struct {
	cfg Config

	cycle   sync.Mutex // one cycle at a time
	mu      sync.Mutex // guards the fields below; never held across a read
	open    map[string]Finding
	events  []Event
	status  Status
	persist bool // something changed since the last save
	// lastSkipped is each bound workload's skipped comparisons in its last
	// check.
	lastSkipped map[string][]string
}

// New returns a Checker with the findings persisted under cfg.StateDir. A
// state file that cannot be read is moved aside and logged.
func New(cfg Config) (*Checker, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxEvents <= 0 {
		cfg.MaxEvents = 100
	}
	c := &Checker{cfg: cfg, open: map[string]Finding{}, lastSkipped: map[string][]string{}, status: Status{Enabled: cfg.Interval > 0}}
	if cfg.StateDir == "" {
		return c, nil
	}
	if err := c.load(); err != nil {
		return nil, err
	}
	return c, nil
}

// Run runs a cycle every Interval until ctx is done. With Interval 0 it
// returns at once.
func (c *Checker) Run(ctx context.Context) {
	if c.cfg.Interval <= 0 {
		return
	}
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Cycle(ctx)
		}
	}
}

// Cycle runs one check now, of every bound workload in turn. The
// observations run without the lock that OpenCount takes, so a poll never
// waits for a slow read of the check.
func (c *Checker) Cycle(ctx context.Context) {
	c.cycle.Lock()
	defer c.cycle.Unlock()
	now := c.cfg.Now()
	todo, outcomes := c.prepare(now)
	// While the observations run, the status of the previous cycle stands.
	if len(todo) == 0 && len(outcomes) == 0 {
		return
	}
	for _, b := range todo {
		obs := c.cfg.Observer.Observe(ctx, b)
		// Stamped when this binding was seen, after its read, not when the
		// cycle began: a finding's FirstSeen says when statsd knew (an
		// orderly stop that comes after the cycle began but before the
		// read reached its binding is not "seen dead first").
		outcomes[b.Identity.ActorUID] = c.apply(c.cfg.Now(), b, obs)
	}
	c.finish(now, outcomes)
}

// prepare drops findings of workloads no longer bound (or bound anew) and
// returns the bindings to check, and the outcome of each one this cycle
// skips. With nothing bound it sets the status itself and returns neither.
func (c *Checker) prepare(now time.Time) ([]*identity.Binding, map[string]checkOutcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.save()
	bindings := c.cfg.Store.Bindings()
	epochOf := make(map[string]int64, len(bindings))
	for _, b := range bindings {
		epochOf[b.Identity.ActorUID] = b.EpochUnixNano
	}
	for k, f := range c.open {
		epoch, bound := epochOf[f.ActorUID]
		switch {
		case !bound:
			delete(c.open, k)
			c.event(now, EventDropped, f, "workload %q is no longer bound; finding dropped", f.ActorUID)
		case f.Epoch != epoch:
			delete(c.open, k)
			c.event(now, EventDropped, f, "a new Run/Restore of %q began; finding dropped", f.ActorUID)
		}
	}
	if p, ok := c.cfg.Observer.(pruner); ok {
		p.Prune(epochOf)
	}
	for a := range c.lastSkipped {
		if _, bound := epochOf[a]; !bound {
			delete(c.lastSkipped, a)
		}
	}
	if len(bindings) == 0 {
		c.status = Status{Enabled: c.cfg.Interval > 0, LastCycle: now, Outcome: "skipped: no workload"}
		return nil, nil
	}
	var todo []*identity.Binding
	outcomes := map[string]checkOutcome{}
	for _, b := range bindings {
		switch age := now.Sub(time.Unix(0, b.EpochUnixNano)); {
		case c.cfg.Store.InLifecycle(b.Identity.ActorUID):
			outcomes[b.Identity.ActorUID] = checkOutcome{outcome: "skipped: lifecycle call in progress"}
		case age < c.cfg.Grace:
			outcomes[b.Identity.ActorUID] = checkOutcome{outcome: fmt.Sprintf("skipped: within grace (%s of %s)", age.Round(time.Second), c.cfg.Grace)}
		default:
			todo = append(todo, b)
		}
	}
	return todo, outcomes
}

// apply turns an observation of b into events: new findings open, findings
// of comparisons that ran and no longer see them clear, findings of skipped
// comparisons stay as they are. It returns the outcome for b.
func (c *Checker) apply(now time.Time, b *identity.Binding, obs Observation) checkOutcome {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.save()
	actor := b.Identity.ActorUID
	if !c.cfg.Store.IsBound(b) {
		return checkOutcome{outcome: "skipped: the binding changed during the cycle"}
	}
	seen := map[string]Finding{}
	for _, f := range obs.Findings {
		f.ActorUID, f.Epoch = actor, b.EpochUnixNano
		f.Subject, f.Detail = foreign.Bound(f.Subject, maxSubjectBytes), foreign.Bound(f.Detail, maxDetailBytes)
		seen[f.key()] = f
	}
	open := 0
	for k, f := range c.open {
		if f.ActorUID != actor {
			continue
		}
		if _, still := seen[k]; !still && obs.Ran[comparisonOf(f.Kind)] {
			delete(c.open, k)
			c.event(now, EventCleared, f, "%s %s matches again", f.Kind, f.Subject)
			continue
		}
		open++
	}
	var overCap int
	limit := openCap(len(c.cfg.Store.Bindings()))
	for _, k := range slices.Sorted(maps.Keys(seen)) {
		f := seen[k]
		if _, already := c.open[k]; already {
			continue
		}
		// The cap is each workload's own: a hostile one fills only its
		// part.
		if open >= limit {
			overCap++
			continue
		}
		f.FirstSeen = now
		c.open[k] = f
		open++
		c.event(now, EventOpened, f, "%s %s: %s", f.Kind, f.Subject, f.Detail)
	}
	outcome := "checked"
	if overCap > 0 {
		outcome = fmt.Sprintf("checked; %d more findings not recorded (at most %d are open per workload)", overCap, limit)
	}
	var skipped []string
	for cmp, why := range obs.Skipped {
		skipped = append(skipped, fmt.Sprintf("%s: %s", cmp, foreign.Bound(why, maxDetailBytes)))
	}
	sort.Strings(skipped)
	// Say so when the set of skipped comparisons changes, not every cycle.
	if !slices.Equal(skipped, c.lastSkipped[actor]) && len(skipped) > 0 {
		c.cfg.Logger.Info("drift: comparisons skipped, their findings kept", "actor_uid", actor, "skipped", skipped)
	}
	c.lastSkipped[actor] = skipped
	return checkOutcome{outcome: outcome, skipped: skipped}
}

// checkOutcome is what one cycle did for one workload.
type checkOutcome struct {
	outcome string
	skipped []string // the comparisons that could not be made, with why
}

// finish sets the status of a cycle from each workload's outcome: with one
// workload its outcome and skipped comparisons as they are; with several,
// each prefixed by its actor.
func (c *Checker) finish(now time.Time, outcomes map[string]checkOutcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.status = Status{Enabled: c.cfg.Interval > 0, LastCycle: now}
	actors := slices.Sorted(maps.Keys(outcomes))
	if len(actors) == 1 {
		c.status.Outcome, c.status.Skipped = outcomes[actors[0]].outcome, outcomes[actors[0]].skipped
		return
	}
	var parts []string
	for _, a := range actors {
		parts = append(parts, fmt.Sprintf("%s: %s", a, outcomes[a].outcome))
		for _, sk := range outcomes[a].skipped {
			c.status.Skipped = append(c.status.Skipped, fmt.Sprintf("%s: %s", a, sk))
		}
	}
	c.status.Outcome = strings.Join(parts, "; ")
}

// event records and logs one change: WARN for a new finding, INFO otherwise.
func (c *Checker) event(now time.Time, t EventType, f Finding, format string, args ...any) {
	e := Event{At: now, Type: t, Finding: f, Message: foreign.Bound(fmt.Sprintf(format, args...), 2*maxDetailBytes)}
	c.events = append(c.events, e)
	if over := len(c.events) - c.cfg.MaxEvents; over > 0 {
		c.events = slices.Delete(c.events, 0, over)
	}
	c.persist = true
	attrs := []any{"kind", f.Kind, "subject", f.Subject, "actor_uid", f.ActorUID}
	if t == EventOpened {
		c.cfg.Logger.Warn("drift: "+e.Message, attrs...)
	} else {
		c.cfg.Logger.Info("drift: "+e.Message, attrs...)
	}
}

func (c *Checker) sortedLocked() []Finding {
	out := make([]Finding, 0, len(c.open))
	for _, f := range c.open {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key() < out[j].key() })
	return out
}

// Open returns the open findings, sorted.
func (c *Checker) Open() []Finding {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sortedLocked()
}

// Events returns the recent events, oldest first.
func (c *Checker) Events() []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// Status returns what the last cycle did.
func (c *Checker) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

// SeenDead returns the earliest open finding of actorUID's activation
// (epoch) that says its sandbox is dead (Kind.Dead), first seen at or
// before the time given, if any: whether statsd had seen the sandbox dead
// by then. Like OpenCount it only takes the bookkeeping lock, never waits
// for a cycle's reads.
func (c *Checker) SeenDead(actorUID string, epoch int64, by time.Time) (Finding, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var (
		first Finding
		found bool
	)
	for _, f := range c.open {
		if f.ActorUID != actorUID || f.Epoch != epoch || !f.Kind.Dead() || f.FirstSeen.After(by) {
			continue
		}
		if !found || f.FirstSeen.Before(first.FirstSeen) || (f.FirstSeen.Equal(first.FirstSeen) && f.key() < first.key()) {
			first, found = f, true
		}
	}
	return first, found
}

// OpenCount returns how many findings are open for actorUID. It never
// waits for a cycle in progress longer than the cycle's bookkeeping.
func (c *Checker) OpenCount(actorUID string) uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n uint32
	for _, f := range c.open {
		if f.ActorUID == actorUID {
			n++
		}
	}
	return n
}
