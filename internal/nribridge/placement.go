package nribridge

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/atomicfile"
)

// PlacementKeySize is the size of the per-node placement key.
const PlacementKeySize = 32

// LoadPlacementKey reads the placement key at path, making it (random
// bytes, mode 0600, its directory 0700) if absent. A key file that is not
// a regular file, is readable or writable by group or others, is not owned
// by root or the bridge's euid, or is not PlacementKeySize bytes is
// refused: whoever reads it can craft pod uids to one statsd.
func LoadPlacementKey(path string) ([]byte, error) {
	key, err := readPlacementKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	dir, name := filepath.Split(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("nribridge: placement key %s: %w", path, err)
	}
	key = make([]byte, PlacementKeySize)
	if _, err := io.ReadFull(rand.Reader, key); err != nil {
		return nil, fmt.Errorf("nribridge: placement key %s: %w", path, err)
	}
	if err := atomicfile.Write(dir, name, key, 0o600); err != nil && !errors.Is(err, atomicfile.ErrNotDurable) {
		return nil, fmt.Errorf("nribridge: placement key %s: %w", path, err)
	}
	return readPlacementKey(path)
}

func readPlacementKey(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("nribridge: placement key %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("nribridge: placement key %s: %w", path, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("nribridge: placement key %s: not a regular file (%s)", path, fi.Mode().Type())
	case fi.Mode().Perm()&0o077 != 0:
		return nil, fmt.Errorf("nribridge: placement key %s: mode %04o, want no access by group or others (0600)", path, fi.Mode().Perm())
	case !ok || (st.Uid != 0 && int(st.Uid) != os.Geteuid()):
		return nil, fmt.Errorf("nribridge: placement key %s: owned by uid %d, not root or the bridge's", path, st.Uid)
	case fi.Size() != PlacementKeySize:
		return nil, fmt.Errorf("nribridge: placement key %s: %d bytes, want %d (remove it to make a new one: pods move once)", path, fi.Size(), PlacementKeySize)
	}
	key := make([]byte, PlacementKeySize)
	if _, err := io.ReadFull(f, key); err != nil {
		return nil, fmt.Errorf("nribridge: placement key %s: %w", path, err)
	}
	return key, nil
}

// ShardOrder is the order in which a pod of uid tries n statsd: by a
// keyed hash (HMAC-SHA256 under key) of each statsd's index and the uid,
// highest first (rendezvous hashing). Without the key nobody can choose
// uids that go to one statsd first; with it the order is the same on every
// start.
func ShardOrder(key []byte, uid string, n int) []int {
	type scored struct {
		score uint64
		i     int
	}
	s := make([]scored, n)
	mac := hmac.New(sha256.New, key)
	var idx [4]byte
	for i := range n {
		mac.Reset()
		binary.BigEndian.PutUint32(idx[:], uint32(i))
		mac.Write(idx[:])
		mac.Write([]byte(uid))
		s[i] = scored{binary.BigEndian.Uint64(mac.Sum(nil)), i}
	}
	slices.SortFunc(s, func(a, b scored) int { return cmp.Or(cmp.Compare(b.score, a.score), cmp.Compare(a.i, b.i)) })
	out := make([]int, n)
	for j, x := range s {
		out[j] = x.i
	}
	return out
}

// placement is where a tracked pod is placed: the statsd its binding
// should be on.
type placement struct {
	order []int // ShardOrder of its uid
	shard int   // -1: none (its namespace at its cap on every statsd)
	ns    string
	// refused: the statsd that refused it TOO_MANY_WORKLOADS this round;
	// rounds: the rounds in which every statsd did (its backoff).
	refused map[int]bool
	rounds  int
}

// firstChoice is the statsd uid tries first.
func (b *Bridge) firstChoice(uid string) int { return ShardOrder(b.key, uid, len(b.shards))[0] }

// placeOf returns the statsd the pod of uid is placed on (-1: none, or no
// such pod), placing it if it is not. A binding the bridge knows of
// wins: a pod bound on a statsd stays there (the first of its order, if
// several hold it). Otherwise it goes to the first statsd of its order
// that has not refused it this round and holds fewer than NamespaceCap
// pods of its namespace. b.mu is held.
func (b *Bridge) placeOf(uid string) int {
	p := b.pods[uid]
	pl := b.placed[uid]
	if p == nil {
		if pl != nil {
			b.unassign(pl)
			delete(b.placed, uid)
			b.unplaced--
		}
		return -1
	}
	if pl != nil && pl.shard >= 0 {
		return pl.shard
	}
	if pl == nil {
		pl = &placement{order: ShardOrder(b.key, uid, len(b.shards)), shard: -1, ns: p.identity.GetActorNamespace(), refused: map[int]bool{}}
		b.placed[uid] = pl
		b.unplaced++
	}
	for _, i := range pl.order {
		if _, held := b.shards[i].known[uid]; held {
			b.assign(pl, i)
			return i
		}
	}
	b.choose(uid, pl, false)
	return pl.shard
}

// choose places pl on the first statsd of its order it may go to (none:
// -1, counted and noted unless again). b.mu is held.
func (b *Bridge) choose(uid string, pl *placement, again bool) {
	capped := false
	for _, i := range pl.order {
		if pl.refused[i] {
			continue
		}
		if b.opt.NamespaceCap > 0 && b.nsOn[i][pl.ns] >= b.opt.NamespaceCap {
			capped = true
			continue
		}
		if capped {
			b.m.spilled.WithLabelValues("namespace-cap").Inc()
		}
		b.assign(pl, i)
		return
	}
	if again || (len(pl.refused) > 0 && !capped) {
		return // tried again, or every statsd refused it: the caller starts a new round
	}
	b.m.unactionable.WithLabelValues("namespace-cap").Inc()
	b.notes.add(slog.LevelWarn, "nri: cannot bind a pod", "namespace-cap", "uid", uid, "namespace", pl.ns,
		"reason", "namespace-cap", "namespace_cap", b.opt.NamespaceCap)
}

// assign places pl on statsd i (its namespace's count there). b.mu is
// held.
func (b *Bridge) assign(pl *placement, i int) {
	b.unassign(pl)
	b.unplaced--
	pl.shard = i
	b.nsOn[i][pl.ns]++
}

// unassign takes pl off its statsd (its namespace's count there). b.mu is
// held.
func (b *Bridge) unassign(pl *placement) {
	if pl.shard < 0 {
		return
	}
	if b.nsOn[pl.shard][pl.ns]--; b.nsOn[pl.shard][pl.ns] <= 0 {
		delete(b.nsOn[pl.shard], pl.ns)
	}
	pl.shard = -1
	b.unplaced++
}

// spill places uid, refused TOO_MANY_WORKLOADS by statsd from, on the next
// statsd of its order and queues it there; once every statsd refused it,
// a new round begins after a backoff. b.mu is held.
func (b *Bridge) spill(uid string, from int) bool {
	pl := b.placed[uid]
	if pl == nil || pl.shard != from {
		return false
	}
	b.shards[from].resetRetry(uid)
	pl.refused[from] = true
	b.unassign(pl)
	b.choose(uid, pl, false)
	var wait time.Duration
	if pl.shard < 0 && len(pl.refused) > 0 {
		pl.rounds++
		clear(pl.refused)
		b.choose(uid, pl, false)
		wait = b.backoff(pl.rounds)
	}
	b.m.spilled.WithLabelValues("statsd-full").Inc()
	if pl.shard >= 0 {
		to := b.shards[pl.shard]
		b.notes.add(slog.LevelInfo, "nri: statsd full, placing the pod on another", "spill:"+b.shards[from].label,
			"uid", uid, "statsd", b.shards[from].label, "to", to.label, "round", pl.rounds)
		to.resetRetry(uid)
		if wait > 0 {
			to.later(uid, wait, false)
		} else {
			to.enqueue(uid)
		}
	}
	b.replaceUnplaced()
	return true
}

// replaceUnplaced places the pods placed nowhere where they may go now
// (a namespace's pod ended or moved), and queues them. b.mu is held.
func (b *Bridge) replaceUnplaced() {
	if b.unplaced == 0 {
		return
	}
	for uid, pl := range b.placed {
		if pl.shard >= 0 {
			continue
		}
		clear(pl.refused)
		if b.choose(uid, pl, true); pl.shard >= 0 {
			b.shards[pl.shard].enqueue(uid)
		}
	}
}

// censused records that statsd s was listed (or tried) once since the
// first Synchronize. Once every one was, the bridge knows every binding
// there is: the pods held back meanwhile are placed where they are bound
// and queued. b.mu is held.
func (s *shard) censused() {
	b := s.b
	if s.listedOnce || !b.everSynced {
		return
	}
	s.listedOnce = true
	if b.census++; b.census < len(b.shards) {
		return
	}
	for uid, pl := range b.placed {
		for _, i := range pl.order {
			if _, held := b.shards[i].known[uid]; held {
				if i != pl.shard {
					b.assign(pl, i)
				}
				break
			}
		}
	}
	for uid := range b.heldBack {
		b.touch(uid)
	}
	clear(b.heldBack)
}

// holdBack reports whether a running pod's binding waits for the census:
// after the first Synchronize, no pod is bound or moved until every
// statsd was listed once (a restarted bridge learns where each pod is
// bound: it may have spilled from its first choice). b.mu is held.
func (b *Bridge) holdBack(uid string) bool {
	if !b.everSynced || b.census >= len(b.shards) {
		return false
	}
	b.heldBack[uid] = true
	return true
}
