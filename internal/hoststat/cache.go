package hoststat

// This file is the host view cache: one sample served to every caller for
// Config.MinInterval, so that readers do not set the rate of samples.

import (
	"context"
	"sync"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// cachedSampler serves the last sample until it is MinInterval old; a
// miss takes one sample, shared by every caller that misses meanwhile.
type cachedSampler struct {
	s        *sampler
	interval time.Duration
	g        *bounded.Group // the one sample in flight
	now      func() time.Time

	mu   sync.Mutex
	last *source.HostStats // immutable once published
	at   time.Time
}

var _ source.HostSampler = (*cachedSampler)(nil)

func (c *cachedSampler) SampleHost(ctx context.Context) (*source.HostStats, error) {
	if v := c.fresh(); v != nil {
		return v, nil
	}
	return bounded.Do(ctx, c.g, "host-sample", func() (*source.HostStats, error) {
		if v := c.fresh(); v != nil { // taken while this call waited to start
			return v, nil
		}
		// The sample's own views are each bounded by ReadTimeout; the
		// caller's deadline bounds only its wait (bounded.Do).
		hs, err := c.s.SampleHost(context.Background())
		if err == nil {
			c.mu.Lock()
			c.last, c.at = hs, c.now()
			c.mu.Unlock()
		}
		return hs, err
	})
}

// fresh is the cached sample if it is younger than the interval.
func (c *cachedSampler) fresh() *source.HostStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last != nil && c.now().Sub(c.at) < c.interval {
		return c.last
	}
	return nil
}

func (c *cachedSampler) Close() error { return c.s.Close() }
