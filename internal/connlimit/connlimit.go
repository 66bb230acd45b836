package connlimit

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// logEvery is the least time between two logs of refused connections.
const logEvery = 10 * time.Second

// Listener holds at most its cap of the connections it accepted open at
// once; one more is closed as soon as it is accepted, counted (Refused) and
// logged at Warn at most once per 10 s. A connection's slot is freed by its
// first Close.
type Listener struct {
	net.Listener
	slots   chan struct{}
	refused atomic.Int64
	log     *slog.Logger
	msg     string

	mu      sync.Mutex
	lastLog time.Time
}

// NewListener wraps l to hold at most n (at least 1) connections open;
// msg is the log message of refused ones, logged to log (nil: not logged).
// Closing the Listener closes l.
func NewListener(l net.Listener, n int, log *slog.Logger, msg string) *Listener {
	return &Listener{Listener: l, slots: make(chan struct{}, max(n, 1)), log: log, msg: msg}
}

// Accept returns the next connection with a free slot, closing those that
// arrive while none is.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &slotConn{Conn: c, free: func() { <-l.slots }}, nil
		default:
		}
		// Counted before the close: once the peer reads EOF the refusal
		// is in Refused (TestListenerCap read it in between).
		n := l.refused.Add(1)
		c.Close()
		if l.log == nil {
			continue
		}
		l.mu.Lock()
		if time.Since(l.lastLog) >= logEvery {
			l.lastLog = time.Now()
			l.log.Warn(l.msg, "max", cap(l.slots), "refused_total", n)
		}
		l.mu.Unlock()
	}
}

// Open returns how many accepted connections are open.
func (l *Listener) Open() int { return len(l.slots) }

// Max returns the cap.
func (l *Listener) Max() int { return cap(l.slots) }

// Refused returns how many connections were closed at accept, over the cap.
func (l *Listener) Refused() int64 { return l.refused.Load() }

// slotConn frees its slot once, on the first Close.
type slotConn struct {
	net.Conn
	once sync.Once
	free func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.free)
	return err
}
