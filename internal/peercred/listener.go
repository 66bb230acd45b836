package peercred

// This file is the accept side: a Listener that admits or refuses the peers
// of a Unix socket by their credentials (SO_PEERCRED: the uid, gid and pid
// the kernel recorded when the peer connected), closing a refused
// connection before a byte is read from or written to it, and counting it.
// File modes say who may connect; this says who is served, whatever the
// modes became. statsd guards both of its sockets with it.

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Cred is what the kernel says about a peer.
type Cred struct {
	PID      int32
	UID, GID uint32
}

// Policy admits a peer whose uid is in UIDs, or whose gid (primary, or a
// supplementary group the process has) is in GIDs.
type Policy struct {
	UIDs, GIDs []uint32
}

func (p Policy) String() string {
	return fmt.Sprintf("uids %s, gids %s", list(p.UIDs), list(p.GIDs))
}

func list(ids []uint32) string {
	if len(ids) == 0 {
		return "none"
	}
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(uint64(id), 10)
	}
	return strings.Join(s, ",")
}

// ParseIDs parses a comma-separated list of numeric ids ("0,1000").
func ParseIDs(s string) ([]uint32, error) {
	var out []uint32
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("peercred: id %q: %w", f, err)
		}
		if !slices.Contains(out, uint32(n)) {
			out = append(out, uint32(n))
		}
	}
	return out, nil
}

// Config configures a Listener.
type Config struct {
	Policy Policy
	// ProcRoot is where a peer's supplementary groups are read
	// (<ProcRoot>/<pid>/status), when neither its uid nor its primary gid
	// is admitted. Default /proc.
	ProcRoot string
	// Logger gets one WARN line per refused peer, at most one per
	// LogEvery (default 10 s), with the running count.
	Logger   *slog.Logger
	LogEvery time.Duration
	// Name names the socket in logs ("read", "lifecycle").
	Name string
}

// Listener admits the peers Config.Policy admits.
type Listener struct {
	net.Listener
	cfg     Config
	refused atomic.Int64

	mu       sync.Mutex
	lastLog  time.Time
	unlogged int64
	groups   func(pid int32) ([]uint32, error) // supplementary groups; replaceable in tests
}

// Listen wraps l.
func Listen(l net.Listener, cfg Config) *Listener {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.LogEvery <= 0 {
		cfg.LogEvery = 10 * time.Second
	}
	pl := &Listener{Listener: l, cfg: cfg}
	pl.groups = func(pid int32) ([]uint32, error) { return groupsOf(cfg.ProcRoot, pid) }
	return pl
}

// Refused is how many connections were refused so far.
func (l *Listener) Refused() int64 { return l.refused.Load() }

// Accept returns the next admitted connection; a refused one is closed and
// counted, and Accept waits for the next.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		cred, err := of(c)
		if err == nil && l.admits(cred) {
			return c, nil
		}
		l.refuse(cred, err) // counted before the peer sees the close
		c.Close()
	}
}

// admits applies the policy, reading supplementary groups only when the
// uid and primary gid do not decide.
func (l *Listener) admits(c Cred) bool {
	p := l.cfg.Policy
	if slices.Contains(p.UIDs, c.UID) || slices.Contains(p.GIDs, c.GID) {
		return true
	}
	if len(p.GIDs) == 0 || c.PID <= 0 {
		return false
	}
	groups, err := l.groups(c.PID)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(groups, func(g uint32) bool { return slices.Contains(p.GIDs, g) })
}

func (l *Listener) refuse(c Cred, err error) {
	n := l.refused.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if now.Sub(l.lastLog) < l.cfg.LogEvery {
		l.unlogged++
		return
	}
	attrs := []any{"socket", l.cfg.Name, "pid", c.PID, "uid", c.UID, "gid", c.GID, "refused_total", n,
		"not_logged_since_last", l.unlogged, "admitted", l.cfg.Policy.String()}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	l.cfg.Logger.Warn("peer refused: its credentials are not on the allowlist; connection closed unserved", attrs...)
	l.lastLog, l.unlogged = now, 0
}

// parseGroups returns the ids of the Groups: line of a /proc status file.
func parseGroups(b []byte) ([]uint32, error) {
	for line := range strings.Lines(string(b)) {
		v, ok := strings.CutPrefix(line, "Groups:")
		if !ok {
			continue
		}
		var out []uint32
		for _, f := range strings.Fields(v) {
			n, err := strconv.ParseUint(f, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("peercred: Groups %q: %w", f, err)
			}
			out = append(out, uint32(n))
		}
		return out, nil
	}
	return nil, errors.New("peercred: status has no Groups line")
}
