package server

// This file keeps the EpochBaseline message of each baseline answered, made
// once: a baseline never changes once taken (identity.Activation), and a
// micro-VM sample carries its first read, a whole sample, in every answer
// (about 1 KB and a conversion a read). Answers share the message and only
// read it: capSampleTo clones it before a cut.

import (
	"sync"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// maxCachedBaselines bounds the cache; past it, it starts over. A statsd
// answers for a few dozen bindings at most (32 in the NRI layout), each
// with one baseline at a time.
const maxCachedBaselines = 64

// baselineKey is what baselineToProto's message depends on.
type baselineKey struct {
	b     *identity.Baseline
	id    identity.Identity
	class source.Class
	epoch int64
}

type baselineCache struct {
	mu sync.Mutex
	m  map[baselineKey]*sandboxstatsv1.EpochBaseline
}

// of is baselineToProto(b, id, class, epoch), made once per baseline and
// shared: no caller may change it.
func (c *baselineCache) of(b *identity.Baseline, id identity.Identity, class source.Class, epoch int64) *sandboxstatsv1.EpochBaseline {
	if b == nil {
		return nil
	}
	k := baselineKey{b: b, id: id, class: class, epoch: epoch}
	c.mu.Lock()
	defer c.mu.Unlock()
	if m, ok := c.m[k]; ok {
		return m
	}
	if c.m == nil || len(c.m) >= maxCachedBaselines {
		c.m = make(map[baselineKey]*sandboxstatsv1.EpochBaseline)
	}
	m := baselineToProto(b, id, class, epoch)
	c.m[k] = m
	return m
}
